#include "gclab/vae/memory.h"

#include <ATen/cpu/Utils.h>

#include <algorithm>
#include <vector>

namespace gclab::vae {

namespace {

// Parameters of the layers autoencoder_kl.cpp builds.
int64_t conv_params(int64_t in, int64_t out, int64_t k) { return in * out * k * k + out; }
int64_t norm_params(int64_t c) { return 2 * c; }
int64_t resnet_params(int64_t in, int64_t out) {
  return norm_params(in) + conv_params(in, out, 3) + norm_params(out) + conv_params(out, out, 3) +
         (in != out ? conv_params(in, out, 1) : 0);
}
int64_t mid_params(int64_t c, bool attention) {
  return 2 * resnet_params(c, c) + (attention ? norm_params(c) + 4 * (c * c + c) : 0);
}

// An activation of the walk: channels x height x width for the whole batch.
struct Shape {
  int64_t c = 0, h = 0, w = 0;
};

// The live set while the network runs: bytes allocated now, the highest count seen, and transient
// spikes (a kernel's own temporaries).
class Walk {
 public:
  Walk(int64_t batch, const AutoencoderMemoryOptions& o) : batch_(batch), o_(o) {}

  int64_t bytes(const Shape& s) const { return batch_ * s.c * s.h * s.w * o_.dtype_bytes; }
  void alloc(int64_t b) {
    live_ += b;
    peak_ = std::max(peak_, live_);
  }
  void alloc(const Shape& s) { alloc(bytes(s)); }
  void free(int64_t b) { live_ -= b; }
  void free(const Shape& s) { free(bytes(s)); }
  void spike(int64_t b) { peak_ = std::max(peak_, live_ + b); }
  int64_t peak() const { return peak_; }

  // A convolution's output, allocated, after oneDNN's temporaries on the CPU (measured with the tracking
  // allocator): a 1x1 kernel needs none; an input of fewer channels than a block is read as it is, and the
  // output is computed in the blocked layout (channels padded to the block) and reordered; a wider input
  // is copied into the blocked layout (padded) beside a copy of the weight, and the output is computed in
  // place when its channels fill whole blocks, else in a padded buffer that is then reordered.
  Shape conv(const Shape& in, int64_t out_channels, int64_t kernel, int64_t stride = 1) {
    const Shape out{out_channels, in.h / stride, in.w / stride};
    if (o_.cpu && kernel > 1) {
      const int64_t block = o_.channel_block;
      auto padded = [&](Shape s) {
        s.c = (s.c + block - 1) / block * block;
        return bytes(s);
      };
      if (in.c < block) {
        spike(padded(out) + bytes(out));
      } else {
        const bool whole = out.c % block == 0;
        spike(padded(in) + in.c * out.c * kernel * kernel * o_.dtype_bytes + (whole ? bytes(out) : padded(out)));
        if (!whole) spike(padded(out) + bytes(out));
      }
    }
    alloc(out);
    return out;
  }

  // ResnetBlock2D as ResnetImpl::forward runs it; the input stays alive (the caller's), the result is
  // allocated.
  Shape resnet(const Shape& in, int64_t out_channels) {
    alloc(in);  // norm1
    alloc(in);  // silu
    free(in);   // norm1's result
    const Shape mid = conv(in, out_channels, 3);
    free(in);    // silu's result
    alloc(mid);  // norm2
    free(mid);   // conv1's result
    alloc(mid);  // silu
    free(mid);   // norm2's result
    conv(mid, out_channels, 3);
    free(mid);  // silu's result
    const bool shortcut = in.c != out_channels;
    if (shortcut) conv(in, out_channels, 1);
    alloc(mid);  // shortcut + h
    alloc(mid);  // / 1.0
    free(mid);   // the sum
    free(mid);   // conv2's result
    if (shortcut) free(mid);
    return mid;
  }

  // The mid block's single-head attention as AttentionImpl::forward runs it.
  Shape attention(const Shape& in) {
    const int64_t n = in.h * in.w;
    alloc(in);                        // group_norm
    alloc(in), alloc(in), alloc(in);  // q, k, v
    if (o_.cpu) {                     // the flash kernel's per-thread blocks (float32) and its log-sum-exp
      const int64_t q_split = std::min<int64_t>(256, n), kv_split = std::min<int64_t>(512, n);
      spike(bytes(in) + int64_t{4} * o_.threads * (q_split * kv_split + q_split * in.c) + 4 * batch_ * n);
    }
    alloc(in);  // attention's output
    alloc(4 * batch_ * n * (o_.cpu ? 1 : 0));
    free(in);   // group_norm's result (h reassigned)
    alloc(in);  // to_out
    free(in);   // attention's output
    alloc(in);  // transposed back to [B, C, H, W]
    free(in);
    alloc(in);  // + residual
    free(in);
    alloc(in);  // / 1.0
    free(in);
    free(3 * bytes(in) + 4 * batch_ * n * (o_.cpu ? 1 : 0));  // q, k, v, log-sum-exp
    return in;
  }

  // UNetMidBlock2D; the input stays alive, the result is allocated.
  Shape mid_block(const Shape& in, bool attention) {
    Shape x = resnet(in, in.c);
    if (attention) {
      this->attention(x);
      free(x);
    }
    const Shape y = resnet(x, x.c);
    free(x);
    return y;
  }

  // The GroupNorm + SiLU + conv_out head; the input stays alive.
  Shape head(const Shape& in, int64_t out_channels) {
    alloc(in);  // norm
    alloc(in);  // silu
    free(in);
    const Shape out = conv(in, out_channels, 3);
    free(in);
    return out;
  }

 private:
  int64_t batch_;
  AutoencoderMemoryOptions o_;
  int64_t live_ = 0, peak_ = 0;
};

// A DownEncoderBlock2D / UpDecoderBlock2D as StageImpl::forward runs it: the stage's input is the
// caller's (passed by value, it stays alive to the end of the stage), each resnet's result replaces the
// last, then the resampler. Returns the result, allocated.
Shape walk_stage(Walk& walk, const Shape& in, int64_t out_channels, int64_t layers, bool down, bool resample) {
  Shape x = in;
  for (int64_t l = 0; l < layers; ++l) {
    const Shape y = walk.resnet(x, out_channels);
    if (l > 0) walk.free(x);
    x = y;
  }
  if (!resample) return x;
  // Down: padded right and bottom, then a stride-2 3x3 convolution. Up: nearest 2x, then a 3x3 one.
  const Shape grown = down ? Shape{x.c, x.h + 1, x.w + 1} : Shape{x.c, 2 * x.h, 2 * x.w};
  walk.alloc(grown);
  Shape y = walk.conv(grown, x.c, 3, down ? 2 : 1);
  if (down) y.h = x.h / 2, y.w = x.w / 2;
  walk.free(grown);
  if (layers > 0) walk.free(x);
  return y;
}

// DecoderImpl::forward on latents of `latent` (alive: the caller's); returns the image shape, allocated.
Shape walk_decoder(Walk& walk, const AutoencoderKLConfig& c, const Shape& latent) {
  const std::vector<int64_t> ch(c.block_out_channels.rbegin(), c.block_out_channels.rend());
  Shape x = walk.conv(latent, ch.front(), 3);
  Shape y = walk.mid_block(x, c.mid_block_add_attention);
  walk.free(x);
  x = y;
  for (size_t i = 0; i < ch.size(); ++i) {
    y = walk_stage(walk, x, ch[i], c.layers_per_block + 1, false, i + 1 < ch.size());
    walk.free(x);
    x = y;
  }
  const Shape image = walk.head(x, c.out_channels);
  walk.free(x);
  return image;
}

// post_quant_conv (where the config has one) and the decoder on a latent tile alive in the walk.
Shape walk_decode_unscaled(Walk& walk, const AutoencoderKLConfig& c, const Shape& z) {
  if (!c.use_post_quant_conv) return walk_decoder(walk, c, z);
  const Shape q = walk.conv(z, c.latent_channels, 1);
  const Shape image = walk_decoder(walk, c, q);
  walk.free(q);
  return image;
}

}  // namespace

int cpu_channel_block() {
  static const int block = [] {
    const auto caps = at::cpu::get_cpu_capabilities();  // cpuinfo's flags, as oneDNN sees the same CPU
    const auto it = caps.find("avx512f");
    return it != caps.end() && it->second.isBool() && it->second.toBool() ? 16 : 8;
  }();
  return block;
}

int64_t autoencoder_weight_bytes(const AutoencoderKLConfig& c, int64_t dtype_bytes) {
  const auto& ch = c.block_out_channels;
  const int64_t z = c.latent_channels;
  int64_t n = conv_params(c.in_channels, ch.front(), 3);  // encoder
  for (size_t i = 0; i < ch.size(); ++i) {
    for (int64_t l = 0; l < c.layers_per_block; ++l) n += resnet_params(l == 0 && i > 0 ? ch[i - 1] : ch[i], ch[i]);
    if (i + 1 < ch.size()) n += conv_params(ch[i], ch[i], 3);
  }
  n += mid_params(ch.back(), c.mid_block_add_attention) + norm_params(ch.back()) + conv_params(ch.back(), 2 * z, 3);
  const std::vector<int64_t> rev(ch.rbegin(), ch.rend());  // decoder
  n += conv_params(z, rev.front(), 3) + mid_params(rev.front(), c.mid_block_add_attention);
  for (size_t i = 0; i < rev.size(); ++i) {
    for (int64_t l = 0; l < c.layers_per_block + 1; ++l)
      n += resnet_params(l == 0 && i > 0 ? rev[i - 1] : rev[i], rev[i]);
    if (i + 1 < rev.size()) n += conv_params(rev[i], rev[i], 3);
  }
  n += norm_params(rev.back()) + conv_params(rev.back(), c.out_channels, 3);
  if (c.use_quant_conv) n += conv_params(2 * z, 2 * z, 1);
  if (c.use_post_quant_conv) n += conv_params(z, z, 1);
  return n * dtype_bytes;
}

int64_t predicted_decode_bytes(const AutoencoderKLConfig& c, int64_t batch, int64_t height, int64_t width,
                               const AutoencoderMemoryOptions& o, int64_t tile_sample_size) {
  Walk walk(batch, o);
  const int64_t f = c.downsampling();
  const Shape latent{c.latent_channels, height / f, width / f};
  // decode(): latents / scaling_factor, + shift_factor (the quotient freed), alive until the image returns.
  walk.alloc(latent);
  walk.alloc(latent);
  walk.free(latent);
  const int64_t tile_latent = tile_sample_size / f;
  if (tile_sample_size <= 0 || (latent.h <= tile_latent && latent.w <= tile_latent)) {
    walk_decode_unscaled(walk, c, latent);
    return walk.peak();
  }
  // tiled_decode: tiles of tile_latent with a stride of 3/4 of it, each decoded alone and kept; then the
  // rows are blended and concatenated.
  const auto stride = static_cast<int64_t>(static_cast<double>(tile_latent) * 0.75);
  for (int64_t i = 0; i < latent.h; i += stride) {
    for (int64_t j = 0; j < latent.w; j += stride) {
      const Shape tile{c.latent_channels, std::min(tile_latent, latent.h - i), std::min(tile_latent, latent.w - j)};
      walk_decode_unscaled(walk, c, tile);  // each decoded tile is kept for the blending
    }
  }
  const Shape out{c.out_channels, height, width};
  walk.alloc(walk.bytes(out) * 2);  // the blended rows, then the image they are concatenated into
  return walk.peak();
}

int64_t predicted_encode_bytes(const AutoencoderKLConfig& c, int64_t batch, int64_t height, int64_t width,
                               const AutoencoderMemoryOptions& o) {
  Walk walk(batch, o);
  const auto& ch = c.block_out_channels;
  const Shape image{c.in_channels, height, width};
  Shape x = walk.conv(image, ch.front(), 3);
  for (size_t i = 0; i < ch.size(); ++i) {
    const Shape y = walk_stage(walk, x, ch[i], c.layers_per_block, true, i + 1 < ch.size());
    walk.free(x);
    x = y;
  }
  const Shape m = walk.mid_block(x, c.mid_block_add_attention);
  walk.free(x);
  Shape moments = walk.head(m, 2 * c.latent_channels);
  walk.free(m);
  if (c.use_quant_conv) {
    const Shape q = walk.conv(moments, moments.c, 1);
    walk.free(moments);
    moments = q;
  }
  // DiagonalGaussianDistribution.sample, then the scaling: clamp, 0.5x, exp, randn, std x randn, + mean,
  // - shift, x scaling (each a latent-sized tensor; the temporaries freed as the expression goes).
  const Shape z{c.latent_channels, moments.h, moments.w};
  for (int k = 0; k < 3; ++k) walk.alloc(z);  // clamp, 0.5x, exp (std: the first two freed)
  walk.free(walk.bytes(z) * 2);
  walk.alloc(z), walk.alloc(z);  // noise, std x noise
  walk.alloc(z);                 // z
  walk.free(walk.bytes(z) * 3);  // std, noise, product
  walk.alloc(z), walk.alloc(z);  // - shift, x scaling
  return walk.peak();
}

}  // namespace gclab::vae
