#include "gclab/model/activations.h"
#include "gclab/model/block_ledger.h"
#include "gclab/model/lora.h"
#include "gclab/model/registry.h"

#include <algorithm>

namespace gclab::model {

std::vector<int64_t> dequantized_weight_bytes(const DiffusionTransformer& model, bool conditioning_grad) {
  std::vector<int64_t> out;
  bool any = false;
  for (const auto& block : model.blocks()) {
    int64_t bytes = 0;
    for (auto& [path, linear] : nn::named_linears(*block)) bytes += linear->dequantized_bytes();
    if (!conditioning_grad)
      for (auto& linear : block->modulation_linears()) bytes -= linear->dequantized_bytes();
    any = any || bytes > 0;
    out.push_back(bytes);
  }
  return any ? out : std::vector<int64_t>{};
}

ActivationOptions activation_options(const config::ProcessConfig& config, bool cuda) {
  ActivationOptions o;
  o.element_bytes = config::dtype_bytes(config.train.dtype);
  o.lora_rank = config.network ? lora_options(*config.network).rank : 0;
  if (config.network && lora_options(*config.network).dropout > 0)
    o.lora_dropout_mask_bytes = cuda ? 1 : BlockLedger::a;  // a bool mask, or a scaled one in the adapter's dtype
  o.conditioning_grad = !config.network;
  o.layer_norm_stats_bytes = cuda ? 4 : o.element_bytes;
  return o;
}

std::optional<PolicyActivations> activations_under(const ActivationEstimate& est,
                                                   const ckpt::CheckpointPolicy& policy) {
  PolicyActivations p;
  p.all_checkpointed = true;
  const int n = static_cast<int>(est.per_block.size());
  for (int i = 0; i < n; ++i) {  // p.kept_bytes: the blocks before block i, in the model's order
    const BlockBytes& b = est.per_block[static_cast<size_t>(i)];
    int64_t kept = 0, own = b.saved;  // what block i keeps, and holds while its backward runs
    switch (policy.mode_for(i, n)) {
      case ckpt::BlockMode::None:
        kept = b.saved, p.all_checkpointed = false;
        break;
      case ckpt::BlockMode::Full:
        kept = b.input, own += b.input;
        break;
      case ckpt::BlockMode::Offload:
        own += b.input;
        break;
      case ckpt::BlockMode::SelectiveAttn:
      case ckpt::BlockMode::SelectiveMlp:
        return std::nullopt;
    }
    p.peak_bytes = std::max(p.peak_bytes, p.kept_bytes + own);
    p.kept_bytes += kept;
  }
  p.peak_bytes = std::max(p.peak_bytes, p.kept_bytes);
  return p;
}

ActivationEstimate estimate_activations(const ModelSpec& s, int64_t batch, int64_t height, int64_t width, int64_t text,
                                        const ActivationOptions& o) {
  const BlockLedger L{batch,
                      s.hidden,
                      s.heads,
                      o.element_bytes,
                      o.lora_rank,
                      o.lora_rank == 0,
                      o.layer_norm_stats_bytes,
                      o.lora_rank > 0 ? o.lora_dropout_mask_bytes : 0};
  ActivationEstimate est;
  const int64_t n = image_tokens(s, height, width) + reference_tokens(s, s.reference_tokens ? 1 : 0, height, width);
  const int64_t t = text > 0 ? text : text_tokens(s, kNominalCaptionTokens);
  est.image_tokens = n;
  est.text_tokens = t;
  for (BlockActivations& b : family_of(s.family).block_activations(s, L, n, t))
    if (b.count > 0) est.blocks.push_back(std::move(b));
  size_t index = 0;  // the block's place in the model, for its dequantized weights
  for (const auto& b : est.blocks)
    for (int k = 0; k < b.count; ++k, ++index) {
      const int64_t weights = index < o.dequantized_weight_bytes.size() ? o.dequantized_weight_bytes[index] : 0;
      est.per_block.push_back({b.saved_bytes + weights, b.input_bytes});
    }
  const PolicyActivations off = *activations_under(est, ckpt::CheckpointPolicy::off());
  const PolicyActivations full = *activations_under(est, ckpt::CheckpointPolicy::full());
  est.total_off_bytes = off.kept_bytes;
  est.total_full_bytes = full.kept_bytes;
  est.full_with_recompute_bytes = full.peak_bytes;
  return est;
}

}  // namespace gclab::model
