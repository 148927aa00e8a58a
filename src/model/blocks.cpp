#include "gclab/model/blocks.h"
#include "gclab/nn/activation.h"

#include "gclab/nn/meta_kernels.h"

namespace gclab::model {

using nn::attention;

const SubBlockRunner& plain_runner() {
  static const SubBlockRunner plain = [](SubBlock, const SubBlockFn& fn, const Tensors& in) { return fn(in); };
  return plain;
}

GeluFeedForwardImpl::GeluFeedForwardImpl(int64_t dim, int64_t inner, const torch::TensorOptions& options) {
  proj_ = register_at(*this, "net.0.proj", Linear(LinearOptions(dim, inner).tensor_options(options)));
  out_ = register_at(*this, "net.2", Linear(LinearOptions(inner, dim).tensor_options(options)));
}

torch::Tensor GeluFeedForwardImpl::forward(const torch::Tensor& x) {
  return out_(nn::activate(nn::Activation::gelu_tanh, proj_(x)));
}

JointAttentionImpl::JointAttentionImpl(int64_t dim, int64_t heads, bool context_out, double eps,
                                       const torch::TensorOptions& options)
    : heads_(heads) {
  const int64_t head_dim = dim / heads;
  to_q = register_module("to_q", Linear(LinearOptions(dim, dim).tensor_options(options)));
  to_k = register_module("to_k", Linear(LinearOptions(dim, dim).tensor_options(options)));
  to_v = register_module("to_v", Linear(LinearOptions(dim, dim).tensor_options(options)));
  norm_q = register_module("norm_q", RMSNorm(head_dim, eps, true, options));
  norm_k = register_module("norm_k", RMSNorm(head_dim, eps, true, options));
  add_q_proj = register_module("add_q_proj", Linear(LinearOptions(dim, dim).tensor_options(options)));
  add_k_proj = register_module("add_k_proj", Linear(LinearOptions(dim, dim).tensor_options(options)));
  add_v_proj = register_module("add_v_proj", Linear(LinearOptions(dim, dim).tensor_options(options)));
  norm_added_q = register_module("norm_added_q", RMSNorm(head_dim, eps, true, options));
  norm_added_k = register_module("norm_added_k", RMSNorm(head_dim, eps, true, options));
  to_out = register_at(*this, "to_out.0", Linear(LinearOptions(dim, dim).tensor_options(options)));
  if (context_out) to_add_out = register_module("to_add_out", Linear(LinearOptions(dim, dim).tensor_options(options)));
}

std::pair<torch::Tensor, torch::Tensor> JointAttentionImpl::forward(const torch::Tensor& img, const torch::Tensor& txt,
                                                                    const torch::Tensor& cos, const torch::Tensor& sin,
                                                                    bool text_first) {
  // Project each stream, split heads, QK-normalise per head.
  const torch::Tensor q = norm_q(split_heads(to_q(img), heads_));
  const torch::Tensor k = norm_k(split_heads(to_k(img), heads_));
  const torch::Tensor v = split_heads(to_v(img), heads_);
  const torch::Tensor tq = norm_added_q(split_heads(add_q_proj(txt), heads_));
  const torch::Tensor tk = norm_added_k(split_heads(add_k_proj(txt), heads_));
  const torch::Tensor tv = split_heads(add_v_proj(txt), heads_);
  // One sequence over both streams, rotary embedding over it, one attention.
  auto joint = [&](const torch::Tensor& i, const torch::Tensor& t) {
    return text_first ? torch::cat({t, i}, 2) : torch::cat({i, t}, 2);
  };
  torch::Tensor jq = joint(q, tq), jk = joint(k, tk);
  if (cos.defined()) {
    jq = apply_rope(jq, cos, sin);
    jk = apply_rope(jk, cos, sin);
  }
  const torch::Tensor out = merge_heads(attention(jq, jk, joint(v, tv))).to(img.scalar_type());
  const int64_t n_txt = txt.size(1), n_img = img.size(1);
  const torch::Tensor txt_out = text_first ? out.narrow(1, 0, n_txt) : out.narrow(1, n_img, n_txt);
  const torch::Tensor img_out = text_first ? out.narrow(1, n_txt, n_img) : out.narrow(1, 0, n_img);
  return {to_out(img_out), to_add_out ? to_add_out(txt_out) : torch::Tensor()};
}

SelfAttentionImpl::SelfAttentionImpl(int64_t dim, int64_t heads, bool bias, bool out_proj, double eps,
                                     const torch::TensorOptions& options)
    : heads_(heads) {
  to_q = register_module("to_q", Linear(LinearOptions(dim, dim).bias(bias).tensor_options(options)));
  to_k = register_module("to_k", Linear(LinearOptions(dim, dim).bias(bias).tensor_options(options)));
  to_v = register_module("to_v", Linear(LinearOptions(dim, dim).bias(bias).tensor_options(options)));
  norm_q = register_module("norm_q", RMSNorm(dim / heads, eps, true, options));
  norm_k = register_module("norm_k", RMSNorm(dim / heads, eps, true, options));
  if (out_proj)
    to_out = register_at(*this, "to_out.0", Linear(LinearOptions(dim, dim).bias(bias).tensor_options(options)));
}

torch::Tensor SelfAttentionImpl::forward(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin) {
  torch::Tensor q = norm_q(split_heads(to_q(x), heads_));
  torch::Tensor k = norm_k(split_heads(to_k(x), heads_));
  const torch::Tensor v = split_heads(to_v(x), heads_);
  if (cos.defined()) {
    q = apply_rope(q, cos, sin);
    k = apply_rope(k, cos, sin);
  }
  const torch::Tensor out = merge_heads(attention(q, k, v)).to(x.scalar_type());
  return to_out ? to_out(out) : out;
}

// ---- The double-stream block FLUX and Qwen-Image share --------------------------------------------

DoubleStreamBlock::DoubleStreamBlock(int64_t dim, int64_t heads, int64_t mlp_hidden, const Names& names,
                                     const torch::TensorOptions& options) {
  img_mod_ = register_at(*this, names.img_mod, Linear(LinearOptions(dim, 6 * dim).tensor_options(options)));
  txt_mod_ = register_at(*this, names.txt_mod, Linear(LinearOptions(dim, 6 * dim).tensor_options(options)));
  attn_ = register_module("attn", JointAttention(dim, heads, /*context_out=*/true, 1e-6, options));
  img_mlp_ = register_module(names.img_mlp, GeluFeedForward(dim, mlp_hidden, options));
  txt_mlp_ = register_module(names.txt_mlp, GeluFeedForward(dim, mlp_hidden, options));
}

Tensors DoubleStreamBlock::forward_block(const Tensors& in, const SubBlockRunner& run) {
  const torch::Tensor& temb = in.at(2);
  // Per stream: shift, scale, gate for attention, then for the MLP (FLUX's AdaLayerNormZero, Qwen's *_mod).
  const torch::Tensor emb = img_mod_(torch::silu(temb));
  const torch::Tensor cemb = txt_mod_(torch::silu(temb));
  // Qwen-Image-Edit-2511 (zero_cond_t): inputs 5 and 6 are which image tokens are the reference images'
  // ([1, L, 1] bool) and the embedding of t = 0, which modulates those tokens instead of temb.
  const bool zero_cond = in.size() > 6;
  Tensors attn_in = {in.at(0), in.at(1), emb, cemb, in.at(3), in.at(4)};
  if (zero_cond) attn_in.push_back(img_mod_(torch::silu(in.at(6)))), attn_in.push_back(in.at(5));
  // The image stream's shift, scale, gate (`first` = 0: attention, 3: MLP) per token: [B, 1, D] for all
  // tokens, or [B, L, D] chosen per token when t[zero_at] is t = 0's and t[zero_at + 1] the selector.
  auto img_params = [zero_cond](const Tensors& t, size_t first, size_t zero_at) {
    const auto m = chunks(t[2], 6);
    std::array<torch::Tensor, 3> out;
    for (size_t k = 0; k < 3; ++k) {
      out[k] = m[first + k].unsqueeze(1);
      if (zero_cond) out[k] = nn::where(t[zero_at + 1], chunks(t[zero_at], 6)[first + k].unsqueeze(1), out[k]);
    }
    return out;
  };
  const Tensors after_attn = run(
      SubBlock::attn,
      [this, img_params](const Tensors& t) {
        const auto m = img_params(t, 0, 6);
        const auto c = chunks(t[3], 6);
        const torch::Tensor norm_img = layer_norm(t[0]) * (1 + m[1]) + m[0];
        const torch::Tensor norm_txt = modulate(layer_norm(t[1]), c[0], c[1]);
        const auto [img_attn, txt_attn] = attn_(norm_img, norm_txt, t[4], t[5], /*text_first=*/true);
        return Tensors{t[0] + m[2] * img_attn, t[1] + c[2].unsqueeze(1) * txt_attn};
      },
      attn_in);
  Tensors mlp_in = {after_attn[0], after_attn[1], emb, cemb};
  if (zero_cond) mlp_in.push_back(attn_in[6]), mlp_in.push_back(attn_in[7]);
  return run(
      SubBlock::mlp,
      [this, img_params](const Tensors& t) {
        const auto m = img_params(t, 3, 4);
        const auto c = chunks(t[3], 6);
        const torch::Tensor img = t[0] + m[2] * img_mlp_(layer_norm(t[0]) * (1 + m[1]) + m[0]);
        const torch::Tensor txt = t[1] + c[5].unsqueeze(1) * txt_mlp_(modulate(layer_norm(t[1]), c[3], c[4]));
        return Tensors{img, txt};
      },
      mlp_in);
}

}  // namespace gclab::model
