#include "gclab/vae/codec.h"

#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <cstring>

#include "gclab/memory/meta_count.h"
#include "gclab/memory/placement.h"
#include "gclab/vae/dct_codec.h"
#include "gclab/vae/memory.h"

namespace gclab::vae {

namespace {

c10::ScalarType dtype_of(const CodecSpec& spec) { return spec.dtype_bytes == 2 ? torch::kBFloat16 : torch::kFloat; }

AutoencoderMemoryOptions memory_options(const CodecSpec& spec, bool cpu) { return {dtype_of(spec), cpu, spec.video}; }

template <class... F>
struct Overloaded : F... {
  using F::operator()...;
};
template <class... F>
Overloaded(F...) -> Overloaded<F...>;

// The family's autoencoder on the run's device, in the run's dtype.
class AutoencoderCodec : public ImageCodec {
 public:
  AutoencoderCodec(const CodecSpec& spec, torch::Device device, uint64_t seed)
      : ImageCodec(spec), device_(device), seed_(seed), generator_(at::make_generator<at::CPUGeneratorImpl>(seed)) {
    dtype_ = dtype_of(spec);
    const auto options = device_.is_meta() ? torch::TensorOptions(device_).dtype(dtype_) : torch::TensorOptions();
    vae_ = build_autoencoder(*spec.autoencoder, spec.weights, options).vae;
    vae_->to(device_, dtype_);
    vae_->eval();
    for (auto& p : vae_->parameters()) p.set_requires_grad(false);
    if (spec.tile_sample_size > 0) vae_->enable_tiling(spec.tile_sample_size);
  }

  torch::Tensor encode(const torch::Tensor& images, uint64_t draw) override {
    generator_.set_current_seed(seed_ ^ (draw * 0x9E3779B97F4A7C15ull));
    return encode_as(images, Posterior::sample);
  }
  torch::Tensor encode_mean(const torch::Tensor& images) override { return encode_as(images, Posterior::mean); }
  torch::Tensor decode(const torch::Tensor& latents) override {
    torch::NoGradGuard no_grad;
    return as_frames(vae_->decode(latents.to(device_, dtype_))).to(torch::kFloat);
  }
  bool encodes_on_loader_thread() const override { return false; }

  void offload() override {
    if (offloaded()) return;
    torch::NoGradGuard no_grad;
    for (auto& p : vae_->parameters()) {
      std::vector<char> bytes;
      if (!device_.is_meta()) {
        const torch::Tensor host = p.detach().to(torch::kCPU).contiguous();
        bytes.resize(host.nbytes());
        std::memcpy(bytes.data(), host.data_ptr(), bytes.size());
      }
      host_.push_back({std::move(bytes), p.sizes().vec()});
      p.set_data(torch::empty({0}, p.options()));
    }
  }
  void restore() override {
    if (!offloaded()) return;
    torch::NoGradGuard no_grad;
    size_t i = 0;
    for (auto& p : vae_->parameters()) {
      auto& [bytes, shape] = host_[i++];
      p.set_data(device_.is_meta() ? torch::empty(shape, p.options())
                                   : torch::from_blob(bytes.data(), shape, torch::TensorOptions().dtype(dtype_))
                                         .to(device_, dtype_, /*non_blocking=*/false, /*copy=*/true));
    }
    host_.clear();
  }
  bool offloaded() const override { return !host_.empty(); }
  int64_t resident_bytes() const override {
    int64_t n = 0;
    for (const auto& p : vae_->parameters()) n += static_cast<int64_t>(p.nbytes());
    return n;
  }

 private:
  // The frames in the autoencoder's dtype on its device, encoded to the posterior's sample or mean, float32.
  torch::Tensor encode_as(const torch::Tensor& images, Posterior posterior) {
    restore();  // AI Toolkit's encode_images brings an offloaded VAE back, and leaves it there
    torch::NoGradGuard no_grad;
    return vae_
        ->encode(memory::to_device(autoencoder_input(images, spec_.video), device_, dtype_), posterior, generator_)
        .to(torch::kFloat);
  }
  torch::Device device_;
  uint64_t seed_;
  at::Generator generator_;
  torch::ScalarType dtype_ = torch::kFloat;
  std::shared_ptr<AutoencoderBase> vae_;
  // Offloaded weights: plain host buffers, outside LibTorch's allocators (so outside the CPU meter too).
  struct HostCopy {
    std::vector<char> bytes;
    std::vector<int64_t> shape;
  };
  std::vector<HostCopy> host_;
};

}  // namespace

int64_t latent_channels(const AutoencoderConfig& config) {
  return std::visit(Overloaded{[](const AutoencoderKLConfig& c) { return c.latent_width(); },
                               [](const QwenImageVaeConfig& c) { return c.z_dim; }},
                    config);
}

int64_t downsampling(const AutoencoderConfig& config) {
  return std::visit([](const auto& c) { return c.downsampling(); }, config);
}

int64_t temporal_downsampling(const AutoencoderConfig& config) {
  return std::visit(Overloaded{[](const AutoencoderKLConfig&) -> int64_t { return 1; },
                               [](const QwenImageVaeConfig& c) { return c.temporal_downsampling(); }},
                    config);
}

const char* class_name(const AutoencoderConfig& config) {
  if (const auto* kl = std::get_if<AutoencoderKLConfig>(&config))
    return kl->batch_norm_eps > 0 ? "AutoencoderKLFlux2" : "AutoencoderKL";
  // diffusers' AutoencoderKLWan where its tiled decode's clamp says so (the Wan VAEs), else Qwen-Image's class.
  return std::get<QwenImageVaeConfig>(config).clamps_tiles ? "AutoencoderKLWan" : "AutoencoderKLQwenImage";
}

AutoencoderConfig autoencoder_config(const AutoencoderConfig& fallback, const std::filesystem::path& weights) {
  std::error_code ec;
  const std::filesystem::path json = weights / "config.json";
  if (const auto* kl = std::get_if<AutoencoderKLConfig>(&fallback); kl && bfl_autoencoder_file(weights))
    return bfl_autoencoder_config(*kl, weights);  // BFL's ae.safetensors: the decoder's widths from its tensors
  if (weights.empty() || !std::filesystem::is_regular_file(json, ec)) return fallback;
  return std::visit(
      Overloaded{
          [&](const AutoencoderKLConfig&) -> AutoencoderConfig { return AutoencoderKLConfig::from_json_file(json); },
          [&](const QwenImageVaeConfig&) -> AutoencoderConfig { return QwenImageVaeConfig::from_json_file(json); }},
      fallback);
}

bool holds_weights(const std::filesystem::path& weights) {
  std::error_code ec;
  if (weights.empty()) return false;
  if (!std::filesystem::is_directory(weights, ec)) return true;
  for (const char* file : {"diffusion_pytorch_model.safetensors", "diffusion_pytorch_model.safetensors.index.json"})
    if (std::filesystem::exists(weights / file, ec)) return true;
  return false;
}

LoadedAutoencoder build_autoencoder(const AutoencoderConfig& config, const std::filesystem::path& weights,
                                    const torch::TensorOptions& options) {
  LoadedAutoencoder out;
  out.vae = std::visit(Overloaded{[&](const AutoencoderKLConfig& c) -> std::shared_ptr<AutoencoderBase> {
                                    return std::make_shared<AutoencoderKLImpl>(c, options);
                                  },
                                  [&](const QwenImageVaeConfig& c) -> std::shared_ptr<AutoencoderBase> {
                                    return std::make_shared<QwenImageVaeImpl>(c, options);
                                  }},
                       config);
  out.random = !holds_weights(weights);
  if (!out.random && !options.device().is_meta()) {
    auto* kl = dynamic_cast<AutoencoderKLImpl*>(out.vae.get());  // a BFL-layout file read by its own names
    out.unused = kl ? load_autoencoder_weights(*kl, weights) : load_diffusers_weights(*out.vae, weights);
  }
  return out;
}

int64_t CodecSpec::weight_bytes() const {
  return autoencoder
             ? std::visit([&](const auto& c) { return autoencoder_weight_bytes(c, dtype_of(*this)); }, *autoencoder)
             : 0;
}

int64_t CodecSpec::decode_bytes(const model::SampleShape& s, bool cpu) const {
  if (autoencoder)
    return std::visit(
        [&](const auto& c) { return predicted_decode_bytes(c, s, memory_options(*this, cpu), tile_sample_size); },
        *autoencoder);
  // The stand-in's own decode, walked (one frame).
  DctCodec dct(latent_channels, torch::kMeta, downsampling);
  const torch::Tensor z = torch::empty({s.batch, latent_channels, s.height / downsampling, s.width / downsampling},
                                       torch::TensorOptions().device(torch::kMeta).dtype(torch::kFloat));
  return memory::inference_peak(cpu ? c10::kCPU : c10::kCUDA, [&] { dct.decode(z); });
}

int64_t CodecSpec::encode_bytes(const model::SampleShape& s, bool cpu) const {
  if (autoencoder)
    return std::visit([&](const auto& c) { return predicted_encode_bytes(c, s, memory_options(*this, cpu)); },
                      *autoencoder);
  // The stand-in's own encode, walked (one frame), above its float32 frames as the autoencoders' are.
  DctCodec dct(latent_channels, torch::kMeta, downsampling);
  const torch::Tensor frames = torch::empty({s.batch, 3, 1, s.height, s.width},
                                            torch::TensorOptions().device(torch::kMeta).dtype(torch::kFloat));
  return memory::inference_peak(cpu ? c10::kCPU : c10::kCUDA, [&] { dct.encode(frames); });
}

std::string CodecSpec::describe() const {
  if (!autoencoder) return "the DCT stand-in (" + std::to_string(latent_channels) + " latent channels, no weights)";
  const int64_t params = weight_bytes() / dtype_bytes;
  std::string s = std::string("an ") + class_name(*autoencoder) + " (" +
                  std::to_string(vae::latent_channels(*autoencoder)) + " latent channels, " + std::to_string(params) +
                  " parameters, " +
                  (holds_weights(weights) ? "weights from " + weights.string()
                   : weights.empty()      ? std::string("random weights")
                                          : "random weights at the shape of " + weights.string()) +
                  ")";
  if (tile_sample_size > 0) s += ", previews decoded in " + std::to_string(tile_sample_size) + "-pixel tiles";
  return s;
}

std::unique_ptr<ImageCodec> build_codec(const CodecSpec& spec, torch::Device device, uint64_t seed) {
  if (!spec.autoencoder)
    return std::make_unique<DctCodec>(spec.latent_channels, device.is_meta() ? device : torch::kCPU, spec.downsampling);
  return std::make_unique<AutoencoderCodec>(spec, device, seed);
}

}  // namespace gclab::vae
