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

int64_t decode_bytes(AutoencoderBase& vae, int64_t batch, int64_t height, int64_t width,
                     const AutoencoderMemoryOptions& o, int64_t tile_sample_size) {
  if (tile_sample_size > 0) vae.enable_tiling(tile_sample_size);
  const int64_t f = vae.downsampling();
  const torch::Tensor z = torch::empty({batch, vae.latent_channels(), height / f, width / f}, meta_options(o.dtype));
  return memory::inference_peak(target(o), [&] { vae.decode(z); });
}

int64_t encode_bytes(AutoencoderBase& vae, int64_t batch, int64_t height, int64_t width,
                     const AutoencoderMemoryOptions& o) {
  const torch::Tensor x = torch::empty({batch, vae.image_channels(), height, width}, meta_options(o.dtype));
  return memory::inference_peak(target(o), [&] { vae.encode(x, Posterior::sample); });
}

}  // namespace

int64_t predicted_decode_bytes(const AutoencoderKLConfig& c, int64_t batch, int64_t height, int64_t width,
                               const AutoencoderMemoryOptions& o, int64_t tile_sample_size) {
  return decode_bytes(*AutoencoderKL(c, meta_options(o.dtype)), batch, height, width, o, tile_sample_size);
}

int64_t predicted_decode_bytes(const QwenImageVaeConfig& c, int64_t batch, int64_t height, int64_t width,
                               const AutoencoderMemoryOptions& o, int64_t tile_sample_size) {
  return decode_bytes(*QwenImageVae(c, meta_options(o.dtype)), batch, height, width, o, tile_sample_size);
}

int64_t predicted_encode_bytes(const AutoencoderKLConfig& c, int64_t batch, int64_t height, int64_t width,
                               const AutoencoderMemoryOptions& o) {
  return encode_bytes(*AutoencoderKL(c, meta_options(o.dtype)), batch, height, width, o);
}

int64_t predicted_encode_bytes(const QwenImageVaeConfig& c, int64_t batch, int64_t height, int64_t width,
                               const AutoencoderMemoryOptions& o) {
  return encode_bytes(*QwenImageVae(c, meta_options(o.dtype)), batch, height, width, o);
}

int64_t autoencoder_weight_bytes(const AutoencoderKLConfig& c, c10::ScalarType dtype) {
  return gclab::nn::module_bytes(*AutoencoderKL(c, meta_options(dtype)));
}

int64_t autoencoder_weight_bytes(const QwenImageVaeConfig& c, c10::ScalarType dtype) {
  return gclab::nn::module_bytes(*QwenImageVae(c, meta_options(dtype)));
}

}  // namespace gclab::vae
