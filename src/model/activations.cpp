#include "gclab/model/activations.h"

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

std::optional<PolicyActivations> activations_under(const ActivationEstimate& est,
                                                   const ckpt::CheckpointPolicy& policy) {
  PolicyActivations p;
  p.all_checkpointed = true;
  const int n = static_cast<int>(est.per_block.size());
  // Each expert's blocks are a forward of their own (a model of one: all of them): the largest kept.
  const int experts = static_cast<int>(std::max<size_t>(est.experts, 1));
  const int per_expert = n / experts;
  for (int e = 0; e < experts; ++e) {
    int64_t kept_before = 0;  // the blocks before block i in this forward, in the model's order
    for (int i = e * per_expert; i < (e + 1) * per_expert; ++i) {
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
        case ckpt::BlockMode::SelectiveOps:
          return std::nullopt;
      }
      p.peak_bytes = std::max(p.peak_bytes, kept_before + own);
      kept_before += kept;
    }
    p.peak_bytes = std::max(p.peak_bytes, kept_before);
    p.kept_bytes = std::max(p.kept_bytes, kept_before);
  }
  return p;
}

// Per byte a recompute writes, in FLOP-equivalents: the matmul rate over the rate the element-wise kernels write
// at (each reads about two bytes for one it writes). A GPU: about 650 TFLOP/s of bf16 matmul achieved against
// about 1 TB/s written (3 TB/s moved; an H100's order of magnitude; the GPU check's auto stage measures it). The
// CPU: measured on the 2-core Xeon (docs/results/auto-cpu.md#selective-ops): selective:ops's recompute took 0.14
// of full's time pooled over four timings of the 768-wide FLUX (0.12 their mean), where 15 prices it at 0.15.
constexpr double kRecomputeFlopsPerByteCuda = 650;
constexpr double kRecomputeFlopsPerByteCpu = 15;

double recompute_cost(const ModeCost& cost, bool cuda) {
  return cost.recomputed_flops +
         (cuda ? kRecomputeFlopsPerByteCuda : kRecomputeFlopsPerByteCpu) * static_cast<double>(cost.recomputed_bytes);
}

ActivationEstimate activation_estimate(std::vector<BlockBytes> per_block, const StepTokens& tokens, size_t experts) {
  ActivationEstimate est;
  est.per_block = std::move(per_block);
  est.experts = experts;
  est.image_tokens = tokens.image;
  est.text_tokens = tokens.text;
  const PolicyActivations off = *activations_under(est, ckpt::CheckpointPolicy::off());
  const PolicyActivations full = *activations_under(est, ckpt::CheckpointPolicy::full());
  est.total_off_bytes = off.kept_bytes;
  est.total_full_bytes = full.kept_bytes;
  est.full_with_recompute_bytes = full.peak_bytes;
  return est;
}

}  // namespace gclab::model
