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
  static constexpr int64_t a = 4;  // the LoRA adapters' dtype: float32 (AI Toolkit's network.force_to)

  int64_t act(int64_t elements) const { return elements * e; }
  // A LoRA adapter keeps its rank-r intermediate (lora_A's output, or its dropout, saved by lora_B; float32)
  // and, with dropout, the dropout's mask.
  int64_t lora(int64_t rows) const { return r > 0 ? rows * r * (a + dropout_mask_bytes) : 0; }
  // Each adapter computes on its own float32 copy of its Linear's input (LoRAModule.forward: "always cast
  // to float32", x.to(lora_down.weight.dtype)), which lora_down keeps for its weight's gradient: `n` copies
  // of a rows x in input for n Linears on it, when the model is narrower than float32.
  bool copies() const { return r > 0 && e != a; }
  int64_t lora_copies(int64_t rows, int64_t in, int n = 1) const { return copies() ? n * rows * in * a : 0; }
  // A rows x in tensor that only `n` Linears keep: the tensor itself where a trained weight or a float32
  // model's adapter keeps it; the adapters' float32 copies instead (and not the tensor) in a bf16 LoRA.
  int64_t linear_input(int64_t rows, int64_t in, int n = 1) const {
    return copies() ? lora_copies(rows, in, n) : act(rows * in);
  }
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
// refiner); `adaln` is the modulation's input width (min(D, 256)).
int64_t zimage_block(const BlockLedger& L, int64_t s, int64_t m, int64_t adaln, bool modulation);
// SD3's joint block; `pre_only`: the last one, whose text stream stops after attention.
int64_t sd3_joint(const BlockLedger& L, int64_t n, int64_t t, int64_t m, bool pre_only);
// DiT's block over `n` image tokens.
int64_t dit_block(const BlockLedger& L, int64_t n, int64_t m);

}  // namespace gclab::model
