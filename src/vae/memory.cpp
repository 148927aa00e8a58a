#include "gclab/vae/memory.h"

#include "gclab/memory/meta_count.h"
#include "gclab/nn/layers.h"

namespace gclab::vae {

namespace {

torch::TensorOptions meta_options(c10::ScalarType dtype) {
  return torch::TensorOptions().device(torch::kMeta).dtype(dtype);
}

// The device kind whose kernels the walk stands for.
c10::DeviceType target(const AutoencoderMemoryOptions& o) { return o.cpu ? c10::kCPU : c10::kCUDA; }

int64_t decode_bytes(AutoencoderBase& vae, const model::SampleShape& s, const AutoencoderMemoryOptions& o,
                     int64_t tile_sample_size) {
  if (tile_sample_size > 0) vae.enable_tiling(tile_sample_size);
  const int64_t f = vae.downsampling();
  std::vector<int64_t> z{s.batch, vae.latent_channels()};
  if (o.video) z.push_back(1 + (s.frames - 1) / vae.temporal_downsampling());
  z.insert(z.end(), {s.height / f, s.width / f});
  const torch::Tensor latents = torch::empty(z, meta_options(o.dtype));
  return memory::inference_peak(target(o), [&] { vae.decode(latents); });
}

int64_t encode_bytes(AutoencoderBase& vae, const model::SampleShape& s, const AutoencoderMemoryOptions& o) {
  const torch::Tensor x = autoencoder_input(
      torch::empty({s.batch, vae.image_channels(), s.frames, s.height, s.width}, meta_options(o.dtype)), o.video);
  return memory::inference_peak(target(o), [&] { vae.encode(x, Posterior::sample); });
}

}  // namespace

int64_t predicted_decode_bytes(const AutoencoderKLConfig& c, const model::SampleShape& s,
                               const AutoencoderMemoryOptions& o, int64_t tile_sample_size) {
  return decode_bytes(*AutoencoderKL(c, meta_options(o.dtype)), s, o, tile_sample_size);
}

int64_t predicted_decode_bytes(const QwenImageVaeConfig& c, const model::SampleShape& s,
                               const AutoencoderMemoryOptions& o, int64_t tile_sample_size) {
  return decode_bytes(*QwenImageVae(c, meta_options(o.dtype)), s, o, tile_sample_size);
}

int64_t predicted_encode_bytes(const AutoencoderKLConfig& c, const model::SampleShape& s,
                               const AutoencoderMemoryOptions& o) {
  return encode_bytes(*AutoencoderKL(c, meta_options(o.dtype)), s, o);
}

int64_t predicted_encode_bytes(const QwenImageVaeConfig& c, const model::SampleShape& s,
                               const AutoencoderMemoryOptions& o) {
  return encode_bytes(*QwenImageVae(c, meta_options(o.dtype)), s, o);
}

int64_t autoencoder_weight_bytes(const AutoencoderKLConfig& c, c10::ScalarType dtype) {
  return gclab::nn::module_bytes(*AutoencoderKL(c, meta_options(dtype)));
}

int64_t autoencoder_weight_bytes(const QwenImageVaeConfig& c, c10::ScalarType dtype) {
  return gclab::nn::module_bytes(*QwenImageVae(c, meta_options(dtype)));
}

}  // namespace gclab::vae
