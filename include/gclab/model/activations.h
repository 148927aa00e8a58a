// How many bytes each block keeps for its backward — computed from the shapes, op by op, the way
// llm.c's fill_in_activation_sizes names every buffer. Each entry below mirrors a tensor that a block's
// forward (blocks.cpp) hands to autograd; tests/model/activations_test.cpp checks the sums against the
// tracking allocator, byte for byte, on the tiny presets.
//
// What it models: activations in one dtype (`element_bytes`: 2 for a bf16 model, 4 for fp32), with the
// float32 internals the reference code keeps anyway (LayerNorm statistics, RMSNorm's float32 copy and
// 1/rms, attention's log-sum-exp); attention by a fused kernel (flash / memory-efficient: q, k, v, output
// and log-sum-exp are saved, never the score matrix); no dropout. With LoRA, frozen weights are not
// saved and neither are tensors only a frozen weight's gradient would need (RMSNorm's normalised input),
// while each adapter keeps its rank-r intermediate and, in a bf16 model, its own float32 copy of its input.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "gclab/ckpt/policy.h"
#include "gclab/model/spec.h"
#include "gclab/model/transformer.h"

namespace gclab::model {

struct ActivationOptions {
  int64_t element_bytes = 2;      // the activations' dtype: bf16 2, fp32 4
  int64_t lora_rank = 0;          // 0: every weight trained
  bool conditioning_grad = true;  // the timestep/text vector needs a gradient (full training)
  // LayerNorm's saved mean and 1/std: float32 on CUDA whatever the input; on the CPU a bf16 input keeps
  // them in bf16 (measured), so CPU figures pass 2 here for bf16.
  int64_t layer_norm_stats_bytes = 4;
  // LoRA dropout (network.dropout > 0), on lora_A's rank-sized output: its mask's bytes per element —
  // CUDA's fused dropout keeps a bool mask (1), the CPU a scaled mask in the adapter's float32 (4); 0: none.
  int64_t lora_dropout_mask_bytes = 0;
  // Per block, in the model's order: the weights its uint-stored Linears dequantize for each matmul, which
  // autograd keeps for the input's gradient (AI Toolkit's quantized forward is F.linear(x, dequantized W)),
  // so a block that is not checkpointed holds them until its backward. Empty: none.
  std::vector<int64_t> dequantized_weight_bytes;
};

struct BlockActivations {
  std::string kind;         // "double", "single", "refiner", "context refiner", "joint", "joint (last)", "dit"
  int count = 0;            // blocks of this kind
  int64_t saved_bytes = 0;  // per block, kept from forward to backward without checkpointing
  int64_t input_bytes = 0;  // per block, what a checkpointed block keeps instead: its hidden-stream inputs
  // The most token rows (B x tokens) its MLP runs on at once: a two-stream block runs each stream's apart.
  int64_t mlp_rows = 0;
};

// One block in the model's order: what it keeps without checkpointing (its dequantized weights included)
// and with it (its hidden-stream inputs).
struct BlockBytes {
  int64_t saved = 0, input = 0;
};

struct ActivationEstimate {
  std::vector<BlockActivations> blocks;
  std::vector<BlockBytes> per_block;  // each block in the model's order
  int64_t image_tokens = 0, text_tokens = 0;
  int64_t total_off_bytes = 0;   // all blocks, GC off
  int64_t total_full_bytes = 0;  // all blocks checkpointed: their inputs
  // All blocks checkpointed, during the backward: their inputs plus the activations of the block being
  // recomputed (the largest one) — the figure to hold against a memory budget.
  int64_t full_with_recompute_bytes = 0;
};

// The blocks' activations under a checkpoint policy, block by block as its modes put them
// (ckpt::CheckpointPolicy::mode_for; a budget policy resolved to blocks:[...] first). `kept_bytes`: what
// the forward leaves for the backward — a block not checkpointed its saved bytes, a checkpointed one its
// inputs, an offloaded one nothing on the device. `peak_bytes`: the most the blocks hold at once, the
// backward going from the last block to the first — the blocks before the one being differentiated still
// keeping theirs, that one its activations (recomputed beside its inputs when checkpointed, the inputs
// brought back when offloaded). nullopt for the selective modes, whose sub-blocks the ledger does not split.
struct PolicyActivations {
  int64_t kept_bytes = 0;
  int64_t peak_bytes = 0;
  bool all_checkpointed = false;  // no block keeps its graph: the forward runs each without one
};
std::optional<PolicyActivations> activations_under(const ActivationEstimate& estimate,
                                                   const ckpt::CheckpointPolicy& policy);

// Per block of `model`, the bytes of the dequantized weights its Linears keep for backward (see above): a
// Linear's only when its input needs a gradient — not the modulation Linears' unless `conditioning_grad`.
std::vector<int64_t> dequantized_weight_bytes(const DiffusionTransformer& model, bool conditioning_grad);

// The options a training config implies: its dtype, its LoRA rank (none: every weight trained), and the
// device kind (LayerNorm statistics are float32 on CUDA; on the CPU a bf16 input keeps them in bf16).
ActivationOptions activation_options(const config::ProcessConfig& config, bool cuda);

// One sample batch of `batch` images of height x width with `text_tokens` text tokens (0: the family's
// count for a 77-token prompt).
ActivationEstimate estimate_activations(const ModelSpec& spec, int64_t batch, int64_t height, int64_t width,
                                        int64_t text_tokens, const ActivationOptions& options);

}  // namespace gclab::model
