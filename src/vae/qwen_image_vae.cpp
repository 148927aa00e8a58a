#include "gclab/vae/qwen_image_vae.h"

#include <stdexcept>

#include "config_json.h"
#include "gclab/nn/layers.h"
#include "gclab/nn/meta_kernels.h"
#include "tiling.h"

namespace gclab::vae {

namespace nn = torch::nn;
namespace F = torch::nn::functional;

namespace {
// Named: a unity build compiles this file beside autoencoder_kl.cpp, whose parts have the same names.
namespace qwen {

constexpr int64_t kCacheFrames = 2;  // CACHE_T: the frames a causal convolution keeps for the next chunk

// The reference's feat_cache: one entry per causal convolution, in call order — nothing yet, "Rep" (an
// up-sampler's time convolution that has seen its first chunk), or the frames kept.
struct FeatCache {
  struct Entry {
    bool rep = false;
    torch::Tensor frames;  // undefined: nothing yet (unless rep)
    bool empty() const { return !rep && !frames.defined(); }
  };
  std::vector<Entry> entries;
  size_t idx = 0;
  Entry& next() {
    if (idx >= entries.size()) entries.resize(idx + 1);
    return entries[idx];
  }
};

// The last two frames of x for the cache, with the previous chunk's last frame in front when x has one.
torch::Tensor frames_to_keep(const torch::Tensor& x, const FeatCache::Entry& entry) {
  torch::Tensor keep = x.slice(2, x.size(2) - std::min(kCacheFrames, x.size(2))).clone();
  if (keep.size(2) < 2 && entry.frames.defined())
    keep = torch::cat({entry.frames.select(2, entry.frames.size(2) - 1).unsqueeze(2).to(keep.device()), keep}, 2);
  return keep;
}

// QwenImageCausalConv3d: an nn.Conv3d (its weight and bias by those names) whose time axis is padded with
// 2 * padding_t frames in front (the cached frames first) and none behind.
// Built with the autoencoder's TensorOptions, as every layer here (torch::kMeta: vae/memory.h's walk).
struct CausalConv3dImpl : nn::Module {
  CausalConv3dImpl(const torch::TensorOptions& o, int64_t in, int64_t out, std::vector<int64_t> kernel,
                   std::vector<int64_t> stride = {1, 1, 1}, std::vector<int64_t> padding = {0, 0, 0})
      : stride(std::move(stride)), pad{padding[2], padding[2], padding[1], padding[1], 2 * padding[0], 0} {
    gclab::nn::ConvImpl init(in, out, std::move(kernel), {1}, {0}, o);  // nn.Conv3d's initialisation
    weight = register_parameter("weight", init.weight);
    bias = register_parameter("bias", init.bias);
  }
  torch::Tensor forward(torch::Tensor x, const torch::Tensor& cache = {}) {
    std::vector<int64_t> padding = pad;
    if (cache.defined() && pad[4] > 0) {
      x = torch::cat({cache.to(x.device()), x}, 2);
      padding[4] -= cache.size(2);
    }
    x = F::pad(x, F::PadFuncOptions(padding));
    return gclab::nn::convolution(x, weight, bias, stride, {0});
  }
  // With the chunk cache (as the reference's layers call their convolutions): keeps this chunk's last
  // frames for the next one.
  torch::Tensor forward_cached(const torch::Tensor& x, FeatCache* cache) {
    if (!cache) return forward(x);
    FeatCache::Entry& entry = cache->next();
    torch::Tensor keep = frames_to_keep(x, entry);
    torch::Tensor y = forward(x, entry.frames);
    entry.frames = keep, entry.rep = false;
    ++cache->idx;
    return y;
  }
  std::vector<int64_t> stride, pad;
  torch::Tensor weight, bias;
};
TORCH_MODULE(CausalConv3d);

CausalConv3d causal_conv(const torch::TensorOptions& o, int64_t in, int64_t out, std::vector<int64_t> kernel,
                         std::vector<int64_t> stride = {1, 1, 1}, std::vector<int64_t> padding = {0, 0, 0}) {
  return CausalConv3d(
      std::make_shared<CausalConv3dImpl>(o, in, out, std::move(kernel), std::move(stride), std::move(padding)));
}

// QwenImageRMS_norm: x / ||x|| over the channels (in float32 for half types), * sqrt(dim) * gamma (+ 0.0,
// the absent bias: still a new tensor).
struct RmsNormImpl : nn::Module {
  RmsNormImpl(const torch::TensorOptions& o, int64_t dim, bool images) : scale(std::sqrt(static_cast<double>(dim))) {
    gamma = register_parameter("gamma", images ? torch::ones({dim, 1, 1}, o) : torch::ones({dim, 1, 1, 1}, o));
  }
  // Each intermediate released as soon as the next exists, as Python releases them.
  torch::Tensor forward(const torch::Tensor& x) {
    const bool upcast = x.scalar_type() == torch::kHalf || x.scalar_type() == torch::kBFloat16;
    torch::Tensor y = F::normalize(upcast ? x.to(torch::kFloat) : x, F::NormalizeFuncOptions().dim(1));
    y = y.to(x.scalar_type());
    y = y * scale;
    y = y * gamma;
    return y + 0.0;
  }
  double scale;
  torch::Tensor gamma;
};
TORCH_MODULE(RmsNorm);

// QwenImageResidualBlock.
struct ResidualImpl : nn::Module {
  ResidualImpl(const torch::TensorOptions& o, int64_t in, int64_t out)
      : norm1(register_module("norm1", RmsNorm(o, in, false))),
        conv1(register_module("conv1", causal_conv(o, in, out, {3, 3, 3}, {1, 1, 1}, {1, 1, 1}))),
        norm2(register_module("norm2", RmsNorm(o, out, false))),
        conv2(register_module("conv2", causal_conv(o, out, out, {3, 3, 3}, {1, 1, 1}, {1, 1, 1}))) {
    if (in != out) conv_shortcut = register_module("conv_shortcut", causal_conv(o, in, out, {1, 1, 1}));
  }
  torch::Tensor forward(torch::Tensor x, FeatCache* cache) {
    const torch::Tensor h = conv_shortcut ? conv_shortcut(x) : x;
    x = norm1(x);
    x = torch::silu(x);
    x = conv1->forward_cached(x, cache);
    x = norm2(x);
    x = torch::silu(x);
    x = conv2->forward_cached(x, cache);  // dropout 0: the identity
    return x + h;
  }
  RmsNorm norm1;
  CausalConv3d conv1;
  RmsNorm norm2;
  CausalConv3d conv2, conv_shortcut{nullptr};
};
TORCH_MODULE(Residual);

// QwenImageAttentionBlock: one head as wide as the channels, per frame.
struct AttentionImpl : nn::Module {
  AttentionImpl(const torch::TensorOptions& o, int64_t dim)
      : norm(register_module("norm", RmsNorm(o, dim, true))),
        to_qkv(register_module("to_qkv", gclab::nn::square_conv(dim, 3 * dim, 1, 1, 0, o))),
        proj(register_module("proj", gclab::nn::square_conv(dim, dim, 1, 1, 0, o))) {}
  torch::Tensor forward(const torch::Tensor& identity) {
    const int64_t b = identity.size(0), c = identity.size(1), t = identity.size(2), h = identity.size(3),
                  w = identity.size(4);
    torch::Tensor x = identity.permute({0, 2, 1, 3, 4}).reshape({b * t, c, h, w});
    x = norm(x);
    torch::Tensor qkv = to_qkv(x);
    qkv = qkv.reshape({b * t, 1, c * 3, -1});
    qkv = qkv.permute({0, 1, 3, 2}).contiguous();
    const auto parts = qkv.chunk(3, -1);
    x = gclab::nn::attention(parts[0], parts[1], parts[2]);
    x = x.squeeze(1).permute({0, 2, 1}).reshape({b * t, c, h, w});
    x = proj(x);
    x = x.view({b, t, c, h, w});
    x = x.permute({0, 2, 1, 3, 4});
    return x + identity;
  }
  RmsNorm norm;
  gclab::nn::Conv to_qkv, proj;
};
TORCH_MODULE(Attention);

// QwenImageResample: 2x spatial (per frame: nearest-exact then a 3x3 convolution halving the channels,
// or a right/bottom pad then a stride-2 convolution), and 2x temporal with a causal time convolution.
enum class ResampleMode { up2d, up3d, down2d, down3d };

// An up-sampler's convolution halves the channels (Wan 2.1's) unless `up_out` says otherwise (the Wan 2.2
// VAE's residual up blocks keep them).
struct ResampleImpl : nn::Module {
  ResampleImpl(const torch::TensorOptions& o, int64_t dim, ResampleMode mode, int64_t up_out = 0) : mode(mode) {
    const bool up = mode == ResampleMode::up2d || mode == ResampleMode::up3d;
    resample = register_module("resample", nn::Sequential());
    resample->push_back(nn::Identity());  // index 0: the up-sampler / the zero pad (no parameters)
    resample->push_back(up ? gclab::nn::square_conv(dim, up_out > 0 ? up_out : dim / 2, 3, 1, 1, o)
                           : gclab::nn::square_conv(dim, dim, 3, 2, 0, o));
    conv = resample->ptr<gclab::nn::ConvImpl>(1);
    if (mode == ResampleMode::up3d)
      time_conv = register_module("time_conv", causal_conv(o, dim, dim * 2, {3, 1, 1}, {1, 1, 1}, {1, 0, 0}));
    if (mode == ResampleMode::down3d)
      time_conv = register_module("time_conv", causal_conv(o, dim, dim, {3, 1, 1}, {2, 1, 1}, {0, 0, 0}));
  }
  torch::Tensor forward(torch::Tensor x, FeatCache* cache) {
    const int64_t b = x.size(0), c = x.size(1), h = x.size(3), w = x.size(4);
    if (mode == ResampleMode::up3d && cache) {
      FeatCache::Entry& entry = cache->next();
      if (entry.empty()) {
        entry.rep = true;  // the first chunk is not doubled in time
      } else {
        torch::Tensor keep = frames_to_keep(x, entry);
        if (keep.size(2) < 2 && entry.rep) keep = torch::cat({torch::zeros_like(keep), keep}, 2);
        x = entry.rep ? time_conv(x) : time_conv(x, entry.frames);
        entry.frames = keep, entry.rep = false;
        const int64_t t = x.size(2);
        x = x.reshape({b, 2, c, t, h, w});
        x = torch::stack({x.select(1, 0), x.select(1, 1)}, 3);
        x = x.reshape({b, c, t * 2, h, w});
      }
      ++cache->idx;
    }
    const int64_t t = x.size(2);
    x = x.permute({0, 2, 1, 3, 4}).reshape({b * t, c, h, w});
    if (mode == ResampleMode::up2d || mode == ResampleMode::up3d) {
      // QwenImageUpsample: nearest-exact 2x in float32, back to the input's type (F.interpolate with
      // scale_factor 2 calls this kernel with the scales).
      x = at::_upsample_nearest_exact2d(x.to(torch::kFloat), {2 * h, 2 * w}, 2.0, 2.0).to(x.scalar_type());
    } else {
      x = F::pad(x, F::PadFuncOptions({0, 1, 0, 1}));
    }
    x = conv->forward(x);
    x = x.view({b, t, x.size(1), x.size(2), x.size(3)}).permute({0, 2, 1, 3, 4});
    if (mode == ResampleMode::down3d && cache) {
      FeatCache::Entry& entry = cache->next();
      if (entry.empty()) {
        entry.frames = x.clone();
      } else {
        const torch::Tensor keep = x.slice(2, x.size(2) - 1).clone();
        x = time_conv(torch::cat({entry.frames.slice(2, entry.frames.size(2) - 1), x}, 2));
        entry.frames = keep;
      }
      ++cache->idx;
    }
    return x;
  }
  ResampleMode mode;
  nn::Sequential resample{nullptr};
  std::shared_ptr<gclab::nn::ConvImpl> conv;
  CausalConv3d time_conv{nullptr};
};
TORCH_MODULE(Resample);

// QwenImageMidBlock: resnet, attention, resnet.
struct MidBlockImpl : nn::Module {
  MidBlockImpl(const torch::TensorOptions& o, int64_t dim)
      : attentions(register_module("attentions", nn::ModuleList())),
        resnets(register_module("resnets", nn::ModuleList())) {
    resnets->push_back(Residual(o, dim, dim));
    attentions->push_back(Attention(o, dim));
    resnets->push_back(Residual(o, dim, dim));
  }
  torch::Tensor forward(torch::Tensor x, FeatCache* cache) {
    x = resnets[0]->as<ResidualImpl>()->forward(x, cache);
    x = attentions[0]->as<AttentionImpl>()->forward(x);
    return resnets[1]->as<ResidualImpl>()->forward(x, cache);
  }
  nn::ModuleList attentions, resnets;
};
TORCH_MODULE(MidBlock);

// The head both halves end with: RMS norm, SiLU, a causal 3x3x3 convolution.
torch::Tensor head(RmsNorm& norm, CausalConv3d& conv, torch::Tensor x, FeatCache* cache) {
  x = norm(x);
  x = torch::silu(x);
  return conv->forward_cached(x, cache);
}

// AvgDown3D (the Wan 2.2 VAE's down shortcut): frames padded in front to a multiple of `ft`, each ft x fs x
// fs neighbourhood folded into the channels, the channels averaged in groups down to `out`.
torch::Tensor avg_down(torch::Tensor x, int64_t out, int64_t ft, int64_t fs) {
  const int64_t pad_t = (ft - x.size(2) % ft) % ft;
  x = F::pad(x, F::PadFuncOptions({0, 0, 0, 0, pad_t, 0}));
  const int64_t b = x.size(0), c = x.size(1), t = x.size(2), h = x.size(3), w = x.size(4);
  x = x.view({b, c, t / ft, ft, h / fs, fs, w / fs, fs}).permute({0, 1, 3, 5, 7, 2, 4, 6}).contiguous();
  x = x.view({b, out, c * ft * fs * fs / out, t / ft, h / fs, w / fs});
  return x.mean(2);
}

// DupUp3D (its up shortcut): the channels repeated up to `out` x ft x fs², unfolded into frames and pixels;
// the first chunk keeps its last frame only.
torch::Tensor dup_up(torch::Tensor x, int64_t out, int64_t ft, int64_t fs, bool first_chunk) {
  x = x.repeat_interleave(out * ft * fs * fs / x.size(1), 1);
  const int64_t b = x.size(0), t = x.size(2), h = x.size(3), w = x.size(4);
  x = x.view({b, out, ft, fs, fs, t, h, w}).permute({0, 1, 5, 2, 6, 3, 7, 4}).contiguous();
  x = x.view({b, out, t * ft, h * fs, w * fs});
  return first_chunk ? x.slice(2, ft - 1) : x;
}

// WanResidualDownBlock: residual blocks and the down-sampler, plus AvgDown3D of a copy of the input.
struct ResidualDownImpl : nn::Module {
  ResidualDownImpl(const torch::TensorOptions& o, int64_t in, int64_t out, int64_t res_blocks, bool temporal, bool down)
      : resnets(register_module("resnets", nn::ModuleList())), out(out), ft(temporal ? 2 : 1), fs(down ? 2 : 1) {
    for (int64_t r = 0; r < res_blocks; ++r) resnets->push_back(Residual(o, r == 0 ? in : out, out));
    if (down)
      downsampler =
          register_module("downsampler", Resample(o, out, temporal ? ResampleMode::down3d : ResampleMode::down2d));
  }
  torch::Tensor forward(torch::Tensor x, FeatCache* cache) {
    const torch::Tensor copy = x.clone();
    for (const auto& r : *resnets) x = r->as<ResidualImpl>()->forward(x, cache);
    if (downsampler) x = downsampler->forward(x, cache);
    return x + avg_down(copy, out, ft, fs);
  }
  nn::ModuleList resnets;
  Resample downsampler{nullptr};
  int64_t out, ft, fs;
};
TORCH_MODULE(ResidualDown);

// QwenImageEncoder3d: down_blocks is one flat list of residual blocks and resamplers (Wan 2.2's: one
// residual down block per stage).
struct EncoderImpl : nn::Module {
  EncoderImpl(const QwenImageVaeConfig& c, const torch::TensorOptions& o) {
    std::vector<int64_t> dims = {c.base_dim};
    for (int64_t m : c.dim_mult) dims.push_back(c.base_dim * m);
    conv_in = register_module("conv_in", causal_conv(o, c.input_channels, dims[0], {3, 3, 3}, {1, 1, 1}, {1, 1, 1}));
    down_blocks = register_module("down_blocks", nn::ModuleList());
    for (size_t i = 0; i + 1 < dims.size(); ++i) {
      const bool last = i + 1 == c.dim_mult.size();
      if (c.is_residual) {
        down_blocks->push_back(
            ResidualDown(o, dims[i], dims[i + 1], c.num_res_blocks, !last && c.temperal_downsample.at(i), !last));
        continue;
      }
      int64_t in = dims[i];
      for (int64_t r = 0; r < c.num_res_blocks; ++r) {
        down_blocks->push_back(Residual(o, in, dims[i + 1]));
        in = dims[i + 1];
      }
      if (i + 1 != c.dim_mult.size())
        down_blocks->push_back(
            Resample(o, dims[i + 1], c.temperal_downsample.at(i) ? ResampleMode::down3d : ResampleMode::down2d));
    }
    mid_block = register_module("mid_block", MidBlock(o, dims.back()));
    norm_out = register_module("norm_out", RmsNorm(o, dims.back(), false));
    conv_out = register_module("conv_out", causal_conv(o, dims.back(), 2 * c.z_dim, {3, 3, 3}, {1, 1, 1}, {1, 1, 1}));
  }
  torch::Tensor forward(torch::Tensor x, FeatCache* cache) {
    x = conv_in->forward_cached(x, cache);
    for (const auto& layer : *down_blocks) {
      if (auto* r = layer->as<ResidualImpl>())
        x = r->forward(x, cache);
      else if (auto* d = layer->as<ResidualDownImpl>())
        x = d->forward(x, cache);
      else
        x = layer->as<ResampleImpl>()->forward(x, cache);
    }
    x = mid_block->forward(x, cache);
    return head(norm_out, conv_out, x, cache);
  }
  CausalConv3d conv_in{nullptr}, conv_out{nullptr};
  nn::ModuleList down_blocks{nullptr};
  MidBlock mid_block{nullptr};
  RmsNorm norm_out{nullptr};
};

// QwenImageUpBlock: num_res_blocks + 1 residual blocks, then the up-sampler. The Wan 2.2 VAE's
// WanResidualUpBlock: its up-sampler (`upsampler`) keeps the channels, and DupUp3D of a copy of the input is
// added.
struct UpBlockImpl : nn::Module {
  UpBlockImpl(const torch::TensorOptions& o, int64_t in, int64_t out, int64_t res_blocks,
              std::optional<ResampleMode> mode, bool residual)
      : resnets(register_module("resnets", nn::ModuleList())), residual(residual && mode), out(out) {
    for (int64_t r = 0; r <= res_blocks; ++r) resnets->push_back(Residual(o, r == 0 ? in : out, out));
    if (mode && residual) {
      upsampler = register_module("upsampler", Resample(o, out, *mode, out));
      ft = *mode == ResampleMode::up3d ? 2 : 1;
    } else if (mode) {
      upsamplers = register_module("upsamplers", nn::ModuleList());
      upsamplers->push_back(Resample(o, out, *mode));
    }
  }
  torch::Tensor forward(torch::Tensor x, FeatCache* cache, bool first_chunk) {
    torch::Tensor copy;
    if (residual) copy = x.clone();
    for (const auto& r : *resnets) x = r->as<ResidualImpl>()->forward(x, cache);
    if (upsampler) x = upsampler->forward(x, cache);
    if (upsamplers) x = upsamplers[0]->as<ResampleImpl>()->forward(x, cache);
    return residual ? x + dup_up(copy, out, ft, 2, first_chunk) : x;
  }
  nn::ModuleList resnets, upsamplers{nullptr};
  Resample upsampler{nullptr};
  bool residual;
  int64_t out, ft = 1;
};
TORCH_MODULE(UpBlock);

// QwenImageDecoder3d.
struct DecoderImpl : nn::Module {
  DecoderImpl(const QwenImageVaeConfig& c, const torch::TensorOptions& o) {
    const int64_t base = c.decoder_base_dim > 0 ? c.decoder_base_dim : c.base_dim;
    std::vector<int64_t> dims = {base * c.dim_mult.back()};
    for (auto it = c.dim_mult.rbegin(); it != c.dim_mult.rend(); ++it) dims.push_back(base * *it);
    const std::vector<bool> temperal_upsample(c.temperal_downsample.rbegin(), c.temperal_downsample.rend());
    conv_in = register_module("conv_in", causal_conv(o, c.z_dim, dims[0], {3, 3, 3}, {1, 1, 1}, {1, 1, 1}));
    mid_block = register_module("mid_block", MidBlock(o, dims[0]));
    up_blocks = register_module("up_blocks", nn::ModuleList());
    for (size_t i = 0; i + 1 < dims.size(); ++i) {
      // Wan 2.1's up-sampler before halved the channels; the residual up blocks keep them.
      const int64_t in = i > 0 && !c.is_residual ? dims[i] / 2 : dims[i];
      std::optional<ResampleMode> mode;
      if (i + 1 != c.dim_mult.size()) mode = temperal_upsample.at(i) ? ResampleMode::up3d : ResampleMode::up2d;
      up_blocks->push_back(UpBlock(o, in, dims[i + 1], c.num_res_blocks, mode, c.is_residual));
    }
    norm_out = register_module("norm_out", RmsNorm(o, dims.back(), false));
    conv_out =
        register_module("conv_out", causal_conv(o, dims.back(), c.input_channels, {3, 3, 3}, {1, 1, 1}, {1, 1, 1}));
  }
  torch::Tensor forward(torch::Tensor x, FeatCache* cache, bool first_chunk) {
    x = conv_in->forward_cached(x, cache);
    x = mid_block->forward(x, cache);
    for (const auto& b : *up_blocks) x = b->as<UpBlockImpl>()->forward(x, cache, first_chunk);
    return head(norm_out, conv_out, x, cache);
  }
  CausalConv3d conv_in{nullptr}, conv_out{nullptr};
  MidBlock mid_block{nullptr};
  nn::ModuleList up_blocks{nullptr};
  RmsNorm norm_out{nullptr};
};

// patchify / unpatchify (autoencoder_kl_wan.py): each p x p patch of a frame into the channels, channel
// c * p² + column * p + row, and back.
torch::Tensor patchify(const torch::Tensor& x, int64_t p) {
  if (p == 1) return x;
  const int64_t b = x.size(0), c = x.size(1), t = x.size(2), h = x.size(3), w = x.size(4);
  TORCH_CHECK(h % p == 0 && w % p == 0, "the Wan 2.2 VAE takes frames whose sides are multiples of ", p);
  return x.view({b, c, t, h / p, p, w / p, p})
      .permute({0, 1, 6, 4, 2, 3, 5})
      .contiguous()
      .view({b, c * p * p, t, h / p, w / p});
}
torch::Tensor unpatchify(const torch::Tensor& x, int64_t p) {
  if (p == 1) return x;
  const int64_t b = x.size(0), c = x.size(1) / (p * p), t = x.size(2), h = x.size(3), w = x.size(4);
  return x.view({b, c, p, p, t, h, w}).permute({0, 1, 4, 5, 3, 6, 2}).contiguous().view({b, c, t, h * p, w * p});
}

// [1, C, 1, 1, 1] in float32 (inverted there when asked, as the pipeline computes 1 / latents_std), then
// in like's device and type.
torch::Tensor per_channel(const std::vector<double>& v, const torch::Tensor& like, bool inverse = false) {
  torch::Tensor t = torch::tensor(v, torch::TensorOptions().dtype(torch::kFloat));
  if (inverse) t = 1.0 / t;
  return t.view({1, static_cast<int64_t>(v.size()), 1, 1, 1}).to(like.device(), like.scalar_type());
}

}  // namespace qwen
}  // namespace

QwenImageVaeConfig QwenImageVaeConfig::tiny() {
  QwenImageVaeConfig c;
  c.base_dim = 32;
  c.dim_mult = {1, 1, 1, 1};
  c.num_res_blocks = 1;
  return c;
}

QwenImageVaeConfig QwenImageVaeConfig::residual_16x() {
  QwenImageVaeConfig c;
  c.base_dim = 160, c.decoder_base_dim = 256, c.z_dim = 48;
  c.is_residual = true, c.patch_size = 2, c.input_channels = 12, c.clamps_tiles = true;
  c.latents_mean = {-0.2289, -0.0052, -0.1323, -0.2339, -0.2799, 0.0174,  0.1838,  0.1557,  -0.1382, 0.0542,
                    0.2813,  0.0891,  0.1570,  -0.0098, 0.0375,  -0.1825, -0.2246, -0.1207, -0.0698, 0.5109,
                    0.2665,  -0.2108, -0.2158, 0.2502,  -0.2055, -0.0322, 0.1109,  0.1567,  -0.0729, 0.0899,
                    -0.2799, -0.1230, -0.0313, -0.1649, 0.0117,  0.0723,  -0.2839, -0.2083, -0.0520, 0.3748,
                    0.0152,  0.1957,  0.1433,  -0.2944, 0.3573,  -0.0548, -0.1681, -0.0667};
  c.latents_std = {0.4765, 1.0364, 0.4514, 1.1677, 0.5313, 0.4990, 0.4818, 0.5013, 0.8158, 1.0344, 0.5894, 1.0901,
                   0.6885, 0.6165, 0.8454, 0.4978, 0.5759, 0.3523, 0.7135, 0.6804, 0.5833, 1.4146, 0.8986, 0.5659,
                   0.7069, 0.5338, 0.4889, 0.4917, 0.4069, 0.4999, 0.6866, 0.4093, 0.5709, 0.6065, 0.6415, 0.4944,
                   0.5726, 1.2042, 0.5458, 1.6887, 0.3971, 1.0600, 0.3943, 0.5537, 0.5444, 0.4089, 0.7468, 0.7744};
  return c;
}

QwenImageVaeConfig QwenImageVaeConfig::residual_16x_tiny() {
  QwenImageVaeConfig c = residual_16x();
  c.base_dim = 32, c.decoder_base_dim = 32, c.dim_mult = {1, 1, 1, 1}, c.num_res_blocks = 1;
  return c;
}

QwenImageVaeConfig QwenImageVaeConfig::from_json_file(const std::filesystem::path& path) {
  return parse_config_json(
      path, "AutoencoderKLQwenImage",
      [](const nlohmann::json& j) {
        QwenImageVaeConfig c;
        c.base_dim = j.value("base_dim", c.base_dim);
        c.z_dim = j.value("z_dim", c.z_dim);
        c.dim_mult = j.value("dim_mult", c.dim_mult);
        c.num_res_blocks = j.value("num_res_blocks", c.num_res_blocks);
        c.temperal_downsample = j.value("temperal_downsample", c.temperal_downsample);
        c.input_channels = j.value("input_channels", c.input_channels);
        c.latents_mean = j.value("latents_mean", c.latents_mean);
        c.latents_std = j.value("latents_std", c.latents_std);
        if (!j.value("attn_scales", nlohmann::json::array()).empty())
          throw std::runtime_error("attn_scales is not empty, which gclab does not build");
        if (c.temperal_downsample.size() + 1 != c.dim_mult.size())
          throw std::runtime_error("temperal_downsample needs one entry fewer than dim_mult");
        if (static_cast<int64_t>(c.latents_mean.size()) != c.z_dim ||
            static_cast<int64_t>(c.latents_std.size()) != c.z_dim)
          throw std::runtime_error("latents_mean and latents_std need z_dim values");
        // diffusers' AutoencoderKLWan is the same network (its state dict, key for key): the Wan 2.1 VAE, or
        // with is_residual, patch_size and decoder_base_dim the Wan 2.2 VAE; its in_channels / out_channels
        // are the network's (3 x patch²).
        if (j.value("_class_name", std::string()) == "AutoencoderKLWan") {
          c.clamps_tiles = true;
          const auto number_or = [&](const char* key, int64_t fallback) {
            return j.contains(key) && !j[key].is_null() ? j[key].get<int64_t>() : fallback;
          };
          c.is_residual = j.value("is_residual", false);
          c.patch_size = number_or("patch_size", 1);
          c.decoder_base_dim = number_or("decoder_base_dim", 0);
          c.input_channels = number_or("in_channels", 3);
          if (number_or("out_channels", 3) != c.input_channels || c.input_channels != 3 * c.patch_size * c.patch_size)
            throw std::runtime_error("in_channels and out_channels must both be 3 x patch_size² (RGB, patchified)");
          if (number_or("scale_factor_spatial", c.downsampling()) != c.downsampling())
            throw std::runtime_error("scale_factor_spatial " + std::to_string(number_or("scale_factor_spatial", 0)) +
                                     " is not the network's " + std::to_string(c.downsampling()));
        }
        return c;
      },
      {"AutoencoderKLWan"});
}

QwenImageVaeImpl::QwenImageVaeImpl(QwenImageVaeConfig config, const torch::TensorOptions& options)
    : config_(std::move(config)) {
  const int64_t z = config_.z_dim;
  encoder_ = register_module("encoder", std::make_shared<qwen::EncoderImpl>(config_, options));
  quant_conv_ = register_module("quant_conv", qwen::causal_conv(options, 2 * z, 2 * z, {1, 1, 1}).ptr());
  post_quant_conv_ = register_module("post_quant_conv", qwen::causal_conv(options, z, z, {1, 1, 1}).ptr());
  decoder_ = register_module("decoder", std::make_shared<qwen::DecoderImpl>(config_, options));
}

torch::Tensor QwenImageVaeImpl::moments(const torch::Tensor& video) {
  // _encode: the first frame alone, then chunks of 4, one cache across them.
  qwen::FeatCache cache;
  auto& encoder = static_cast<qwen::EncoderImpl&>(*encoder_);
  const torch::Tensor x = qwen::patchify(video, config_.patch_size);
  const int64_t frames = x.size(2);
  torch::Tensor out;
  for (int64_t i = 0; i < 1 + (frames - 1) / 4; ++i) {
    cache.idx = 0;
    const torch::Tensor chunk = i == 0 ? x.slice(2, 0, 1) : x.slice(2, 1 + 4 * (i - 1), 1 + 4 * i);
    const torch::Tensor y = encoder.forward(chunk, &cache);
    out = i == 0 ? y : torch::cat({out, y}, 2);
  }
  return static_cast<qwen::CausalConv3dImpl&>(*quant_conv_).forward(out);
}

torch::Tensor QwenImageVaeImpl::encode(const torch::Tensor& video, Posterior posterior,
                                       std::optional<at::Generator> generator) {
  const bool image = video.dim() == 4;
  const auto parts = moments(image ? video.unsqueeze(2) : video).chunk(2, 1);
  torch::Tensor z = parts[0];
  if (posterior == Posterior::sample) {  // DiagonalGaussianDistribution.sample
    const torch::Tensor std = torch::exp(0.5 * parts[1].clamp(-30.0, 20.0));
    const torch::Device where = generator ? generator->device() : z.device();
    z = z + std * at::randn(z.sizes(), generator, z.options().device(where)).to(z.device());
  }
  // QwenImageEditPipeline._encode_vae_image: (latents - latents_mean) / latents_std.
  z = (z - qwen::per_channel(config_.latents_mean, z)) / qwen::per_channel(config_.latents_std, z);
  return image ? z.squeeze(2) : z;
}

torch::Tensor QwenImageVaeImpl::decode_frames(const torch::Tensor& z) {
  const torch::Tensor x = static_cast<qwen::CausalConv3dImpl&>(*post_quant_conv_).forward(z);
  qwen::FeatCache cache;
  auto& decoder = static_cast<qwen::DecoderImpl&>(*decoder_);
  torch::Tensor out;
  for (int64_t i = 0; i < x.size(2); ++i) {
    cache.idx = 0;
    const torch::Tensor y = decoder.forward(x.slice(2, i, i + 1), &cache, /*first_chunk=*/i == 0);
    out = i == 0 ? y : torch::cat({out, y}, 2);
  }
  return out;
}

torch::Tensor QwenImageVaeImpl::decode(const torch::Tensor& latents) {
  const bool image = latents.dim() == 4;
  torch::Tensor z = image ? latents.unsqueeze(2) : latents;
  // QwenImagePipeline: latents / (1 / latents_std) + latents_mean.
  z = z / qwen::per_channel(config_.latents_std, z, true) + qwen::per_channel(config_.latents_mean, z);
  // _decode: whole (clamped), or tiled_decode when tiling is on and the latents exceed a tile (not clamped);
  // a patchified VAE's tiles in its patched pixels (diffusers divides the tile and its stride by the patch),
  // unpatchified after.
  const int64_t p = config_.patch_size, network = config_.downsampling() / p;
  const TileGrid grid(tile_sample_size_ / p, network);
  const bool tiled = tile_sample_size_ > 0 && grid.tiles(z.size(3), z.size(4));
  torch::Tensor out =
      tiled ? qwen::unpatchify(
                  tiled_decode(z, grid, network, [this](const torch::Tensor& t) { return decode_frames(t); }), p)
            : qwen::unpatchify(decode_frames(z), p);
  if (!tiled || config_.clamps_tiles) out = torch::clamp(out, -1.0, 1.0);
  return image ? out.squeeze(2) : out;
}

std::vector<std::string> load_qwen_image_vae_weights(QwenImageVaeImpl& vae, const std::filesystem::path& path) {
  return load_diffusers_weights(vae, path);
}

}  // namespace gclab::vae
