#include "gclab/vae/autoencoder_kl.h"

#include <algorithm>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>

#include "config_json.h"
#include "gclab/io/safetensors.h"
#include "gclab/nn/layers.h"
#include "gclab/nn/meta_kernels.h"
#include "tiling.h"

namespace gclab::vae {

namespace nn = torch::nn;
using gclab::nn::Conv;
using gclab::nn::GroupNorm;

namespace {

constexpr double kEps = 1e-6;  // every GroupNorm of the encoder and decoder (resnet_eps)

// Every layer is built with the autoencoder's TensorOptions (torch::kMeta: the memory model walks this
// code on shapes alone, vae/memory.h).
Conv conv(const torch::TensorOptions& o, int64_t in, int64_t out, int64_t kernel, int64_t stride = 1,
          int64_t padding = -1) {
  return gclab::nn::square_conv(in, out, kernel, stride, padding < 0 ? kernel / 2 : padding, o);
}
GroupNorm group_norm(const torch::TensorOptions& o, int64_t groups, int64_t channels) {
  return GroupNorm(groups, channels, kEps, o);
}

// ResnetBlock2D without a time embedding: GroupNorm, SiLU, 3x3 conv, twice; a 1x1 conv_shortcut when the
// channel count changes.
struct ResnetImpl : nn::Module {
  ResnetImpl(const torch::TensorOptions& o, int64_t in, int64_t out, int64_t groups)
      : norm1(register_module("norm1", group_norm(o, groups, in))),
        conv1(register_module("conv1", conv(o, in, out, 3))),
        norm2(register_module("norm2", group_norm(o, groups, out))),
        conv2(register_module("conv2", conv(o, out, out, 3))) {
    if (in != out) conv_shortcut = register_module("conv_shortcut", conv(o, in, out, 1));
  }
  // Statement by statement as diffusers' ResnetBlock2D.forward, so the same tensors are alive at once:
  // each result replaces the last, the block's input stays for the residual, and the sum is divided by
  // output_scale_factor (1, still a new tensor).
  torch::Tensor forward(const torch::Tensor& input) {
    torch::Tensor h = norm1(input);
    h = torch::silu(h);
    h = conv1(h);
    h = norm2(h);
    h = torch::silu(h);
    h = conv2(h);
    const torch::Tensor shortcut = conv_shortcut ? conv_shortcut(input) : input;
    return (shortcut + h) / 1.0;
  }
  GroupNorm norm1;
  Conv conv1;
  GroupNorm norm2;
  Conv conv2, conv_shortcut{nullptr};
};
TORCH_MODULE(Resnet);

// The mid block's Attention (one head as wide as the channels, GroupNorm first, a residual connection).
struct AttentionImpl : nn::Module {
  AttentionImpl(const torch::TensorOptions& o, int64_t channels, int64_t groups)
      : group_norm(register_module("group_norm", vae::group_norm(o, groups, channels))),
        to_q(
            register_module("to_q", gclab::nn::Linear(gclab::nn::LinearOptions(channels, channels).tensor_options(o)))),
        to_k(
            register_module("to_k", gclab::nn::Linear(gclab::nn::LinearOptions(channels, channels).tensor_options(o)))),
        to_v(
            register_module("to_v", gclab::nn::Linear(gclab::nn::LinearOptions(channels, channels).tensor_options(o)))),
        to_out(register_module("to_out", nn::ModuleList())) {
    out = gclab::nn::Linear(gclab::nn::LinearOptions(channels, channels).tensor_options(o));
    to_out->push_back(out);
  }
  // As diffusers' AttnProcessor2_0 with one head: the query, key and value stay alive to the end, as the
  // processor's locals do; the residual is added and the sum divided by rescale_output_factor (1).
  torch::Tensor forward(const torch::Tensor& residual) {
    const int64_t b = residual.size(0), c = residual.size(1), height = residual.size(2), width = residual.size(3);
    torch::Tensor h = residual.view({b, c, height * width}).transpose(1, 2);
    h = group_norm(h.transpose(1, 2)).transpose(1, 2);
    const torch::Tensor q = to_q(h).view({b, -1, 1, c}).transpose(1, 2);
    const torch::Tensor k = to_k(h).view({b, -1, 1, c}).transpose(1, 2);
    const torch::Tensor v = to_v(h).view({b, -1, 1, c}).transpose(1, 2);
    h = gclab::nn::attention(q, k, v);
    h = h.transpose(1, 2).reshape({b, -1, c});
    h = out(h);
    h = h.transpose(-1, -2).reshape({b, c, height, width});
    h = h + residual;
    return h / 1.0;
  }
  GroupNorm group_norm;
  gclab::nn::Linear to_q, to_k, to_v, out{nullptr};
  nn::ModuleList to_out;
};
TORCH_MODULE(Attention);

// UNetMidBlock2D: resnet, attention, resnet.
struct MidBlockImpl : nn::Module {
  MidBlockImpl(const torch::TensorOptions& o, int64_t channels, int64_t groups, bool attention)
      : resnets(register_module("resnets", nn::ModuleList())) {
    for (int i = 0; i < 2; ++i) resnets->push_back(Resnet(o, channels, channels, groups));
    if (attention) {
      attentions = register_module("attentions", nn::ModuleList());
      attentions->push_back(Attention(o, channels, groups));
    }
  }
  torch::Tensor forward(torch::Tensor x) {
    x = resnets[0]->as<ResnetImpl>()->forward(x);
    if (attentions) x = attentions[0]->as<AttentionImpl>()->forward(x);
    return resnets[1]->as<ResnetImpl>()->forward(x);
  }
  nn::ModuleList resnets, attentions{nullptr};
};
TORCH_MODULE(MidBlock);

// A `conv` child, as diffusers' Downsample2D / Upsample2D name theirs.
struct ResampleImpl : nn::Module {
  ResampleImpl(const torch::TensorOptions& o, int64_t channels, bool down)
      : down(down), conv(register_module("conv", vae::conv(o, channels, channels, 3, down ? 2 : 1, down ? 0 : 1))) {}
  torch::Tensor forward(const torch::Tensor& x) {
    namespace F = torch::nn::functional;
    torch::Tensor h =
        down ? torch::constant_pad_nd(x, {0, 1, 0, 1})  // padding=0: pad right and bottom
             : F::interpolate(
                   x, F::InterpolateFuncOptions().scale_factor(std::vector<double>{2.0, 2.0}).mode(torch::kNearest));
    return conv(h);
  }
  bool down;
  Conv conv;
};
TORCH_MODULE(Resample);

// DownEncoderBlock2D / UpDecoderBlock2D: resnets, then the resampler (not in the last block).
struct StageImpl : nn::Module {
  StageImpl(const torch::TensorOptions& o, int64_t in, int64_t out, int64_t layers, int64_t groups, bool down,
            bool resample)
      : resnets(register_module("resnets", nn::ModuleList())) {
    for (int64_t i = 0; i < layers; ++i) resnets->push_back(Resnet(o, i == 0 ? in : out, out, groups));
    if (resample) {
      samplers = register_module(down ? "downsamplers" : "upsamplers", nn::ModuleList());
      samplers->push_back(Resample(o, out, down));
    }
  }
  torch::Tensor forward(torch::Tensor x) {
    for (const auto& r : *resnets) x = r->as<ResnetImpl>()->forward(x);
    return samplers ? samplers[0]->as<ResampleImpl>()->forward(x) : x;
  }
  nn::ModuleList resnets, samplers{nullptr};
};
TORCH_MODULE(Stage);

// What diffusers' Encoder and Decoder share: conv_in, a mid block, and the GroupNorm + SiLU + conv_out head.
struct CoderImpl : nn::Module {
  torch::Tensor head(torch::Tensor x) {
    x = conv_norm_out(x);
    x = torch::silu(x);
    return conv_out(x);
  }
  Conv conv_in{nullptr}, conv_out{nullptr};
  MidBlock mid_block{nullptr};
  GroupNorm conv_norm_out{nullptr};
};

struct EncoderImpl : CoderImpl {
  EncoderImpl(const AutoencoderKLConfig& c, const torch::TensorOptions& o) {
    const auto& ch = c.block_out_channels;
    const int64_t g = c.norm_num_groups;
    conv_in = register_module("conv_in", conv(o, c.in_channels, ch.front(), 3));
    down_blocks = register_module("down_blocks", nn::ModuleList());
    for (size_t i = 0; i < ch.size(); ++i)
      down_blocks->push_back(
          Stage(o, i == 0 ? ch.front() : ch[i - 1], ch[i], c.layers_per_block, g, true, i + 1 < ch.size()));
    mid_block = register_module("mid_block", MidBlock(o, ch.back(), g, c.mid_block_add_attention));
    conv_norm_out = register_module("conv_norm_out", group_norm(o, g, ch.back()));
    conv_out = register_module("conv_out", conv(o, ch.back(), 2 * c.latent_channels, 3));  // double_z
  }
  torch::Tensor forward(const torch::Tensor& images) {
    torch::Tensor x = conv_in(images);
    for (const auto& s : *down_blocks) x = s->as<StageImpl>()->forward(x);
    return head(mid_block(x));
  }
  nn::ModuleList down_blocks{nullptr};
};

struct DecoderImpl : CoderImpl {
  DecoderImpl(const AutoencoderKLConfig& c, const torch::TensorOptions& o) {
    const std::vector<int64_t> ch(c.decoder_channels().rbegin(), c.decoder_channels().rend());
    const int64_t g = c.norm_num_groups;
    conv_in = register_module("conv_in", conv(o, c.latent_channels, ch.front(), 3));
    mid_block = register_module("mid_block", MidBlock(o, ch.front(), g, c.mid_block_add_attention));
    up_blocks = register_module("up_blocks", nn::ModuleList());
    for (size_t i = 0; i < ch.size(); ++i)
      up_blocks->push_back(
          Stage(o, i == 0 ? ch.front() : ch[i - 1], ch[i], c.layers_per_block + 1, g, false, i + 1 < ch.size()));
    conv_norm_out = register_module("conv_norm_out", group_norm(o, g, ch.back()));
    conv_out = register_module("conv_out", conv(o, ch.back(), c.out_channels, 3));
  }
  torch::Tensor forward(const torch::Tensor& z) {
    torch::Tensor x = conv_in(z);
    x = mid_block(x);
    for (const auto& s : *up_blocks) x = s->as<StageImpl>()->forward(x);
    return head(x);
  }
  nn::ModuleList up_blocks{nullptr};
};

}  // namespace

AutoencoderKLConfig AutoencoderKLConfig::shrunk() const {
  AutoencoderKLConfig c = *this;
  c.block_out_channels = {16, 16, 16, 16};
  c.layers_per_block = 1;
  c.norm_num_groups = 4;
  c.sample_size = 256;
  return c;
}

AutoencoderKLConfig AutoencoderKLConfig::batch_normed() {
  AutoencoderKLConfig c;
  c.latent_channels = 32;
  c.use_quant_conv = c.use_post_quant_conv = true;
  c.scaling_factor = 1, c.shift_factor = 0;
  c.patch = 2, c.batch_norm_eps = 1e-4;
  return c;
}

AutoencoderKLConfig AutoencoderKLConfig::from_json_file(const std::filesystem::path& path) {
  return parse_config_json(
      path, "AutoencoderKL",
      [](const nlohmann::json& j) {
        AutoencoderKLConfig c;
        if (j.value("_class_name", std::string()) == "AutoencoderKLFlux2") {  // its defaults differ
          c = batch_normed();
          const auto patch = j.value("patch_size", std::vector<int64_t>{2, 2});
          if (patch.size() != 2 || patch[0] != patch[1]) throw std::runtime_error("patch_size is not square");
          c.patch = patch[0];
          c.batch_norm_eps = j.value("batch_norm_eps", c.batch_norm_eps);
          c.latent_channels = j.value("latent_channels", c.latent_channels);
          c.block_out_channels = j.value("block_out_channels", c.block_out_channels);
          c.layers_per_block = j.value("layers_per_block", c.layers_per_block);
          c.norm_num_groups = j.value("norm_num_groups", c.norm_num_groups);
          c.use_quant_conv = j.value("use_quant_conv", c.use_quant_conv);
          c.use_post_quant_conv = j.value("use_post_quant_conv", c.use_post_quant_conv);
          c.mid_block_add_attention = j.value("mid_block_add_attention", c.mid_block_add_attention);
          c.sample_size = j.value("sample_size", c.sample_size);
          if (!j.value("decoder_block_out_channels", nlohmann::json()).is_null())
            c.decoder_block_out_channels = j["decoder_block_out_channels"].get<std::vector<int64_t>>();
          if (!c.decoder_block_out_channels.empty() &&
              c.decoder_block_out_channels.size() != c.block_out_channels.size())
            throw std::runtime_error("decoder_block_out_channels needs one width per level");
          return c;
        }
        c.in_channels = j.value("in_channels", c.in_channels);
        c.out_channels = j.value("out_channels", c.out_channels);
        c.latent_channels = j.value("latent_channels", int64_t{4});  // diffusers' default
        c.block_out_channels = j.value("block_out_channels", std::vector<int64_t>{64});
        c.layers_per_block = j.value("layers_per_block", int64_t{1});
        c.norm_num_groups = j.value("norm_num_groups", c.norm_num_groups);
        c.use_quant_conv = j.value("use_quant_conv", true);
        c.use_post_quant_conv = j.value("use_post_quant_conv", true);
        c.mid_block_add_attention = j.value("mid_block_add_attention", true);
        c.scaling_factor = j.value("scaling_factor", 0.18215);
        c.sample_size = j.value("sample_size", int64_t{32});  // diffusers' default
        c.shift_factor =
            j.contains("shift_factor") && !j["shift_factor"].is_null() ? j["shift_factor"].get<double>() : 0.0;
        for (const char* key : {"down_block_types", "up_block_types"})
          for (const auto& t : j.value(key, nlohmann::json::array()))
            if (t != "DownEncoderBlock2D" && t != "UpDecoderBlock2D")
              throw std::runtime_error(std::string(key) + " has " + t.dump() + ", which gclab does not build");
        if (j.value("act_fn", std::string("silu")) != "silu") throw std::runtime_error("act_fn is not silu");
        return c;
      },
      {"AutoencoderKLFlux2"});
}

AutoencoderKLImpl::AutoencoderKLImpl(AutoencoderKLConfig config, const torch::TensorOptions& options)
    : config_(std::move(config)) {
  encoder_ = register_module("encoder", std::make_shared<EncoderImpl>(config_, options));
  decoder_ = register_module("decoder", std::make_shared<DecoderImpl>(config_, options));
  const int64_t z = config_.latent_channels;
  if (config_.use_quant_conv) quant_conv_ = register_module("quant_conv", conv(options, 2 * z, 2 * z, 1));
  if (config_.use_post_quant_conv) post_quant_conv_ = register_module("post_quant_conv", conv(options, z, z, 1));
  if (config_.batch_norm_eps > 0) {  // nn.BatchNorm2d(affine=False)'s statistics, as its state dict holds them
    torch::nn::Module& bn = *register_module("bn", std::make_shared<torch::nn::Module>());
    bn_mean_ = bn.register_buffer("running_mean", torch::zeros({config_.latent_width()}, options));
    bn_var_ = bn.register_buffer("running_var", torch::ones({config_.latent_width()}, options));
    bn.register_buffer("num_batches_tracked", torch::zeros({}, options.dtype(torch::kLong)));
  }
}

torch::Tensor AutoencoderKLImpl::moments(const torch::Tensor& images) {
  torch::Tensor m = static_cast<EncoderImpl&>(*encoder_).forward(images);
  return quant_conv_ ? quant_conv_(m) : m;
}

torch::Tensor AutoencoderKLImpl::encode(const torch::Tensor& images, Posterior posterior,
                                        std::optional<at::Generator> generator) {
  const auto parts = moments(images).chunk(2, 1);
  torch::Tensor z = parts[0];
  if (config_.batch_norm_eps > 0) return normalize(patchify_latents(z));  // FLUX.2: the mean, always
  if (posterior == Posterior::sample) {                                   // DiagonalGaussianDistribution.sample
    const torch::Tensor std = torch::exp(0.5 * parts[1].clamp(-30.0, 20.0));
    // Drawn where the generator lives (a CPU generator for a CUDA autoencoder draws on the host).
    const torch::Device where = generator ? generator->device() : z.device();
    z = z + std * at::randn(z.sizes(), generator, z.options().device(where)).to(z.device());
  }
  return (z - config_.shift_factor) * config_.scaling_factor;
}

torch::Tensor AutoencoderKLImpl::decode_unscaled(const torch::Tensor& z) {
  auto& decoder = static_cast<DecoderImpl&>(*decoder_);
  auto decode_tile = [&](const torch::Tensor& t) {
    return decoder.forward(post_quant_conv_ ? post_quant_conv_(t) : t);
  };
  const TileGrid grid(tile_sample_size_, config_.network_downsampling());
  if (tile_sample_size_ > 0 && grid.tiles(z.size(-2), z.size(-1)))
    return tiled_decode(z, grid, config_.network_downsampling(), decode_tile);
  return decode_tile(z);
}

void AutoencoderKLImpl::enable_tiling(int64_t tile_sample_size) {
  tile_sample_size_ = tile_sample_size > 0 ? tile_sample_size : config_.sample_size;
}

torch::Tensor AutoencoderKLImpl::decode(const torch::Tensor& latents) {
  if (config_.batch_norm_eps > 0) return decode_unscaled(unpatchify_latents(denormalize(latents)));
  return decode_unscaled(latents / config_.scaling_factor + config_.shift_factor);
}

// Flux2Pipeline._patchify_latents / _unpatchify_latents (pipeline_flux2.py:457-470): channel c·p² + i·p + j.
torch::Tensor AutoencoderKLImpl::patchify_latents(const torch::Tensor& z) const {
  const int64_t p = config_.patch, b = z.size(0), c = z.size(1), h = z.size(2), w = z.size(3);
  return z.view({b, c, h / p, p, w / p, p}).permute({0, 1, 3, 5, 2, 4}).reshape({b, c * p * p, h / p, w / p});
}

torch::Tensor AutoencoderKLImpl::unpatchify_latents(const torch::Tensor& z) const {
  const int64_t p = config_.patch, b = z.size(0), c = z.size(1), h = z.size(2), w = z.size(3);
  return z.reshape({b, c / (p * p), p, p, h, w}).permute({0, 1, 4, 2, 5, 3}).reshape({b, c / (p * p), h * p, w * p});
}

// The BatchNorm's statistics in the latents' dtype, as the pipeline casts them (pipeline_flux2.py:613-616).
torch::Tensor AutoencoderKLImpl::normalize(const torch::Tensor& z) const {
  const torch::Tensor mean = bn_mean_.view({1, -1, 1, 1}).to(z.scalar_type());
  const torch::Tensor std = torch::sqrt(bn_var_.view({1, -1, 1, 1}) + config_.batch_norm_eps).to(z.scalar_type());
  return (z - mean) / std;
}

torch::Tensor AutoencoderKLImpl::denormalize(const torch::Tensor& z) const {
  const torch::Tensor mean = bn_mean_.view({1, -1, 1, 1}).to(z.scalar_type());
  const torch::Tensor std = torch::sqrt(bn_var_.view({1, -1, 1, 1}) + config_.batch_norm_eps).to(z.scalar_type());
  return z * std + mean;
}

std::vector<std::string> load_autoencoder_weights(AutoencoderKLImpl& vae, const std::filesystem::path& path) {
  // FLUX.2's latents are normalized by the BatchNorm's statistics: a file without them would leave mean 0 and
  // variance 1 in their place, silently (AI Toolkit's strict load_state_dict refuses it too).
  if (vae.config().batch_norm_eps > 0) {
    const std::filesystem::path file = io::find_weights(
        path, {"diffusion_pytorch_model.safetensors", "diffusion_pytorch_model.safetensors.index.json"});
    if (!file.empty()) {
      // One file's header, or a shard index's weight_map (its tensors mapped, not read).
      const bool single = file.extension() == ".safetensors";
      const std::optional<io::SafetensorsFile> header =
          single ? std::optional<io::SafetensorsFile>(io::SafetensorsFile::open(file)) : std::nullopt;
      const auto stored = single ? std::map<std::string, torch::Tensor>() : io::load_safetensors(file);
      for (const char* name : {"bn.running_mean", "bn.running_var"})
        if (single ? !header->contains(name) : !stored.count(name))
          throw std::runtime_error(file.string() + ": missing " + name +
                                   " (FLUX.2's autoencoder normalizes its latents by these statistics)");
    }
  }
  if (!bfl_autoencoder_file(path)) return load_diffusers_weights(vae, path);
  const auto levels = static_cast<int64_t>(vae.config().block_out_channels.size());
  return io::load_module_weights(vae, path, {}, [&](const std::string& name) {
    return std::vector<std::string>{bfl_autoencoder_name(name, levels)};
  });
}

std::string bfl_autoencoder_name(const std::string& name, int64_t levels) {
  std::vector<std::string> p;  // the dotted parts
  for (size_t at = 0;;) {
    const size_t dot = name.find('.', at);
    p.push_back(name.substr(at, dot == std::string::npos ? std::string::npos : dot - at));
    if (dot == std::string::npos) break;
    at = dot + 1;
  }
  if (p[0] == "quant_conv") p.insert(p.begin(), "encoder");
  if (p[0] == "post_quant_conv") p.insert(p.begin(), "decoder");
  std::vector<std::string> out;
  for (size_t i = 0; i < p.size(); ++i) {
    const std::string& s = p[i];
    const bool has_next = i + 1 < p.size();
    if ((s == "down_blocks" || s == "up_blocks") && has_next) {
      out.push_back(s == "down_blocks" ? "down" : "up");
      out.push_back(s == "down_blocks" ? p[i + 1] : std::to_string(levels - 1 - std::stoll(p[i + 1])));
      ++i;
    } else if (s == "resnets" && has_next && i > 0 && p[i - 1] == "mid_block") {
      out.back() = "mid";
      out.push_back("block_" + std::to_string(std::stoll(p[i + 1]) + 1));
      ++i;
    } else if (s == "resnets") {
      out.push_back("block");
    } else if (s == "attentions" && has_next) {  // mid_block.attentions.0 -> mid.attn_1
      out.back() = "mid";
      out.push_back("attn_1");
      ++i;
    } else if ((s == "downsamplers" || s == "upsamplers") && has_next) {
      out.push_back(s == "downsamplers" ? "downsample" : "upsample");
      ++i;
    } else if (s == "to_out" && has_next) {
      out.push_back("proj_out");
      ++i;
    } else {
      static const std::map<std::string, std::string> renamed = {
          {"group_norm", "norm"},           {"to_q", "q"}, {"to_k", "k"}, {"to_v", "v"}, {"conv_norm_out", "norm_out"},
          {"conv_shortcut", "nin_shortcut"}};
      const auto it = renamed.find(s);
      out.push_back(it == renamed.end() ? s : it->second);
    }
  }
  std::string joined;
  for (const auto& s : out) joined += (joined.empty() ? "" : ".") + s;
  return joined;
}

bool bfl_autoencoder_file(const std::filesystem::path& path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec) || path.extension() != ".safetensors") return false;
  return io::SafetensorsFile::open(path).contains("encoder.down.0.block.0.conv1.weight");
}

AutoencoderKLConfig bfl_autoencoder_config(const AutoencoderKLConfig& preset, const std::filesystem::path& path) {
  const io::SafetensorsFile file = io::SafetensorsFile::open(path);
  const char* first = "decoder.up.0.block.0.conv1.bias";  // the full-resolution level's width
  AutoencoderKLConfig c = preset;
  if (!file.contains(first)) return c;
  const int64_t width = file.entry(first).shape.at(0), base = c.block_out_channels.front();
  if (width == c.decoder_channels().front()) return c;
  c.decoder_block_out_channels.clear();
  for (const int64_t ch : c.block_out_channels) c.decoder_block_out_channels.push_back(ch / base * width);
  return c;
}

std::vector<std::string> load_diffusers_weights(torch::nn::Module& module, const std::filesystem::path& path) {
  return io::load_module_weights(
      module, path, {"diffusion_pytorch_model.safetensors", "diffusion_pytorch_model.safetensors.index.json"});
}

}  // namespace gclab::vae

namespace gclab::vae {

torch::Tensor autoencoder_input(const torch::Tensor& frames, bool video) {
  TORCH_CHECK(frames.dim() == 5, "an autoencoder's input is frames [B, C, F, H, W], got ", frames.sizes());
  if (video) return frames;
  TORCH_CHECK(frames.size(2) == 1, "an image family's sample is one frame, got ", frames.size(2));
  return frames.squeeze(2);
}

torch::Tensor as_frames(const torch::Tensor& decoded) { return decoded.dim() == 4 ? decoded.unsqueeze(2) : decoded; }

}  // namespace gclab::vae
