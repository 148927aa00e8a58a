// What an AutoencoderKL's encode and decode hold at their peak, predicted from the shapes alone: a walk
// through the network statement by statement as autoencoder_kl.cpp runs it (the same tensors alive at
// once), adding each kernel's own temporaries as measured with the tracking allocator:
//   - a convolution on the CPU (oneDNN) copies its input and its weight into blocked layouts next to its
//     output: peak = output + input + weight bytes above what was live (measured for 1x1 and 3x3 kernels,
//     16 to 512 channels, 32² to 256²); CUDA's cuDNN workspace is not modelled (0);
//   - GroupNorm, SiLU, nearest up-sampling, Linear, adds: their output only;
//   - the mid block's attention (one head as wide as the channels) on the CPU's flash kernel: its output,
//     the log-sum-exp, and per thread a 256 x 512 score block and a 256 x C accumulator (float32).
// The walk counts bytes above what was live before the call (the weights are the caller's), for batch B.
#pragma once

#include <cstdint>

#include "gclab/vae/autoencoder_kl.h"

namespace gclab::vae {

struct AutoencoderMemoryOptions {
  int64_t dtype_bytes = 4;  // the autoencoder's weights and activations (4 float32, 2 bf16)
  bool cpu = true;          // the CPU's convolution copies and attention buffers (false: CUDA)
  int threads = 1;          // CPU threads (the attention kernel's buffers are per thread)
};

// Peak bytes above the live set while decoding scaled latents of an image of height x width (pixels) for
// batch B: the scaled latents' unscaled copy, the decoder's activations, the image. With tiling on
// (`tile_sample_size` > 0, as AutoencoderKL::enable_tiling), the decoder's activations are one tile's, and
// the decoded tiles are held until they are blended.
int64_t predicted_decode_bytes(const AutoencoderKLConfig& config, int64_t batch, int64_t height, int64_t width,
                               const AutoencoderMemoryOptions& options = {}, int64_t tile_sample_size = 0);
// Peak bytes above the live set while encoding images [B, 3, height, width] into scaled latents (a sample
// of the posterior, as training encodes): the encoder's activations, the moments, the sample.
int64_t predicted_encode_bytes(const AutoencoderKLConfig& config, int64_t batch, int64_t height, int64_t width,
                               const AutoencoderMemoryOptions& options = {});
// The autoencoder's parameter bytes in that dtype.
int64_t autoencoder_weight_bytes(const AutoencoderKLConfig& config, int64_t dtype_bytes);

}  // namespace gclab::vae
