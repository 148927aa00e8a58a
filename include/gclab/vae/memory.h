// What an autoencoder's encode and decode hold at their peak, walked: the network (AutoencoderKL or
// Qwen-Image's AutoencoderKLQwenImage) is built on the meta device and its own encode / decode runs there
// under a memory::MetaCount, so every tensor the code makes is counted as it lives and dies; the kernels
// without a meta implementation in LibTorch's C++ allocate what the device's would (nn/meta_kernels.h):
// the convolutions with the CPU's temporaries (oneDNN's blocked copies or the slow kernels' im2col
// columns: memory::cpu_convolution_temporaries), GroupNorm, the mid blocks' attention (the CPU's flash
// kernel's per-thread blocks). The walk counts bytes above what was live before the call (the weights are
// the caller's), on the device kind and in the dtype the options say, at this process's thread count.
#pragma once

#include <c10/core/ScalarType.h>

#include <cstdint>

#include "gclab/model/sample_shape.h"
#include "gclab/vae/autoencoder_kl.h"
#include "gclab/vae/qwen_image_vae.h"

namespace gclab::vae {

struct AutoencoderMemoryOptions {
  c10::ScalarType dtype = c10::kFloat;  // the autoencoder's weights and activations
  bool cpu = true;                      // the CPU's kernels (false: CUDA's)
  bool video = false;                   // the family's latents carry frames (vae::autoencoder_input)
};

// Peak bytes above the live set while decoding the scaled latents of samples of `shape` (pixels) as
// AutoencoderBase::decode runs (tiled as enable_tiling(tile_sample_size) when that is above 0).
int64_t predicted_decode_bytes(const AutoencoderKLConfig& config, const model::SampleShape& shape,
                               const AutoencoderMemoryOptions& options = {}, int64_t tile_sample_size = 0);
int64_t predicted_decode_bytes(const QwenImageVaeConfig& config, const model::SampleShape& shape,
                               const AutoencoderMemoryOptions& options = {}, int64_t tile_sample_size = 0);
// Peak bytes above the live set while encoding samples of `shape` (autoencoder_input of their frames) into
// scaled latents (a sample of the posterior, as training encodes).
int64_t predicted_encode_bytes(const AutoencoderKLConfig& config, const model::SampleShape& shape,
                               const AutoencoderMemoryOptions& options = {});
int64_t predicted_encode_bytes(const QwenImageVaeConfig& config, const model::SampleShape& shape,
                               const AutoencoderMemoryOptions& options = {});
// The autoencoder's parameter bytes in `dtype`: the meta network's.
int64_t autoencoder_weight_bytes(const AutoencoderKLConfig& config, c10::ScalarType dtype);
int64_t autoencoder_weight_bytes(const QwenImageVaeConfig& config, c10::ScalarType dtype);

}  // namespace gclab::vae
