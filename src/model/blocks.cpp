#include "gclab/model/blocks.h"
#include "gclab/nn/activation.h"

#include "gclab/nn/meta_kernels.h"

namespace gclab::model {

using nn::attention;

namespace {

// Chunks of an adaLN embedding [B, n*D].
std::vector<torch::Tensor> chunks(const torch::Tensor& emb, int64_t n) { return emb.chunk(n, 1); }

}  // namespace

const SubBlockRunner& plain_runner() {
  static const SubBlockRunner plain = [](SubBlock, const SubBlockFn& fn, const Tensors& in) { return fn(in); };
  return plain;
}

GeluFeedForwardImpl::GeluFeedForwardImpl(int64_t dim, int64_t inner, const torch::TensorOptions& options) {
  proj_ = register_at(*this, "net.0.proj", Linear(dim, inner, true, options));
  out_ = register_at(*this, "net.2", Linear(inner, dim, true, options));
}

torch::Tensor GeluFeedForwardImpl::forward(const torch::Tensor& x) {
  return out_(nn::activate(nn::Activation::gelu_tanh, proj_(x)));
}

JointAttentionImpl::JointAttentionImpl(int64_t dim, int64_t heads, bool context_out, double eps,
                                       const torch::TensorOptions& options)
    : heads_(heads) {
  const int64_t head_dim = dim / heads;
  to_q = register_module("to_q", Linear(dim, dim, true, options));
  to_k = register_module("to_k", Linear(dim, dim, true, options));
  to_v = register_module("to_v", Linear(dim, dim, true, options));
  norm_q = register_module("norm_q", RMSNorm(head_dim, eps, true, options));
  norm_k = register_module("norm_k", RMSNorm(head_dim, eps, true, options));
  add_q_proj = register_module("add_q_proj", Linear(dim, dim, true, options));
  add_k_proj = register_module("add_k_proj", Linear(dim, dim, true, options));
  add_v_proj = register_module("add_v_proj", Linear(dim, dim, true, options));
  norm_added_q = register_module("norm_added_q", RMSNorm(head_dim, eps, true, options));
  norm_added_k = register_module("norm_added_k", RMSNorm(head_dim, eps, true, options));
  to_out = register_at(*this, "to_out.0", Linear(dim, dim, true, options));
  if (context_out) to_add_out = register_module("to_add_out", Linear(dim, dim, true, options));
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
  to_q = register_module("to_q", Linear(dim, dim, bias, options));
  to_k = register_module("to_k", Linear(dim, dim, bias, options));
  to_v = register_module("to_v", Linear(dim, dim, bias, options));
  norm_q = register_module("norm_q", RMSNorm(dim / heads, eps, true, options));
  norm_k = register_module("norm_k", RMSNorm(dim / heads, eps, true, options));
  if (out_proj) to_out = register_at(*this, "to_out.0", Linear(dim, dim, bias, options));
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

// ---- FLUX ------------------------------------------------------------------------------------------

DoubleStreamBlock::DoubleStreamBlock(int64_t dim, int64_t heads, int64_t mlp_hidden, const Names& names,
                                     const torch::TensorOptions& options) {
  img_mod_ = register_at(*this, names.img_mod, Linear(dim, 6 * dim, true, options));
  txt_mod_ = register_at(*this, names.txt_mod, Linear(dim, 6 * dim, true, options));
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

FluxSingleBlock::FluxSingleBlock(int64_t dim, int64_t heads, int64_t mlp_hidden, const torch::TensorOptions& options) {
  norm_linear = register_at(*this, "norm.linear", Linear(dim, 3 * dim, true, options));
  proj_mlp = register_module("proj_mlp", Linear(dim, mlp_hidden, true, options));
  proj_out = register_module("proj_out", Linear(dim + mlp_hidden, dim, true, options));
  attn = register_module("attn", SelfAttention(dim, heads, /*bias=*/true, /*out_proj=*/false, 1e-6, options));
}

Tensors FluxSingleBlock::forward_block(const Tensors& in, const SubBlockRunner& run) {
  const torch::Tensor& x = in.at(0);
  const auto m = chunks(norm_linear(torch::silu(in.at(1))), 3);  // AdaLayerNormZeroSingle: shift, scale, gate
  const torch::Tensor norm_x = modulate(layer_norm(x), m[0], m[1]);
  const torch::Tensor mlp_h =
      run(SubBlock::mlp,
          [this](const Tensors& t) { return Tensors{nn::activate(nn::Activation::gelu_tanh, proj_mlp(t[0]))}; },
          {norm_x})[0];
  const torch::Tensor attn_out =
      run(SubBlock::attn, [this](const Tensors& t) { return Tensors{attn(t[0], t[1], t[2])}; },
          {norm_x, in.at(2), in.at(3)})[0];
  return {x + m[2].unsqueeze(1) * proj_out(torch::cat({attn_out, mlp_h}, 2))};
}

// ---- Z-Image ---------------------------------------------------------------------------------------

ZImageBlock::ZImageBlock(int64_t dim, int64_t heads, int64_t mlp_hidden, int64_t adaln_dim, bool modulation,
                         const torch::TensorOptions& options)
    : modulation_(modulation) {
  const double eps = 1e-5;  // Z-Image's norm_eps
  attention = register_module("attention", SelfAttention(dim, heads, /*bias=*/false, /*out_proj=*/true, eps, options));
  w1 = register_at(*this, "feed_forward.w1", Linear(dim, mlp_hidden, false, options));
  w2 = register_at(*this, "feed_forward.w2", Linear(mlp_hidden, dim, false, options));
  w3 = register_at(*this, "feed_forward.w3", Linear(dim, mlp_hidden, false, options));
  attention_norm1 = register_module("attention_norm1", RMSNorm(dim, eps, true, options));
  ffn_norm1 = register_module("ffn_norm1", RMSNorm(dim, eps, true, options));
  attention_norm2 = register_module("attention_norm2", RMSNorm(dim, eps, true, options));
  ffn_norm2 = register_module("ffn_norm2", RMSNorm(dim, eps, true, options));
  if (modulation) adaLN = register_at(*this, "adaLN_modulation.0", Linear(adaln_dim, 4 * dim, true, options));
}

Tensors ZImageBlock::forward_block(const Tensors& in, const SubBlockRunner& run) {
  const torch::Tensor& x = in.at(0);
  const torch::Tensor cos = in.at(modulation_ ? 2 : 1), sin = in.at(modulation_ ? 3 : 2);
  // Modulation: scale (1 + s) before attention and MLP, tanh gates after; none in the context refiner.
  torch::Tensor scale_msa, gate_msa, scale_mlp, gate_mlp;
  if (modulation_) {
    const auto m = adaLN(in.at(1)).unsqueeze(1).chunk(4, 2);
    scale_msa = 1.0 + m[0], gate_msa = m[1].tanh(), scale_mlp = 1.0 + m[2], gate_mlp = m[3].tanh();
  }
  auto scaled = [](const torch::Tensor& h, const torch::Tensor& s) { return s.defined() ? h * s : h; };
  auto gated = [](const torch::Tensor& h, const torch::Tensor& g) { return g.defined() ? g * h : h; };
  const torch::Tensor attn_in = scaled(attention_norm1(x), scale_msa);
  const torch::Tensor attn_out =
      run(SubBlock::attn, [this](const Tensors& t) { return Tensors{attention(t[0], t[1], t[2])}; },
          {attn_in, cos, sin})[0];
  const torch::Tensor h = x + gated(attention_norm2(attn_out), gate_msa);
  const torch::Tensor ffn_in = scaled(ffn_norm1(h), scale_mlp);
  const torch::Tensor ffn_out = run(
      SubBlock::mlp, [this](const Tensors& t) { return Tensors{w2(torch::silu(w1(t[0])) * w3(t[0]))}; }, {ffn_in})[0];
  return {h + gated(ffn_norm2(ffn_out), gate_mlp)};
}

// ---- SD3 -------------------------------------------------------------------------------------------

SD3JointBlock::SD3JointBlock(int64_t dim, int64_t heads, int64_t mlp_hidden, bool context_pre_only,
                             const torch::TensorOptions& options)
    : context_pre_only_(context_pre_only) {
  norm1_linear = register_at(*this, "norm1.linear", Linear(dim, 6 * dim, true, options));
  // The last block's text stream only feeds this block's attention: AdaLayerNormContinuous (scale, shift).
  norm1_context_linear =
      register_at(*this, "norm1_context.linear", Linear(dim, (context_pre_only ? 2 : 6) * dim, true, options));
  attn = register_module("attn", JointAttention(dim, heads, /*context_out=*/!context_pre_only, 1e-6, options));
  ff = register_module("ff", GeluFeedForward(dim, mlp_hidden, options));
  if (!context_pre_only) ff_context = register_module("ff_context", GeluFeedForward(dim, mlp_hidden, options));
}

Tensors SD3JointBlock::forward_block(const Tensors& in, const SubBlockRunner& run) {
  const torch::Tensor& temb = in.at(2);
  const torch::Tensor emb = norm1_linear(torch::silu(temb));
  const torch::Tensor cemb = norm1_context_linear(torch::silu(temb));
  const Tensors after_attn = run(SubBlock::attn,
                                 [this](const Tensors& t) {
                                   const auto m = chunks(t[2], 6);
                                   const torch::Tensor norm_img = modulate(layer_norm(t[0]), m[0], m[1]);
                                   torch::Tensor norm_txt;
                                   if (context_pre_only_) {
                                     const auto c = chunks(t[3], 2);  // AdaLayerNormContinuous: scale first, then shift
                                     norm_txt = modulate(layer_norm(t[1]), c[1], c[0]);
                                   } else {
                                     const auto c = chunks(t[3], 6);
                                     norm_txt = modulate(layer_norm(t[1]), c[0], c[1]);
                                   }
                                   const auto [attn_out, ctx_out] =
                                       attn(norm_img, norm_txt, torch::Tensor(), torch::Tensor(), /*text_first=*/false);
                                   const torch::Tensor img = t[0] + m[2].unsqueeze(1) * attn_out;
                                   const torch::Tensor txt =
                                       context_pre_only_ ? t[1] : t[1] + chunks(t[3], 6)[2].unsqueeze(1) * ctx_out;
                                   return Tensors{img, txt};
                                 },
                                 {in.at(0), in.at(1), emb, cemb});
  return run(SubBlock::mlp,
             [this](const Tensors& t) {
               const auto m = chunks(t[2], 6);
               const torch::Tensor img = t[0] + m[5].unsqueeze(1) * ff(modulate(layer_norm(t[0]), m[3], m[4]));
               if (context_pre_only_) return Tensors{img, t[1]};
               const auto c = chunks(t[3], 6);
               const torch::Tensor txt = t[1] + c[5].unsqueeze(1) * ff_context(modulate(layer_norm(t[1]), c[3], c[4]));
               return Tensors{img, txt};
             },
             {after_attn[0], after_attn[1], emb, cemb});
}

// ---- DiT -------------------------------------------------------------------------------------------

DiTBlock::DiTBlock(int64_t dim, int64_t heads, int64_t mlp_hidden, const torch::TensorOptions& options)
    : heads_(heads) {
  qkv = register_at(*this, "attn.qkv", Linear(dim, 3 * dim, true, options));
  proj = register_at(*this, "attn.proj", Linear(dim, dim, true, options));
  fc1 = register_at(*this, "mlp.fc1", Linear(dim, mlp_hidden, true, options));
  fc2 = register_at(*this, "mlp.fc2", Linear(mlp_hidden, dim, true, options));
  adaLN = register_at(*this, "adaLN_modulation.1", Linear(dim, 6 * dim, true, options));
}

Tensors DiTBlock::forward_block(const Tensors& in, const SubBlockRunner& run) {
  const torch::Tensor& x = in.at(0);
  const torch::Tensor emb = adaLN(torch::silu(in.at(1)));
  const torch::Tensor h = run(
      SubBlock::attn,
      [this](const Tensors& t) {
        const auto m = chunks(t[1], 6);
        const torch::Tensor a = modulate(layer_norm(t[0]), m[0], m[1]);
        const int64_t b = a.size(0), n = a.size(1), c = a.size(2);
        const torch::Tensor qkv_heads = qkv(a).reshape({b, n, 3, heads_, c / heads_}).permute({2, 0, 3, 1, 4});
        const torch::Tensor o = attention(qkv_heads[0], qkv_heads[1], qkv_heads[2]).transpose(1, 2).reshape({b, n, c});
        return Tensors{t[0] + m[2].unsqueeze(1) * proj(o)};
      },
      {x, emb})[0];
  return run(
      SubBlock::mlp,
      [this](const Tensors& t) {
        const auto m = chunks(t[1], 6);
        return Tensors{t[0] + m[5].unsqueeze(1) * fc2(nn::activate(nn::Activation::gelu_tanh,
                                                                   fc1(modulate(layer_norm(t[0]), m[3], m[4]))))};
      },
      {h, emb});
}

}  // namespace gclab::model
