#include "gclab/bench/estimate.h"

#include <algorithm>
#include <set>

#include "gclab/model/activations.h"
#include "gclab/model/summary.h"

namespace gclab::bench {

MemoryEstimate estimate_memory(const config::ProcessConfig& config) {
  MemoryEstimate e;
  const model::ModelSummary summary = model::summarize_model(config);
  e.spec = summary.spec;
  e.weight_bytes = summary.weight_bytes;
  e.trainable = summary.trainable_parameters;
  e.cap_bytes = config.vram_cap.bytes;
  const bool bf16 = config.train.dtype == "bf16";
  e.activation_dtype = bf16 ? "bf16" : "fp32";
  if (config.network) {
    // Adapters in float32 with float32 gradients (AI Toolkit keeps LoRA weights in float32).
    e.trainable_bytes = 4 * e.trainable;
    e.gradient_bytes = 4 * e.trainable;
  } else {
    e.gradient_bytes = 2 * e.trainable;  // gradients in the weights' bf16
  }
  // AdamW: two float32 moments; the 8-bit variant one byte each plus a float32 scale per 256 values.
  e.optimizer_bytes = config.train.optimizer == "adamw8bit" ? 2 * e.trainable + 8 * ((e.trainable + 255) / 256)
                                                            : 8 * e.trainable;
  e.fixed_bytes = e.weight_bytes + e.trainable_bytes + e.gradient_bytes + e.optimizer_bytes;

  model::ActivationOptions o;
  o.element_bytes = bf16 ? 2 : 4;
  o.lora_rank = config.network ? config.network->linear.value_or(16) : 0;
  o.conditioning_grad = !config.network;
  std::set<std::pair<int, int>> seen;
  for (const auto& d : config.datasets)
    for (int r : d.resolution) {
      const int batch = d.batch_size.value_or(config.train.batch_size);
      if (!seen.insert({r, batch}).second) continue;
      const auto a = model::estimate_activations(e.spec, batch, r, r, 0, o);
      ResolutionEstimate re;
      re.resolution = r;
      re.batch = batch;
      re.image_tokens = a.image_tokens;
      re.text_tokens = a.text_tokens;
      re.activations_off = a.total_off_bytes;
      re.activations_full = a.full_with_recompute_bytes;
      re.total_off = e.fixed_bytes + re.activations_off;
      re.total_full = e.fixed_bytes + re.activations_full;
      e.resolutions.push_back(re);
    }
  std::sort(e.resolutions.begin(), e.resolutions.end(),
            [](const ResolutionEstimate& a, const ResolutionEstimate& b) { return a.resolution < b.resolution; });
  return e;
}

}  // namespace gclab::bench
