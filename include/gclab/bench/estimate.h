// `gclab estimate`: the memory a config's training would take, counted from the same Session a run builds
// (on the meta device: no memory) — weights in their real dtype, trained tensors and their gradients,
// optimizer state, EMA, the text encoder — plus, per training resolution and checkpoint policy (off,
// full), the step's batch tensors, the blocks' activations (the activation ledger) and the MLP transients
// of the block being run, beside the cap. What it does not model is listed in `not_modelled`.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "gclab/config/config.h"
#include "gclab/model/spec.h"

namespace gclab::bench {

struct StepEstimate {
  int64_t batch_bytes = 0;       // latents, noise, x_t, target, prediction, text embeddings
  int64_t activation_bytes = 0;  // what the blocks keep for backward (full: inputs + one block recomputed)
  int64_t workspace_bytes = 0;   // the running block's MLP transients: its hidden and that hidden's gradient
  int64_t total_bytes = 0;       // resident + the above
};

struct ResolutionEstimate {
  int resolution = 0;  // square resolution x resolution
  int batch = 0;
  int64_t image_tokens = 0, text_tokens = 0;
  StepEstimate gc_off, gc_full;
};

struct MemoryEstimate {
  model::ModelSpec spec;
  std::string device;
  int64_t weight_bytes = 0;   // every parameter and buffer as stored (frozen base + trained tensors)
  int64_t trained = 0;        // parameters trained
  int64_t trained_bytes = 0;  // their storage (part of weight_bytes)
  int64_t gradient_bytes = 0;
  int64_t optimizer_bytes = 0;
  int64_t ema_bytes = 0;
  int64_t text_encoder_bytes = 0;
  int64_t resident_bytes = 0;  // weights + gradients + optimizer + EMA + text encoder
  int64_t cap_bytes = 0;
  std::string activation_dtype;
  std::vector<ResolutionEstimate> resolutions;
  std::vector<std::string> not_modelled;
};

MemoryEstimate estimate_memory(const config::ProcessConfig& config);

}  // namespace gclab::bench
