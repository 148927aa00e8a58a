#include "gclab/vae/memory.h"

#include <algorithm>
#include <vector>

#include "gclab/memory/live_set.h"
#include "tiling.h"

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

// An activation of the walk: channels x height x width (x frames, for Qwen-Image's 3-D network) for the
// whole batch.
struct Shape {
  int64_t c = 0, h = 0, w = 0, t = 1;
};

// The live set while the network runs: bytes allocated now, the highest count seen, and transient
// spikes (a kernel's own temporaries).
class Walk {
 public:
  Walk(int64_t batch, const AutoencoderMemoryOptions& o) : batch_(batch), o_(o) {}

  int64_t bytes(const Shape& s) const { return batch_ * s.c * s.t * s.h * s.w * o_.dtype_bytes; }
  const AutoencoderMemoryOptions& options() const { return o_; }
  void alloc(int64_t b) { live_.alloc(b); }
  void alloc(const Shape& s) { alloc(bytes(s)); }
  void free(int64_t b) { live_.free(b); }
  void free(const Shape& s) { free(bytes(s)); }
  void spike(int64_t b) { live_.spike(b); }
  int64_t peak() const { return live_.peak(); }

  // A convolution's output, allocated, after its temporaries on the CPU (memory::cpu_conv_temporaries).
  Shape conv(const Shape& in, int64_t out_channels, int64_t kernel, int64_t stride = 1) {
    const Shape out{out_channels, in.h / stride, in.w / stride};
    if (o_.cpu) onednn_temporaries(in, out, kernel * kernel);
    alloc(out);
    return out;
  }
  // The temporaries above for an input of `in` (already padded for a 3-D convolution), an output of `out`
  // and a kernel of `volume` elements (memory::cpu_conv_temporaries).
  void onednn_temporaries(const Shape& in, const Shape& out, int64_t volume) {
    spike(memory::cpu_conv_temporaries(batch_, in.c, out.c, in.t * in.h * in.w, out.t * out.h * out.w, volume,
                                       o_.dtype_bytes, o_.channel_block, o_.bf16_im2col));
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
    if (o_.cpu)                       // the flash kernel's per-thread blocks and its log-sum-exp
      spike(bytes(in) + memory::cpu_flash_attention_temporaries(batch_, n, n, in.c, o_.threads, o_.dtype_bytes));
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
  memory::LiveSet live_;
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

// decode() around either network, the latents alive in the walk: unscaled (two latent-sized results, the
// first freed), then decoded whole (`clamp`: then clamped into a new tensor), or in tiles of tiling.h's grid,
// each decoded tile kept for the blending, then the blended rows and the image they are concatenated into.
// `image` is the latents' channels at the image's height and width.
template <class DecodeTile>
int64_t walk_decode(Walk& walk, const Shape& image, int64_t image_channels, int64_t f, int64_t tile_sample_size,
                    bool clamp, DecodeTile&& decode_tile) {
  const Shape latent{image.c, image.h / f, image.w / f};
  walk.alloc(latent);
  walk.alloc(latent);
  walk.free(latent);
  const TileGrid grid(tile_sample_size, f);
  if (tile_sample_size <= 0 || !grid.tiles(latent.h, latent.w)) {
    const Shape out = decode_tile(latent);
    if (clamp) walk.alloc(out);
    return walk.peak();
  }
  for (int64_t i = 0; i < latent.h; i += grid.stride_latent)
    for (int64_t j = 0; j < latent.w; j += grid.stride_latent)
      decode_tile(Shape{latent.c, std::min(grid.tile_latent, latent.h - i), std::min(grid.tile_latent, latent.w - j)});
  walk.alloc(walk.bytes(Shape{image_channels, image.h, image.w}) * 2);
  return walk.peak();
}

}  // namespace

bool cpu_bf16_im2col() { return !memory::cpu_onednn_bf16(); }

int cpu_channel_block() { return memory::cpu_channel_block(); }

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
  // Not clamped.
  return walk_decode(walk, Shape{c.latent_channels, height, width}, c.out_channels, c.downsampling(), tile_sample_size,
                     false, [&](const Shape& z) { return walk_decode_unscaled(walk, c, z); });
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

// ---- Qwen-Image's AutoencoderKLQwenImage (qwen_image_vae.cpp), images as one frame ----

namespace {

int64_t conv3d_params(int64_t in, int64_t out, int64_t volume) { return in * out * volume + out; }
int64_t qwen_residual_params(int64_t in, int64_t out) {
  return in + conv3d_params(in, out, 27) + out + conv3d_params(out, out, 27) +
         (in != out ? conv3d_params(in, out, 1) : 0);
}
int64_t qwen_mid_params(int64_t c) {
  return 2 * qwen_residual_params(c, c) + c + conv_params(c, 3 * c, 1) + conv_params(c, c, 1);
}

// The walk through the 3-D network: every causal convolution keeps its input's last frames in the chunk
// cache (feat_cache) until the encode or decode returns, so the cache grows with each convolution.
class QwenWalk {
 public:
  QwenWalk(int64_t batch, const AutoencoderMemoryOptions& o) : w(batch, o) {}
  Walk w;
  int64_t cached = 0;  // bytes in the chunk cache

  // The chunk cache's clone of an input's last (up to two) frames, held until the encode / decode returns.
  void keep(const Shape& s) {
    const int64_t b = w.bytes(Shape{s.c, s.h, s.w, std::min<int64_t>(2, s.t)});
    w.alloc(b);
    cached += b;
  }
  // A 3-D convolution on a padded input, its output allocated. On the CPU PyTorch picks oneDNN (the rule
  // above) when the input has at least 16384 elements (or more than one thread runs) and either the batch
  // is above one or N x C x T x H exceeds 20480 (ConvUtils.h, use_mkldnn); otherwise slow_conv3d, which
  // unfolds the input into columns of in.c x kernel volume x output positions beside the output (both
  // measured with the tracking allocator: exact).
  Shape conv3d(const Shape& padded, int64_t out_c, int64_t kt, int64_t ks, int64_t stride_t = 1) {
    const Shape out{out_c, padded.h - ks + 1, padded.w - ks + 1, (padded.t - kt) / stride_t + 1};
    const auto& o = w.options();
    const int64_t volume = kt * ks * ks;
    if (o.cpu && volume > 1) {
      const int64_t n = w.bytes(Shape{1, 1, 1, 1}) / o.dtype_bytes;  // the batch
      const bool onednn = (n * padded.c * padded.t * padded.h * padded.w >= 16384 || o.threads > 1) &&
                          (n > 1 || n * padded.c * padded.t * padded.h > 20480);
      if (onednn)
        w.onednn_temporaries(padded, out, volume);
      else
        w.spike(w.bytes(Shape{padded.c * volume, out.h, out.w, out.t}) + w.bytes(out));
    }
    w.alloc(out);
    return out;
  }
  // CausalConv3dImpl::forward on the first chunk: F.pad makes a new padded tensor (two zero frames in front
  // for a 3-frame kernel; a copy even for a 1x1x1 kernel's zero padding), convolved, the padded copy freed.
  Shape causal(const Shape& in, int64_t out_c, int64_t k) {
    const int64_t p = k / 2;
    const Shape padded{in.c, in.h + 2 * p, in.w + 2 * p, in.t + 2 * p};
    w.alloc(padded);
    const Shape out = conv3d(padded, out_c, k, k);
    w.free(padded);
    return out;
  }
  Shape causal_cached(const Shape& in, int64_t out_c) {
    keep(in);
    return causal(in, out_c, 3);
  }
  // RmsNorm: the norm over the channels and its clamp (a channel each), the quotient, then * scale,
  // * gamma, + 0.0, each freeing the last (half types upcast to float32 first).
  void rms_norm(const Shape& in) {
    const int64_t d = w.options().dtype_bytes;
    const int64_t full = w.bytes(in), f32 = full / d * 4, chan = f32 / in.c;
    if (d != 4) w.alloc(f32);  // the float32 copy
    w.alloc(chan), w.alloc(chan);
    w.free(chan);
    w.alloc(f32);  // normalised
    w.free(chan);
    if (d != 4) {
      w.free(f32);  // the copy (x's float32 twin) goes with the statement
      w.alloc(full), w.free(f32);
    }
    for (int k = 0; k < 3; ++k) w.alloc(full), w.free(full);
  }
  // norm, silu (the norm freed), then the cached causal convolution (the silu freed). The input stays
  // alive, unless `consume`: then it goes once the norm exists (x = norm(x) on the only reference).
  Shape norm_silu_conv(const Shape& in, int64_t out_c, bool consume = false) {
    rms_norm(in);
    if (consume) w.free(in);
    w.alloc(in);
    w.free(in);
    const Shape out = causal_cached(in, out_c);
    w.free(in);
    return out;
  }
  Shape residual(const Shape& in, int64_t out_c) {
    Shape shortcut{};
    if (in.c != out_c) shortcut = causal(in, out_c, 1);
    const Shape a = norm_silu_conv(in, out_c);
    const Shape b = norm_silu_conv(a, out_c, true);
    w.alloc(b);  // x + h
    w.free(b);
    if (in.c != out_c) w.free(shortcut);
    return b;
  }
  // Single-head attention over one frame's h x w positions: the norm, qkv (1x1) made contiguous, the CPU
  // flash kernel's per-thread blocks and log-sum-exp, the output transposed back, proj, + identity.
  Shape attention(const Shape& in) {
    const int64_t n = in.h * in.w, bt = w.bytes(Shape{1, 1, 1, in.t}) / w.options().dtype_bytes;
    rms_norm(in);
    w.alloc(3 * w.bytes(in));  // to_qkv
    w.alloc(3 * w.bytes(in));  // .contiguous()
    w.free(3 * w.bytes(in));
    if (w.options().cpu) {
      const int64_t q_split = std::min<int64_t>(256, n), kv_split = std::min<int64_t>(512, n);
      w.spike(w.bytes(in) + int64_t{4} * w.options().threads * (q_split * kv_split + q_split * in.c) + 4 * bt * n);
    }
    w.alloc(in);  // attention's output
    w.free(in);   // the norm (x reassigned)
    w.alloc(in);  // permuted back, contiguous
    w.free(in);
    w.alloc(in);  // proj
    w.free(in);
    w.alloc(in);  // + identity
    w.free(in);
    w.free(3 * w.bytes(in));  // qkv
    return in;
  }
  Shape mid_block(const Shape& in) {
    const Shape x = residual(in, in.c);
    attention(x);
    w.free(x);
    const Shape y = residual(x, x.c);
    w.free(x);
    return y;
  }
  // QwenImageResample on one frame: up (nearest 2x, then a 3x3 convolution halving the channels) or down
  // (padded right and bottom, a stride-2 3x3 convolution; a temporal one keeps the frame in the cache).
  Shape resample(const Shape& in, bool up, bool temporal) {
    const Shape grown = up ? Shape{in.c, 2 * in.h, 2 * in.w, in.t} : Shape{in.c, in.h + 1, in.w + 1, in.t};
    w.alloc(grown);
    Shape y = w.conv(grown, up ? in.c / 2 : in.c, 3, up ? 1 : 2);
    if (!up) y.h = in.h / 2, y.w = in.w / 2;
    w.free(grown);
    if (!up && temporal) keep(y);  // feat_cache[idx] = x.clone()
    return y;
  }
};

Shape walk_qwen_decoder(QwenWalk& q, const QwenImageVaeConfig& c, const Shape& latent) {
  std::vector<int64_t> dims = {c.base_dim * c.dim_mult.back()};
  for (auto it = c.dim_mult.rbegin(); it != c.dim_mult.rend(); ++it) dims.push_back(c.base_dim * *it);
  Shape x = q.causal_cached(latent, dims[0]);
  Shape y = q.mid_block(x);
  q.w.free(x);
  x = y;
  for (size_t i = 0; i + 1 < dims.size(); ++i) {
    // An up block: its input stays alive (the decoder's x) until the block returns.
    const Shape block_in = x;
    for (int64_t r = 0; r <= c.num_res_blocks; ++r) {
      y = q.residual(x, dims[i + 1]);
      if (r > 0) q.w.free(x);
      x = y;
    }
    if (i + 1 != c.dim_mult.size()) {
      y = q.resample(x, true, false);
      q.w.free(x);
      x = y;
    }
    q.w.free(block_in);
  }
  y = q.norm_silu_conv(x, c.input_channels);
  q.w.free(x);
  return y;
}

// decode_frames on latents alive in the walk: post_quant_conv (1x1x1, padded by nothing: still a copy),
// the decoder; the cache freed when it returns. Returns the image, allocated.
Shape walk_qwen_decode_frames(QwenWalk& q, const QwenImageVaeConfig& c, const Shape& z) {
  const Shape x = q.causal(z, c.z_dim, 1);
  const Shape image = walk_qwen_decoder(q, c, x);
  q.w.free(q.cached);
  q.cached = 0;
  q.w.free(x);
  return image;
}

}  // namespace

int64_t autoencoder_weight_bytes(const QwenImageVaeConfig& c, int64_t dtype_bytes) {
  std::vector<int64_t> dims = {c.base_dim};
  for (int64_t m : c.dim_mult) dims.push_back(c.base_dim * m);
  int64_t n = conv3d_params(c.input_channels, dims[0], 27);  // encoder
  for (size_t i = 0; i + 1 < dims.size(); ++i) {
    for (int64_t r = 0; r < c.num_res_blocks; ++r)
      n += qwen_residual_params(r == 0 ? dims[i] : dims[i + 1], dims[i + 1]);
    if (i + 1 != c.dim_mult.size())
      n += conv_params(dims[i + 1], dims[i + 1], 3) +
           (c.temperal_downsample.at(i) ? conv3d_params(dims[i + 1], dims[i + 1], 3) : 0);
  }
  n += qwen_mid_params(dims.back()) + dims.back() + conv3d_params(dims.back(), 2 * c.z_dim, 27);
  n += conv3d_params(2 * c.z_dim, 2 * c.z_dim, 1) + conv3d_params(c.z_dim, c.z_dim, 1);  // quant convs
  std::vector<int64_t> up = {c.base_dim * c.dim_mult.back()};                            // decoder
  for (auto it = c.dim_mult.rbegin(); it != c.dim_mult.rend(); ++it) up.push_back(c.base_dim * *it);
  const std::vector<bool> temporal(c.temperal_downsample.rbegin(), c.temperal_downsample.rend());
  n += conv3d_params(c.z_dim, up[0], 27) + qwen_mid_params(up[0]);
  for (size_t i = 0; i + 1 < up.size(); ++i) {
    const int64_t in = i > 0 ? up[i] / 2 : up[i];
    for (int64_t r = 0; r <= c.num_res_blocks; ++r) n += qwen_residual_params(r == 0 ? in : up[i + 1], up[i + 1]);
    if (i + 1 != c.dim_mult.size())
      n += conv_params(up[i + 1], up[i + 1] / 2, 3) + (temporal.at(i) ? conv3d_params(up[i + 1], 2 * up[i + 1], 3) : 0);
  }
  n += up.back() + conv3d_params(up.back(), c.input_channels, 27);
  return n * dtype_bytes;
}

int64_t predicted_decode_bytes(const QwenImageVaeConfig& c, int64_t batch, int64_t height, int64_t width,
                               const AutoencoderMemoryOptions& o, int64_t tile_sample_size) {
  QwenWalk q(batch, o);
  // Clamped when whole (diffusers' _decode), not when tiled.
  return walk_decode(q.w, Shape{c.z_dim, height, width}, c.input_channels, c.downsampling(), tile_sample_size, true,
                     [&](const Shape& z) { return walk_qwen_decode_frames(q, c, z); });
}

int64_t predicted_encode_bytes(const QwenImageVaeConfig& c, int64_t batch, int64_t height, int64_t width,
                               const AutoencoderMemoryOptions& o) {
  QwenWalk q(batch, o);
  std::vector<int64_t> dims = {c.base_dim};
  for (int64_t m : c.dim_mult) dims.push_back(c.base_dim * m);
  Shape x = q.causal_cached(Shape{c.input_channels, height, width}, dims[0]);
  for (size_t i = 0; i + 1 < dims.size(); ++i) {
    for (int64_t r = 0; r < c.num_res_blocks; ++r) {
      const Shape y = q.residual(x, dims[i + 1]);
      q.w.free(x);
      x = y;
    }
    if (i + 1 != c.dim_mult.size()) {
      const Shape y = q.resample(x, false, c.temperal_downsample.at(i));
      q.w.free(x);
      x = y;
    }
  }
  Shape y = q.mid_block(x);
  q.w.free(x);
  const Shape moments = q.norm_silu_conv(y, 2 * c.z_dim);
  q.w.free(y);
  q.causal(moments, moments.c, 1);  // quant_conv, the cache still held
  q.w.free(q.cached);
  q.w.free(moments);
  // The posterior's sample and the normalisation, as autoencoder_kl's: clamp, 0.5x, exp (std), randn,
  // std x randn, + mean, then - latents_mean, / latents_std.
  const Shape z{c.z_dim, moments.h, moments.w};
  for (int k = 0; k < 3; ++k) q.w.alloc(z);
  q.w.free(q.w.bytes(z) * 2);
  q.w.alloc(z), q.w.alloc(z), q.w.alloc(z);
  q.w.free(q.w.bytes(z) * 2);
  q.w.alloc(z), q.w.alloc(z);
  return q.w.peak();
}

}  // namespace gclab::vae
