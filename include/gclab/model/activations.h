// What a transformer's blocks keep for their backward, block by block, and what a checkpoint policy makes
// of it. The figures are walked, not written down: Session::block_activations runs the model's forward on
// the meta device (memory/meta_count.h) with grad on and nothing checkpointed, and reads at each block's
// call what it left live (its saved tensors; its dequantized weights where a quantized Linear keeps them)
// and what its hidden-stream inputs take (what a checkpointed block keeps instead). The same probe on a
// real device measures them (Session::probe_block_activations); tests/model/activations_test.cpp holds the
// walk to the tracking allocator, block by block, on every tiny preset.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <vector>

#include "gclab/ckpt/policy.h"
#include "gclab/model/spec.h"
#include "gclab/model/transformer.h"

namespace gclab::model {

// One block in the model's order: what it keeps without checkpointing (its dequantized weights included)
// and with it (its hidden-stream inputs).
struct BlockBytes {
  int64_t saved = 0, input = 0;
  // Its forward's model FLOPs, counted as it runs (memory/flops.h; its adapters' left out): what step_flops
  // sums.
  double flops = 0;
};

struct ActivationEstimate {
  std::vector<BlockBytes> per_block;  // each block in the model's order
  // A model of several experts (experts.h): per_block is each expert's blocks in turn, and a forward runs one
  // expert's — the figures below are the largest expert's.
  size_t experts = 1;
  int64_t image_tokens = 0, text_tokens = 0;
  int64_t total_off_bytes = 0;   // all blocks, GC off
  int64_t total_full_bytes = 0;  // all blocks checkpointed: their inputs
  // All blocks checkpointed, during the backward: their inputs plus the activations of the block being
  // recomputed (the largest one) — the figure to hold against a memory budget.
  int64_t full_with_recompute_bytes = 0;
};

// The estimate of blocks keeping `per_block` (walked or measured) for a step of `tokens`; `experts`: the
// experts whose blocks per_block lists in turn.
ActivationEstimate activation_estimate(std::vector<BlockBytes> per_block, const StepTokens& tokens, size_t experts = 1);

// The blocks' activations under a checkpoint policy, block by block as its modes put them
// (ckpt::CheckpointPolicy::mode_for; a budget policy resolved to blocks:[...] first). `kept_bytes`: what
// the forward leaves for the backward — a block not checkpointed its saved bytes, a checkpointed one its
// inputs, an offloaded one nothing on the device. `peak_bytes`: the most the blocks hold at once, the
// backward going from the last block to the first — the blocks before the one being differentiated still
// keeping theirs, that one its activations (recomputed beside its inputs when checkpointed, the inputs
// brought back when offloaded). nullopt for the selective modes, which split a block (the step's walk
// prices them).
struct PolicyActivations {
  int64_t kept_bytes = 0;
  int64_t peak_bytes = 0;
  bool all_checkpointed = false;  // no block keeps its graph: the forward runs each without one
};
std::optional<PolicyActivations> activations_under(const ActivationEstimate& estimate,
                                                   const ckpt::CheckpointPolicy& policy);

// One block under one checkpoint mode (ckpt::BlockMode), walked: what its forward leaves for the backward
// (for Full its hidden-stream inputs, BlockBytes::input; for the others what the forward left live beside its
// outputs) and the FLOPs its backward runs again and the bytes it writes (memory/flops.h: the checkpointed
// regions' forward).
struct ModeCost {
  int64_t kept = 0;
  double recomputed_flops = 0;
  int64_t recomputed_bytes = 0;  // what the recomputed ops write (memory/flops.h)
};
// What running a recompute again costs, in FLOP-equivalents: its FLOPs, and the bytes its ops write at the
// ratio of the device's matmul rate to the rate its element-wise kernels write (`cuda`: a GPU's, else the
// CPU's) — the one price auto's plan (train/auto_plan.cpp) and bench's recompute theory (bench/bench.cpp) use.
double recompute_cost(const ModeCost& cost, bool cuda);

struct BlockModeCosts {
  std::vector<std::map<ckpt::BlockMode, ModeCost>> per_block;  // the model's order (ActivationEstimate's)
  size_t experts = 1;
};

// Per block of `model`, the bytes of the dequantized weights its Linears keep for backward (the quantized
// forward is F.linear(x, dequantized W)): a Linear's only when its input needs a gradient — not the
// modulation Linears' unless `conditioning_grad`.
std::vector<int64_t> dequantized_weight_bytes(const DiffusionTransformer& model, bool conditioning_grad);

}  // namespace gclab::model
