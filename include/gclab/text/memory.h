// What a text encoder's encode holds at its peak, predicted from its config alone: the encoder's own
// forward walked on the meta device under a memory::MetaCount, as the step's walk is (train/predict.h) —
// every tensor its code makes, alive as long as it is, with the kernels' own allocations from the one set of
// meta kernels (nn/meta_kernels.h: the fused attention per device, LayerNorm, embeddings) and a quantized
// Linear's dequantized weight from its own run path (nn/layers.h).
// The bytes are above what was live before the call (the weights and the caller's token ids are not
// counted), for `batch` inputs of `tokens` ids; what the encoder returns is included. A whole prompt's encode
// (the slots in turn, an edit model's control images, the composition) is walked by
// PromptEncoder::predict_encode (text/prompt.h) on the encoders' meta twins.
#pragma once

#include <c10/core/ScalarType.h>

#include <cstdint>
#include <vector>

#include "gclab/text/clip.h"
#include "gclab/text/qwen_lm.h"
#include "gclab/text/qwen_vision.h"
#include "gclab/text/t5.h"

namespace gclab::text {

struct EncodeMemoryOptions {
  c10::ScalarType dtype = c10::kFloat;  // the encoder's compute dtype
  bool cpu = true;                      // the CPU's kernels (false: CUDA's)
  bool quantized_linears = false;       // quantize_te: every Linear is qfloat8 and dequantizes per call
};

// One image through Qwen2.5-VL's vision tower: its grid of patches (after the processor's resize).
struct VisionGrid {
  int64_t rows = 0, columns = 0;
};

int64_t predicted_encode_bytes(const ClipTextConfig& config, int64_t batch, int64_t tokens, bool masked,
                               const EncodeMemoryOptions& options = {});
int64_t predicted_encode_bytes(const T5Config& config, int64_t batch, int64_t tokens, bool masked,
                               const EncodeMemoryOptions& options = {});
int64_t predicted_encode_bytes(const QwenLmConfig& config, int64_t batch, int64_t tokens, bool masked,
                               const EncodeMemoryOptions& options = {});
// The vision tower's forward alone on the images' patches (the patches are the caller's).
int64_t predicted_vision_bytes(const QwenVisionConfig& config, const std::vector<VisionGrid>& images,
                               const EncodeMemoryOptions& options = {});

}  // namespace gclab::text
