#include "gclab/bench/estimate.h"

#include <algorithm>
#include <set>

#include "gclab/model/activations.h"
#include "gclab/train/session.h"

namespace gclab::bench {

namespace {

StepEstimate step_estimate(const train::Session& session, const model::ActivationEstimate& a, int batch, int resolution,
                           bool checkpointed, int64_t resident, int64_t gradients) {
  const model::ModelSpec& spec = session.spec();
  StepEstimate s;
  // The flow-matching step's own float32 tensors: x0, noise, x_t, target, the prediction and the squared
  // error (train/flow.cpp), each [B, C, H/8, W/8]; the text embeddings [B, T, D] (+ pooled).
  const int64_t latent = int64_t{4} * batch * spec.latent_channels * (resolution / 8) * (resolution / 8);
  s.batch_bytes = 6 * latent + int64_t{4} * batch * (a.text_tokens * spec.text_dim + spec.pooled_dim);
  s.activation_bytes = checkpointed ? a.full_with_recompute_bytes : a.total_off_bytes;
  // On top of what the blocks keep, the block being run (forward) or differentiated (backward, and its
  // recompute) holds its MLP's transients: the hidden activation and its gradient, [B, S, mlp] each, S the
  // longest sequence a block sees. Measured on every tiny preset it is the step's remaining peak, GC off
  // and full (docs/results/estimate-cpu.md).
  int64_t longest = 0;
  const int64_t e = session.activation_options().element_bytes;
  for (const auto& b : a.blocks) longest = std::max(longest, b.input_bytes / (int64_t{batch} * spec.hidden * e));
  s.workspace_bytes = 2 * int64_t{batch} * longest * spec.mlp_hidden * e;
  s.total_bytes = std::max(resident - gradients + s.batch_bytes + s.activation_bytes + s.workspace_bytes, resident);
  return s;
}

}  // namespace

MemoryEstimate estimate_memory(const config::ProcessConfig& config) {
  train::Session session(config, train::SessionOptions{/*meta=*/true});
  MemoryEstimate e;
  e.spec = session.spec();
  const train::ResidentBytes r = session.resident();
  e.weight_bytes = r.weights;
  e.trained = model::trainable_parameter_count(session.model());
  e.trained_bytes = r.trained;
  e.gradient_bytes = r.trained;  // one gradient per trained tensor, in its dtype
  e.optimizer_bytes = session.optimizer().expected_state_bytes();
  e.ema_bytes = r.ema;
  e.text_encoder_bytes = config.train.unload_text_encoder && config.train.cache_text_embeddings ? 0 : r.text_encoder;
  e.resident_bytes = e.weight_bytes + e.gradient_bytes + e.optimizer_bytes + e.ema_bytes + e.text_encoder_bytes;
  e.cap_bytes = config.vram_cap.bytes;
  e.activation_dtype = std::string(config::name_of(config.train.dtype));
  const bool cuda = config.device.rfind("cuda", 0) == 0;
  e.device = cuda ? "cuda" : config.device;
  const model::ActivationOptions o = model::activation_options(config, cuda);
  std::set<std::pair<int, int>> seen;
  for (const auto& d : config.datasets)
    for (int res : d.resolution) {
      const int batch = d.batch_size.value_or(config.train.batch_size);
      if (!seen.insert({res, batch}).second) continue;
      const auto a = model::estimate_activations(e.spec, batch, res, res, 0, o);
      ResolutionEstimate re;
      re.resolution = res;
      re.batch = batch;
      re.image_tokens = a.image_tokens;
      re.text_tokens = a.text_tokens;
      re.gc_off = step_estimate(session, a, batch, res, false, e.resident_bytes, e.gradient_bytes);
      re.gc_full = step_estimate(session, a, batch, res, true, e.resident_bytes, e.gradient_bytes);
      e.resolutions.push_back(re);
    }
  std::sort(e.resolutions.begin(), e.resolutions.end(),
            [](const ResolutionEstimate& a, const ResolutionEstimate& b) { return a.resolution < b.resolution; });
  e.not_modelled = {"previews (sampling runs without gradients, after the step)",
                    "the data loader's prefetched batches and latent caches",
                    "the text-embedding cache (cache_text_embeddings)",
                    "allocator fragmentation and the CUDA context (CUDA)",
                    "partial checkpoint policies (every:N, blocks, selective, offload)"};
  return e;
}

}  // namespace gclab::bench
