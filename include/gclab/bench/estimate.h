// `gclab estimate`: the memory a config's training would take, predicted from shapes alone — weights in
// their storage, trained parameters and their gradients, optimizer state, and the blocks' activations
// (the activation ledger) with checkpointing off and full, per training resolution — beside the cap.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "gclab/config/config.h"
#include "gclab/model/spec.h"

namespace gclab::bench {

struct ResolutionEstimate {
  int resolution = 0;  // square resolution x resolution
  int batch = 0;
  int64_t image_tokens = 0, text_tokens = 0;
  int64_t activations_off = 0;   // every block's saved activations
  int64_t activations_full = 0;  // every block's inputs + one block's activations during its recompute
  int64_t total_off = 0, total_full = 0;
};

struct MemoryEstimate {
  model::ModelSpec spec;
  int64_t weight_bytes = 0;     // base weights as stored (bf16, or float8 blocks with quantize)
  int64_t trainable = 0;        // parameters trained
  int64_t trainable_bytes = 0;  // their own storage when separate from the weights (LoRA adapters, fp32)
  int64_t gradient_bytes = 0;
  int64_t optimizer_bytes = 0;
  int64_t fixed_bytes = 0;      // weights + trainable + gradients + optimizer
  int64_t cap_bytes = 0;
  std::string activation_dtype;
  std::vector<ResolutionEstimate> resolutions;
};

MemoryEstimate estimate_memory(const config::ProcessConfig& config);

}  // namespace gclab::bench
