#include "gclab/vae/memory.h"

#include "gclab/memory/meta_count.h"

namespace gclab::vae {

namespace {

torch::TensorOptions meta_options(c10::ScalarType dtype) {
  return torch::TensorOptions().device(torch::kMeta).dtype(dtype);
}

template <class Vae, class Config>
Vae meta_vae(const Config& config, c10::ScalarType dtype) {
  return Vae(config, meta_options(dtype));
}

// The peak of `run` (the network's own code) above what was live when it started, walked on meta for the
// options' device.
template <class Run>
int64_t walk(const AutoencoderMemoryOptions& o, Run&& run) {
  torch::NoGradGuard no_grad;
  memory::MetaCount count(o.cpu ? c10::kCPU : c10::kCUDA);
  run();
  return count.peak();
}

int64_t decode_bytes(AutoencoderBase& vae, int64_t batch, int64_t height, int64_t width,
                     const AutoencoderMemoryOptions& o, int64_t tile_sample_size) {
  if (tile_sample_size > 0) vae.enable_tiling(tile_sample_size);
  const int64_t f = vae.downsampling();
  const torch::Tensor z = torch::empty({batch, vae.latent_channels(), height / f, width / f}, meta_options(o.dtype));
  return walk(o, [&] { vae.decode(z); });
}

int64_t encode_bytes(AutoencoderBase& vae, int64_t batch, int64_t height, int64_t width,
                     const AutoencoderMemoryOptions& o) {
  const torch::Tensor x = torch::empty({batch, vae.image_channels(), height, width}, meta_options(o.dtype));
  return walk(o, [&] { vae.encode(x, Posterior::sample); });
}

int64_t parameter_bytes(const torch::nn::Module& vae) {
  int64_t n = 0;
  for (const auto& p : vae.parameters()) n += static_cast<int64_t>(p.nbytes());
  return n;
}

}  // namespace

int64_t predicted_decode_bytes(const AutoencoderKLConfig& c, int64_t batch, int64_t height, int64_t width,
                               const AutoencoderMemoryOptions& o, int64_t tile_sample_size) {
  return decode_bytes(*meta_vae<AutoencoderKL>(c, o.dtype), batch, height, width, o, tile_sample_size);
}

int64_t predicted_decode_bytes(const QwenImageVaeConfig& c, int64_t batch, int64_t height, int64_t width,
                               const AutoencoderMemoryOptions& o, int64_t tile_sample_size) {
  return decode_bytes(*meta_vae<QwenImageVae>(c, o.dtype), batch, height, width, o, tile_sample_size);
}

int64_t predicted_encode_bytes(const AutoencoderKLConfig& c, int64_t batch, int64_t height, int64_t width,
                               const AutoencoderMemoryOptions& o) {
  return encode_bytes(*meta_vae<AutoencoderKL>(c, o.dtype), batch, height, width, o);
}

int64_t predicted_encode_bytes(const QwenImageVaeConfig& c, int64_t batch, int64_t height, int64_t width,
                               const AutoencoderMemoryOptions& o) {
  return encode_bytes(*meta_vae<QwenImageVae>(c, o.dtype), batch, height, width, o);
}

int64_t autoencoder_weight_bytes(const AutoencoderKLConfig& c, c10::ScalarType dtype) {
  return parameter_bytes(*meta_vae<AutoencoderKL>(c, dtype));
}

int64_t autoencoder_weight_bytes(const QwenImageVaeConfig& c, c10::ScalarType dtype) {
  return parameter_bytes(*meta_vae<QwenImageVae>(c, dtype));
}

}  // namespace gclab::vae
