// What an AutoencoderKL's encode and decode hold at their peak, predicted from the shapes alone: a walk
// through the network statement by statement as autoencoder_kl.cpp runs it (the same tensors alive at
// once), adding each kernel's own temporaries as measured with the tracking allocator:
//   - a 3x3 convolution on the CPU (oneDNN) works in a blocked layout of 16 channels (AVX-512; 8 with AVX2):
//     an input of at least a block is copied into it (padded) beside a copy of the weight, and an output
//     whose channels do not fill whole blocks is computed padded and reordered; a narrower input is read as
//     it is, the output computed blocked and reordered (measured for 3 to 512 channels, 32² to 256²).
//     A 1x1 convolution holds only its output. CUDA's cuDNN workspace is not modelled (0). Measured exact
//     (within 1%) when every stage's channels fill whole blocks — the real autoencoders (128 to 512) and
//     gclab's tiny one (16); a network of 8/24 channels measured 15% more than the walk predicts;
//   - GroupNorm, SiLU, nearest up-sampling, Linear, adds: their output only;
//   - the mid block's attention (one head as wide as the channels) on the CPU's flash kernel: its output,
//     the log-sum-exp and per thread its score block and accumulator (memory/live_set.h).
// The walk counts bytes above what was live before the call (the weights are the caller's), for batch B.
#pragma once

#include <cstdint>

#include "gclab/vae/autoencoder_kl.h"
#include "gclab/vae/qwen_image_vae.h"

namespace gclab::vae {

struct AutoencoderMemoryOptions {
  int64_t dtype_bytes = 4;  // the autoencoder's weights and activations (4 float32, 2 bf16)
  bool cpu = true;          // the CPU's convolution copies and attention buffers (false: CUDA)
  int threads = 1;          // CPU threads (the attention kernel's buffers are per thread)
  int channel_block = 16;   // oneDNN's blocked layout: cpu_channel_block()
  // A bf16 convolution on the CPU without oneDNN's bf16 support (no AVX-512 BW/VL/DQ: PyTorch's
  // mkldnn_bf16_device_check) runs slow_conv2d: the whole batch's im2col columns, B x C_in x k^2 x the
  // output's pixels, beside its output (measured: 16 and 32 channels, batch 1 and 2, 1x1 none).
  bool bf16_im2col = false;
};

// oneDNN's channel block on this CPU: 16 with AVX-512, else 8.
int cpu_channel_block();
// Whether this CPU's bf16 convolutions take the im2col path (AutoencoderMemoryOptions::bf16_im2col).
bool cpu_bf16_im2col();

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

// The same for Qwen-Image's AutoencoderKLQwenImage on images (one frame), walked as qwen_image_vae.cpp runs
// it: each causal 3-D convolution pads its input (two zero frames in front) into a new tensor and keeps the
// input's frame in the chunk cache until the encode / decode returns (so the cache grows through the
// network, as diffusers' feat_cache does); on the CPU a 3x3x3 convolution in float32 runs PyTorch's
// slow_conv3d, whose columns (input channels x 27 x output positions) sit beside its output; the 2-D
// convolutions of the resamplers follow oneDNN's rule above. Tiled decoding: tiles of tile_sample_size with
// a stride of three quarters, each with its own cache, kept until they are blended.
int64_t predicted_decode_bytes(const QwenImageVaeConfig& config, int64_t batch, int64_t height, int64_t width,
                               const AutoencoderMemoryOptions& options = {}, int64_t tile_sample_size = 0);
int64_t predicted_encode_bytes(const QwenImageVaeConfig& config, int64_t batch, int64_t height, int64_t width,
                               const AutoencoderMemoryOptions& options = {});
int64_t autoencoder_weight_bytes(const QwenImageVaeConfig& config, int64_t dtype_bytes);

}  // namespace gclab::vae
