// The blocks of Black Forest Labs' reference code as AI Toolkit trains its copies of it — Chroma
// (extensions_built_in/diffusion_models/chroma/src/layers.py) and FLUX.2 / FLUX.2 klein (flux2/src/model.py) —
// in those names: per stream a fused `qkv` projection, QK norms' `scale`, `proj`, an MLP `*_mlp.0` / `*_mlp.2`;
// single-stream blocks of one `linear1` ([q | k | v | MLP in]) and one `linear2`. The families differ in
// biases, the MLP (GELU-tanh, or SwiGLU over a doubled input), the QK norm's arithmetic and where the
// modulation comes from; each block takes its shift / scale / gate vectors as an input, [B, n, D].
// Private to the family folders (included as "model/families/bfl/blocks.h").
#pragma once

#include <array>
#include <string>

#include "model/transformer_parts.h"

namespace gclab::model::bfl {

struct BlockOptions {
  bool bias = true;     // Chroma: every Linear has one; FLUX.2: none
  bool swiglu = false;  // FLUX.2: MLP in = 2 x hidden, silu(first half) * second half; else GELU-tanh
  // The QK norm: F.rms_norm with weight `scale` (Chroma's layers.py RMSNorm.forward), or BFL's own
  // (flux2/src/model.py RMSNorm: float32 x * rsqrt(mean(x²) + eps), cast back, times `scale`).
  bool functional_rms_norm = true;
  // FLUX.2: a double block takes the image's and the text's rotary tables apart and joins them itself
  // (model.py:424-429: a [txt; img] table made in every block, which its attention keeps); Chroma: one
  // joint table made once.
  bool joins_rope_tables = false;
};

// A QK norm with weight `scale`, eps 1e-6.
struct ScaleNorm {
  torch::Tensor scale;
  bool functional = true;
  ScaleNorm() = default;
  ScaleNorm(torch::nn::Module& owner, const std::string& path, int64_t dim, bool functional_rms_norm,
            const torch::TensorOptions& o);
  torch::Tensor operator()(const torch::Tensor& x) const;
};

// timestep_embedding (Chroma's src/layers.py:30-53, FLUX.2's src/model.py:476-499): t x 1000 in t's dtype,
// [cos | sin] of it in float32 at max period 10000, cast back to t's dtype where t is floating. The
// frequencies are made on the CPU and moved (Chroma's) or on t's device (FLUX.2's): a CUDA exp may round
// one differently, and the index embedding's arguments reach 343,000.
torch::Tensor timestep_embedding(const torch::Tensor& t, int64_t dim, bool frequencies_on_cpu);

// EmbedND / rope (src/math.py): per axis i, the angles pos_i x theta^(-arange(0, d_i, 2) / d_i) — in float64
// from float positions (Chroma's ids) or float32 from int64 ones (FLUX.2's) — as the 2 x 2 rotations
// [[cos, -sin], [sin, cos]], the axes side by side, float32: [B, 1, L, head_dim / 2, 2, 2] from ids [B, L, axes].
torch::Tensor rope_table(const torch::Tensor& ids, const std::vector<int64_t>& axes, double theta);
// apply_rope: each pair of q's (and k's) features rotated in float32, cast back.
torch::Tensor apply_rope(const torch::Tensor& x, const torch::Tensor& table);

// (1 + scale) * x + shift, each [B, 1, D] (_modulation_shift_scale_fn).
inline torch::Tensor shift_scale(const torch::Tensor& x, const torch::Tensor& shift, const torch::Tensor& scale) {
  return (1 + scale) * x + shift;
}

// One stream of a double block: its fused attention projections, QK norms, output projection and MLP.
struct Stream {
  Linear qkv{nullptr}, proj{nullptr}, mlp_in{nullptr}, mlp_out{nullptr};
  ScaleNorm q_norm, k_norm;
  bool swiglu = false;
  Stream(torch::nn::Module& owner, const std::string& name, int64_t dim, int64_t heads, int64_t mlp_hidden,
         const BlockOptions& b, const torch::TensorOptions& o);
  std::array<torch::Tensor, 3> qkv_heads(const torch::Tensor& x, int64_t heads);  // normed q, k; v
  torch::Tensor mlp(const torch::Tensor& x);
};

// DoubleStreamBlock. Inputs {img, txt, img_mods [B, 6, D], txt_mods [B, 6, D] (each stream's shift, scale,
// gate for attention, then for the MLP), rope table[, mask]} -> {img, txt}. The table covers [txt; img]
// (joins_rope_tables: two inputs, the image's table, then the text's); the mask (Chroma's, boolean
// [B, H, L, L]) is optional.
class DoubleBlock : public TransformerBlock {
 public:
  DoubleBlock(int64_t dim, int64_t heads, int64_t mlp_hidden, const BlockOptions& b, const torch::TensorOptions& o);
  std::vector<Linear> modulation_linears() override { return {}; }
  std::vector<Linear> text_stream_linears() override { return {txt_.qkv, txt_.proj, txt_.mlp_in, txt_.mlp_out}; }
  Tensors forward_block(const Tensors& in, const SubBlockRunner& run) override;

 private:
  int64_t heads_;
  bool joins_rope_;
  Stream img_, txt_;
};

// SingleStreamBlock: linear1 gives [q | k | v | MLP in], attention and the MLP in parallel, linear2 over
// their concatenation. Inputs {x, mods [B, 3, D] (shift, scale, gate), rope table[, mask]} -> {x}.
class SingleBlock : public TransformerBlock {
 public:
  SingleBlock(int64_t dim, int64_t heads, int64_t mlp_hidden, const BlockOptions& b, const torch::TensorOptions& o);
  std::vector<Linear> modulation_linears() override { return {}; }
  Tensors forward_block(const Tensors& in, const SubBlockRunner& run) override;

 private:
  int64_t dim_, heads_, mlp_in_;
  bool swiglu_;
  Linear linear1{nullptr}, linear2{nullptr};
  ScaleNorm q_norm, k_norm;
};

}  // namespace gclab::model::bfl
