// What `gclab check` says about the model a config selects: the preset, exact parameter counts from a
// meta-device build (no memory), the weight bytes in the storage the config asks for, and the token
// counts the transformer will see at each training resolution and for the previews.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "gclab/config/config.h"
#include "gclab/model/spec.h"

namespace gclab::model {

struct TokenCount {
  std::string what;  // "datasets[0] 1024x1024", "sample 1024x1024"
  int64_t width = 0, height = 0;
  int64_t image_tokens = 0, text_tokens = 0, reference_tokens = 0;
};

struct ModelSummary {
  ModelSpec spec;
  int64_t parameters = 0;            // the transformer's, LoRA adapters excluded
  int64_t trainable_parameters = 0;  // LoRA adapters, or every parameter without a network
  int lora_modules = 0;
  int64_t weight_bytes = 0;  // base weights as stored: bf16, or float8 blocks with model.quantize
  std::string weight_storage;
  std::string weights_from;  // the weights file of a local folder, or "random" (why, in words)
  std::vector<TokenCount> tokens;
};

// Builds the model on the meta device as the config describes it (LoRA, quantize) and counts.
ModelSummary summarize_model(const config::ProcessConfig& config);

}  // namespace gclab::model
