// What a text encoder's encode holds at its peak, predicted from its config alone: a walk through the
// encoder statement by statement as clip.cpp, t5.cpp, qwen_lm.cpp and qwen_vision.cpp run it, the same
// tensors alive at once (a C++ expression's temporaries live until its end), with each kernel's own
// temporaries:
//   - attention on the CPU: PyTorch's flash kernel (memory/live_set.h), its output in the inputs' dtype;
//     on CUDA its output and log-sum-exp (the memory-efficient kernel's workspace is not modelled);
//   - LayerNorm: its output and the float32 mean and inverse deviation per row; RMSNorm / T5's norm: the
//     float32 square and the normalised rows in float32 beside the output (in a half dtype, the input's
//     float32 copy too);
//   - a quantized Linear (quantize_te): its weight dequantized to the compute dtype for the matmul (with the
//     dequantization's own copy), freed after it.
// The bytes are above what was live before the call (the weights and the caller's token ids are not
// counted), for `batch` inputs of `tokens` ids; what the pipeline keeps of the output is included.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "gclab/text/clip.h"
#include "gclab/text/qwen_lm.h"
#include "gclab/text/qwen_vision.h"
#include "gclab/text/t5.h"

namespace gclab::text {

struct EncodeMemoryOptions {
  int64_t dtype_bytes = 4;         // the encoder's compute dtype (4 float32, 2 bf16)
  bool cpu = true;                 // the CPU's attention kernel (false: CUDA)
  int threads = 1;                 // CPU threads (the attention kernel's buffers are per thread)
  bool quantized_linears = false;  // quantize_te: every Linear dequantizes its weight per call
};

// One image through Qwen2.5-VL's vision tower: its grid of patches (after the processor's resize).
struct VisionGrid {
  int64_t rows = 0, columns = 0;
};

int64_t predicted_encode_bytes(const ClipTextConfig& config, int64_t batch, int64_t tokens, bool masked,
                               const EncodeMemoryOptions& options = {});
int64_t predicted_encode_bytes(const T5Config& config, int64_t batch, int64_t tokens, bool masked,
                               const EncodeMemoryOptions& options = {});
// The language model on `tokens` ids; with `images`, Qwen2_5_VLModel's path: the tower (`vision`, else the
// config's) on them (their patches as the processor gives them, alive through the encode), its tokens
// scattered into the embeddings, the multimodal positions.
int64_t predicted_encode_bytes(const QwenLmConfig& config, int64_t batch, int64_t tokens, bool masked,
                               const EncodeMemoryOptions& options = {}, const std::vector<VisionGrid>& images = {},
                               const QwenVisionConfig* vision = nullptr);
// The vision tower's forward alone on the images' patches (the patches are the caller's).
int64_t predicted_vision_bytes(const QwenVisionConfig& config, const std::vector<VisionGrid>& images,
                               const EncodeMemoryOptions& options = {});

}  // namespace gclab::text
