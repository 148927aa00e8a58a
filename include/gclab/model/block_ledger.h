// The activation ledger's op rules and its block kinds (activations.h): the bytes one block keeps for its
// backward, computed from the shapes, each entry named after a tensor the block's forward (blocks.cpp)
// hands to autograd. Each family's folder says which blocks its transformer has (registry.h
// ModelFamily's block_activations); tests/model/activations_test.cpp checks every tiny preset's against the
// tracking allocator, byte for byte.
#pragma once

#include <cstdint>

namespace gclab::model {

// Sizes are in elements times bytes; `rows` are token vectors (B x tokens).
struct BlockLedger {
  int64_t B, D, H, e, r;
  bool full;  // weights trained (not LoRA): tensors only a weight's gradient needs are saved too
  int64_t ln_stats_bytes;
  int64_t dropout_mask_bytes;      // per rank-sized element, with LoRA dropout
  static constexpr int64_t f = 4;  // float32 internals

  int64_t act(int64_t elements) const { return elements * e; }
  // A LoRA adapter keeps its rank-r intermediate (lora_A's output, or its dropout, saved by lora_B) and,
  // with dropout, the dropout's mask.
  int64_t lora(int64_t rows) const { return r > 0 ? rows * r * (e + dropout_mask_bytes) : 0; }
  int64_t layer_norm_stats(int64_t rows) const { return 2 * rows * ln_stats_bytes; }  // mean and 1/std
  // RMSNorm (diffusers): a float32 copy of a non-float32 input (pow's), 1/rms per vector, and the
  // normalised input when the weight is trained (for the weight's gradient).
  int64_t rms_norm(int64_t elements, int64_t vectors) const {
    return (e != 4 ? elements * f : 0) + vectors * f + (full ? act(elements) : 0);
  }
  // Fused attention: output and log-sum-exp (q, k, v are counted where they are made).
  int64_t attention(int64_t rows) const { return act(rows * D) + B * H * (rows / B) * f; }
};

// FLUX / Qwen-Image double-stream block; `n` image tokens (with references), `t` text tokens, `m` MLP width;
// `zero_cond`: Qwen-Image-Edit-2511's per-token modulation of the reference tokens.
int64_t double_stream(const BlockLedger& L, int64_t n, int64_t t, int64_t m, bool zero_cond = false);
// FLUX's single-stream block over `s` joint tokens.
int64_t flux_single(const BlockLedger& L, int64_t s, int64_t m);
// Z-Image's block over `s` tokens, with adaLN modulation (noise refiner, main layers) or without (context
// refiner).
int64_t zimage_block(const BlockLedger& L, int64_t s, int64_t m, bool modulation);
// SD3's joint block; `pre_only`: the last one, whose text stream stops after attention.
int64_t sd3_joint(const BlockLedger& L, int64_t n, int64_t t, int64_t m, bool pre_only);
// DiT's block over `n` image tokens.
int64_t dit_block(const BlockLedger& L, int64_t n, int64_t m);

}  // namespace gclab::model
