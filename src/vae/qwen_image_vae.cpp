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

struct ResampleImpl : nn::Module {
  ResampleImpl(const torch::TensorOptions& o, int64_t dim, ResampleMode mode) : mode(mode) {
    const bool up = mode == ResampleMode::up2d || mode == ResampleMode::up3d;
    resample = register_module("resample", nn::Sequential());
    resample->push_back(nn::Identity());  // index 0: the up-sampler / the zero pad (no parameters)
    resample->push_back(up ? gclab::nn::square_conv(dim, dim / 2, 3, 1, 1, o)
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

// QwenImageEncoder3d: down_blocks is one flat list of residual blocks and resamplers.
struct EncoderImpl : nn::Module {
  EncoderImpl(const QwenImageVaeConfig& c, const torch::TensorOptions& o) {
    std::vector<int64_t> dims = {c.base_dim};
    for (int64_t m : c.dim_mult) dims.push_back(c.base_dim * m);
    conv_in = register_module("conv_in", causal_conv(o, c.input_channels, dims[0], {3, 3, 3}, {1, 1, 1}, {1, 1, 1}));
    down_blocks = register_module("down_blocks", nn::ModuleList());
    for (size_t i = 0; i + 1 < dims.size(); ++i) {
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

// QwenImageUpBlock: num_res_blocks + 1 residual blocks, then the up-sampler.
struct UpBlockImpl : nn::Module {
  UpBlockImpl(const torch::TensorOptions& o, int64_t in, int64_t out, int64_t res_blocks,
              std::optional<ResampleMode> mode)
      : resnets(register_module("resnets", nn::ModuleList())) {
    for (int64_t r = 0; r <= res_blocks; ++r) resnets->push_back(Residual(o, r == 0 ? in : out, out));
    if (mode) {
      upsamplers = register_module("upsamplers", nn::ModuleList());
      upsamplers->push_back(Resample(o, out, *mode));
    }
  }
  torch::Tensor forward(torch::Tensor x, FeatCache* cache) {
    for (const auto& r : *resnets) x = r->as<ResidualImpl>()->forward(x, cache);
    return upsamplers ? upsamplers[0]->as<ResampleImpl>()->forward(x, cache) : x;
  }
  nn::ModuleList resnets, upsamplers{nullptr};
};
TORCH_MODULE(UpBlock);

// QwenImageDecoder3d.
struct DecoderImpl : nn::Module {
  DecoderImpl(const QwenImageVaeConfig& c, const torch::TensorOptions& o) {
    std::vector<int64_t> dims = {c.base_dim * c.dim_mult.back()};
    for (auto it = c.dim_mult.rbegin(); it != c.dim_mult.rend(); ++it) dims.push_back(c.base_dim * *it);
    const std::vector<bool> temperal_upsample(c.temperal_downsample.rbegin(), c.temperal_downsample.rend());
    conv_in = register_module("conv_in", causal_conv(o, c.z_dim, dims[0], {3, 3, 3}, {1, 1, 1}, {1, 1, 1}));
    mid_block = register_module("mid_block", MidBlock(o, dims[0]));
    up_blocks = register_module("up_blocks", nn::ModuleList());
    for (size_t i = 0; i + 1 < dims.size(); ++i) {
      const int64_t in = i > 0 ? dims[i] / 2 : dims[i];  // the up-sampler before halved the channels
      std::optional<ResampleMode> mode;
      if (i + 1 != c.dim_mult.size()) mode = temperal_upsample.at(i) ? ResampleMode::up3d : ResampleMode::up2d;
      up_blocks->push_back(UpBlock(o, in, dims[i + 1], c.num_res_blocks, mode));
    }
    norm_out = register_module("norm_out", RmsNorm(o, dims.back(), false));
    conv_out =
        register_module("conv_out", causal_conv(o, dims.back(), c.input_channels, {3, 3, 3}, {1, 1, 1}, {1, 1, 1}));
  }
  torch::Tensor forward(torch::Tensor x, FeatCache* cache) {
    x = conv_in->forward_cached(x, cache);
    x = mid_block->forward(x, cache);
    for (const auto& b : *up_blocks) x = b->as<UpBlockImpl>()->forward(x, cache);
    return head(norm_out, conv_out, x, cache);
  }
  CausalConv3d conv_in{nullptr}, conv_out{nullptr};
  MidBlock mid_block{nullptr};
  nn::ModuleList up_blocks{nullptr};
  RmsNorm norm_out{nullptr};
};

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
        // diffusers' AutoencoderKLWan is the same network (its state dict, key for key) where it is the Wan 2.1
        // VAE: no residual blocks, no patchify, one base width, RGB in and out. The Wan 2.2 VAE is not built.
        const auto is_null_or = [&](const char* key, const nlohmann::json& value) {
          return !j.contains(key) || j[key].is_null() || j[key] == value;
        };
        if (j.value("_class_name", std::string()) == "AutoencoderKLWan" &&
            (j.value("is_residual", false) || !is_null_or("patch_size", nullptr) ||
             !is_null_or("decoder_base_dim", c.base_dim) || j.value("in_channels", 3) != 3 ||
             j.value("out_channels", 3) != 3))
          throw std::runtime_error(
              "an AutoencoderKLWan other than Wan 2.1's (is_residual, patch_size, decoder_base_dim, "
              "in_channels or out_channels: the Wan 2.2 VAE), which gclab does not build yet");
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
  const int64_t frames = video.size(2);
  torch::Tensor out;
  for (int64_t i = 0; i < 1 + (frames - 1) / 4; ++i) {
    cache.idx = 0;
    const torch::Tensor chunk = i == 0 ? video.slice(2, 0, 1) : video.slice(2, 1 + 4 * (i - 1), 1 + 4 * i);
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
    const torch::Tensor y = decoder.forward(x.slice(2, i, i + 1), &cache);
    out = i == 0 ? y : torch::cat({out, y}, 2);
  }
  return out;
}

torch::Tensor QwenImageVaeImpl::decode(const torch::Tensor& latents) {
  const bool image = latents.dim() == 4;
  torch::Tensor z = image ? latents.unsqueeze(2) : latents;
  // QwenImagePipeline: latents / (1 / latents_std) + latents_mean.
  z = z / qwen::per_channel(config_.latents_std, z, true) + qwen::per_channel(config_.latents_mean, z);
  // _decode: whole (clamped), or tiled_decode when tiling is on and the latents exceed a tile (not clamped).
  const TileGrid grid(tile_sample_size_, config_.downsampling());
  torch::Tensor out =
      tile_sample_size_ > 0 && grid.tiles(z.size(3), z.size(4))
          ? tiled_decode(z, grid, config_.downsampling(), [this](const torch::Tensor& t) { return decode_frames(t); })
          : torch::clamp(decode_frames(z), -1.0, 1.0);
  return image ? out.squeeze(2) : out;
}

std::vector<std::string> load_qwen_image_vae_weights(QwenImageVaeImpl& vae, const std::filesystem::path& path) {
  return load_diffusers_weights(vae, path);
}

}  // namespace gclab::vae
