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
  const int64_t n = image_tokens(s, height, width) + reference_tokens(s, s.edit ? 1 : 0, height, width);
  const int64_t t = text > 0 ? text : text_tokens(s, kNominalCaptionTokens);
  est.image_tokens = n;
  est.text_tokens = t;
  for (BlockActivations& b : family_of(s.family).block_activations(s, L, n, t))
    if (b.count > 0) est.blocks.push_back(std::move(b));
  int64_t largest_block = 0;
  size_t index = 0;  // the block's place in the model, for its dequantized weights
  for (const auto& b : est.blocks)
    for (int k = 0; k < b.count; ++k, ++index) {
      const int64_t weights = index < o.dequantized_weight_bytes.size() ? o.dequantized_weight_bytes[index] : 0;
      est.total_off_bytes += b.saved_bytes + weights;
      est.total_full_bytes += b.input_bytes;
      largest_block = std::max(largest_block, b.saved_bytes + weights);
    }
  est.full_with_recompute_bytes = est.total_full_bytes + largest_block;
  return est;
}

}  // namespace gclab::model
