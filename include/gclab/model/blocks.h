// What the families' transformer blocks are built from: the block interface, the attention and feed-forward
// modules diffusers' transformers share, and the double-stream block FLUX.1 and Qwen-Image share (diffusers
// transformer_flux.py, transformer_qwenimage.py). A block one family alone has lives in its folder
// (src/model/families/<name>/transformer.cpp), forward in the order of its reference implementation.
// Parameter names are the reference state dicts'.
//
// Every block takes and returns tensors only and calls its two sub-blocks, SubBlock::attn and ::mlp, through a
// SubBlockRunner: the model knows nothing of checkpointing, and a selective policy applied from outside
// can recompute just one sub-block. (The runner's type is the same std::function as gclab::ckpt's.)
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <functional>
#include <string>

#include "gclab/ckpt/sub_block.h"
#include "gclab/nn/layers.h"

namespace gclab::model {

// The shared layers (nn/layers.h) the transformers are built from.
using nn::apply_rope;
using nn::holder_at;
using nn::layer_norm;
using nn::Linear;
using nn::LinearImpl;
using nn::LinearOptions;
using nn::merge_heads;
using nn::modulate;
using nn::named_linears;
using nn::parse_weight_storage;
using nn::patchify;
using nn::register_at;
using nn::RMSNorm;
using nn::RMSNormImpl;
using nn::rope_cos_sin;
using nn::sincos_2d;
using nn::split_heads;
using nn::Tensors;
using nn::timestep_embedding;
using nn::to_string;
using nn::unpatchify;
using nn::WeightStorage;

using SubBlockFn = std::function<Tensors(const Tensors&)>;
using ckpt::SubBlock;
using SubBlockRunner = std::function<Tensors(SubBlock kind, const SubBlockFn& fn, const Tensors& inputs)>;
// Calls fn(inputs): what runs a sub-block when nothing is applied from outside.
const SubBlockRunner& plain_runner();
// The n chunks of an adaLN embedding [B, n*D] (shift, scale, gate, ...).
inline std::vector<torch::Tensor> chunks(const torch::Tensor& emb, int64_t n) { return emb.chunk(n, 1); }

class TransformerBlock : public torch::nn::Module {
 public:
  virtual Tensors forward_block(const Tensors& inputs, const SubBlockRunner& run) = 0;
  Tensors forward(const Tensors& inputs) { return forward_block(inputs, plain_runner()); }
  // The Linears fed by the conditioning vector (adaLN modulation), whose input needs no gradient when only
  // LoRA adapters train.
  virtual std::vector<Linear> modulation_linears() = 0;
  // A two-stream block's Linears that run on the text tokens only (the text stream's projections and MLP;
  // its modulation is among modulation_linears()); empty for a block over one sequence. What FLOP counts
  // and the like read instead of guessing from parameter names.
  virtual std::vector<Linear> text_stream_linears() { return {}; }
};

// diffusers FeedForward(dim, activation_fn="gelu-approximate"): net.0.proj -> GELU(tanh) -> net.2.
class GeluFeedForwardImpl : public torch::nn::Module {
 public:
  GeluFeedForwardImpl(int64_t dim, int64_t inner, const torch::TensorOptions& options);
  torch::Tensor forward(const torch::Tensor& x);
  std::vector<Linear> linears() const { return {proj_, out_}; }

 private:
  Linear proj_{nullptr}, out_{nullptr};
};
TORCH_MODULE(GeluFeedForward);

// Attention over the concatenation of image and text tokens with separate projections for each stream
// (FLUX / Qwen-Image double-stream blocks, SD3 joint blocks): to_q/k/v + add_q/k/v_proj, RMS QK-norms,
// to_out.0 and (unless the text stream ends here) to_add_out.
class JointAttentionImpl : public torch::nn::Module {
 public:
  JointAttentionImpl(int64_t dim, int64_t heads, bool context_out, double eps, const torch::TensorOptions& options);
  // Returns {image out, text out}; text_first orders the joint sequence [text, image] (FLUX, Qwen) or
  // [image, text] (SD3). cos/sin (rotary, over the joint sequence in that order) may be undefined.
  std::pair<torch::Tensor, torch::Tensor> forward(const torch::Tensor& img, const torch::Tensor& txt,
                                                  const torch::Tensor& cos, const torch::Tensor& sin, bool text_first);
  // The text stream's projections: add_q/k/v_proj and to_add_out (when the text stream continues).
  std::vector<Linear> text_linears() const {
    std::vector<Linear> out = {add_q_proj, add_k_proj, add_v_proj};
    if (to_add_out) out.push_back(to_add_out);
    return out;
  }

 private:
  int64_t heads_;
  Linear to_q{nullptr}, to_k{nullptr}, to_v{nullptr}, add_q_proj{nullptr}, add_k_proj{nullptr}, add_v_proj{nullptr};
  RMSNorm norm_q{nullptr}, norm_k{nullptr}, norm_added_q{nullptr}, norm_added_k{nullptr};
  Linear to_out{nullptr}, to_add_out{nullptr};
};
TORCH_MODULE(JointAttention);

// Self-attention with separate q/k/v projections, RMS QK-norms and rotary embedding (FLUX single-stream:
// no output projection; Z-Image: bias-free, with to_out.0).
class SelfAttentionImpl : public torch::nn::Module {
 public:
  SelfAttentionImpl(int64_t dim, int64_t heads, bool bias, bool out_proj, double eps,
                    const torch::TensorOptions& options);
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin);

 private:
  int64_t heads_;
  Linear to_q{nullptr}, to_k{nullptr}, to_v{nullptr}, to_out{nullptr};
  RMSNorm norm_q{nullptr}, norm_k{nullptr};
};
TORCH_MODULE(SelfAttention);

// The double-stream block FLUX and Qwen-Image share: per stream, a modulation Linear of SiLU(temb) into
// [shift, scale, gate] for attention and again for the MLP, LayerNorm without affine, joint attention
// over [text, image] with rotary embedding, a GELU-tanh MLP. Inputs {img, txt, temb, cos, sin} -> {img, txt}.
// The families differ only in their parameter names, which the subclasses give.
class DoubleStreamBlock : public TransformerBlock {
 public:
  std::vector<Linear> modulation_linears() override { return {img_mod_, txt_mod_}; }
  std::vector<Linear> text_stream_linears() override {
    std::vector<Linear> out = attn_->text_linears();
    for (const Linear& l : txt_mlp_->linears()) out.push_back(l);
    return out;
  }
  Tensors forward_block(const Tensors& inputs, const SubBlockRunner& run) override;

 protected:
  struct Names {
    const char *img_mod, *txt_mod, *img_mlp, *txt_mlp;
  };
  DoubleStreamBlock(int64_t dim, int64_t heads, int64_t mlp_hidden, const Names& names,
                    const torch::TensorOptions& options);

 private:
  Linear img_mod_{nullptr}, txt_mod_{nullptr};
  JointAttention attn_{nullptr};
  GeluFeedForward img_mlp_{nullptr}, txt_mlp_{nullptr};
};

}  // namespace gclab::model
