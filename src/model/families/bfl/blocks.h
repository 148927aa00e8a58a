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

// DoubleStreamBlock. Inputs {img, txt, mods [B, 12, D] (the image stream's shift, scale, gate for attention
// and for the MLP, then the text stream's), cos, sin[, mask]} -> {img, txt}. cos / sin cover [txt; img];
// the mask (Chroma's, boolean [B, H, L, L]) is optional.
class DoubleBlock : public TransformerBlock {
 public:
  DoubleBlock(int64_t dim, int64_t heads, int64_t mlp_hidden, const BlockOptions& b, const torch::TensorOptions& o);
  std::vector<Linear> modulation_linears() override { return {}; }
  std::vector<Linear> text_stream_linears() override { return {txt_.qkv, txt_.proj, txt_.mlp_in, txt_.mlp_out}; }
  Tensors forward_block(const Tensors& in, const SubBlockRunner& run) override;

 private:
  int64_t heads_;
  Stream img_, txt_;
};

// SingleStreamBlock: linear1 gives [q | k | v | MLP in], attention and the MLP in parallel, linear2 over
// their concatenation. Inputs {x, mods [B, 3, D] (shift, scale, gate), cos, sin[, mask]} -> {x}.
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
