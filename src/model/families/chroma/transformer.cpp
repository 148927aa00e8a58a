// Chroma's transformer as AI Toolkit trains it: its copy of the Black Forest Labs reference code
// (extensions_built_in/diffusion_models/chroma/src/model.py, layers.py, math.py), in those names — a fused
// `qkv` per stream, `linear1` / `linear2` in the single-stream blocks, QK norms' `scale` — the names of the
// single-file checkpoints it loads strictly and of the LoRA files it saves. FLUX.1's MMDiT with every
// per-block modulation Linear pruned away: one approximator network makes all the modulation vectors from
// the timestep, a zero guidance and each vector's index, under no_grad. The same function as diffusers'
// ChromaTransformer2DModel after diffusers' own key conversion (tests/interop/diffusers_chroma.py).
#include <array>

#include "gclab/nn/meta_kernels.h"
#include "model/transformer_parts.h"

namespace gclab::model::chroma {
namespace {

using nn::attention;

// The approximator's depth (model.py chroma_params approximator_depth: 5; diffusers approximator_layers).
constexpr int kApproximatorDepth = 5;
constexpr double kEps = 1e-6;

// layers.py RMSNorm: F.rms_norm over the last dimension with weight `scale`, eps 1e-6.
struct ScaleNorm {
  torch::Tensor scale;
  ScaleNorm() = default;
  ScaleNorm(torch::nn::Module& owner, const std::string& path, int64_t dim, const torch::TensorOptions& o)
      : scale(holder_at(owner, path).register_parameter("scale", torch::ones({dim}, o))) {}
  torch::Tensor operator()(const torch::Tensor& x) const { return torch::rms_norm(x, {x.size(-1)}, scale, kEps); }
};

// A fused [q | k | v] projection's output [B, L, 3D] as three [B, H, L, Dh] views (rearrange
// "B L (K H D) -> K B H L D").
std::array<torch::Tensor, 3> split_qkv(const torch::Tensor& qkv, int64_t heads) {
  const torch::Tensor t = qkv.unflatten(-1, {3, heads, qkv.size(-1) / (3 * heads)}).permute({2, 0, 3, 1, 4});
  return {t[0], t[1], t[2]};
}

// math.py attention: rotary embedding on q and k, SDPA with the boolean mask, heads merged.
torch::Tensor rope_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                             const torch::Tensor& cos, const torch::Tensor& sin, const torch::Tensor& mask) {
  return merge_heads(attention(apply_rope(q, cos, sin), apply_rope(k, cos, sin), v, mask));
}

// (1 + scale) * x + shift, each [B, 1, D] (layers.py _modulation_shift_scale_fn).
torch::Tensor shift_scale(const torch::Tensor& x, const torch::Tensor& shift, const torch::Tensor& scale) {
  return (1 + scale) * x + shift;
}

// One stream of a double block: its fused attention projections, QK norms, output projection and MLP.
struct Stream {
  Linear qkv{nullptr}, proj{nullptr}, mlp_in{nullptr}, mlp_out{nullptr};
  ScaleNorm q_norm, k_norm;
  Stream(torch::nn::Module& owner, const std::string& name, int64_t dim, int64_t heads, int64_t mlp_hidden,
         const torch::TensorOptions& o)
      : qkv(register_at(owner, name + "_attn.qkv", Linear(LinearOptions(dim, 3 * dim).tensor_options(o)))),
        proj(register_at(owner, name + "_attn.proj", Linear(LinearOptions(dim, dim).tensor_options(o)))),
        mlp_in(register_at(owner, name + "_mlp.0", Linear(LinearOptions(dim, mlp_hidden).tensor_options(o)))),
        mlp_out(register_at(owner, name + "_mlp.2", Linear(LinearOptions(mlp_hidden, dim).tensor_options(o)))),
        q_norm(owner, name + "_attn.norm.query_norm", dim / heads, o),
        k_norm(owner, name + "_attn.norm.key_norm", dim / heads, o) {}
  // The stream's q, k, v from its modulated input.
  std::array<torch::Tensor, 3> qkv_heads(const torch::Tensor& x, int64_t heads) {
    auto [q, k, v] = split_qkv(qkv(x), heads);
    return {q_norm(q), k_norm(k), v};
  }
  torch::Tensor mlp(const torch::Tensor& x) { return mlp_out(nn::activate(nn::Activation::gelu_tanh, mlp_in(x))); }
};

// layers.py DoubleStreamBlock. Inputs {img, txt, mods [B, 12, D] (the image stream's two shift/scale/gate
// triples, then the text stream's), cos, sin, mask} -> {img, txt}.
class ChromaDoubleBlock : public TransformerBlock {
 public:
  ChromaDoubleBlock(int64_t dim, int64_t heads, int64_t mlp_hidden, const torch::TensorOptions& o)
      : heads_(heads), img_(*this, "img", dim, heads, mlp_hidden, o), txt_(*this, "txt", dim, heads, mlp_hidden, o) {}
  std::vector<Linear> modulation_linears() override { return {}; }
  std::vector<Linear> text_stream_linears() override { return {txt_.qkv, txt_.proj, txt_.mlp_in, txt_.mlp_out}; }

  Tensors forward_block(const Tensors& in, const SubBlockRunner& run) override {
    const Tensors after_attn =
        run(SubBlock::attn,
            [this](const Tensors& t) {
              const torch::Tensor &img = t[0], &txt = t[1], &m = t[2];
              const auto mod = [&m](int64_t i) { return m.narrow(1, i, 1); };
              const auto [iq, ik, iv] = img_.qkv_heads(shift_scale(layer_norm(img), mod(0), mod(1)), heads_);
              const auto [tq, tk, tv] = txt_.qkv_heads(shift_scale(layer_norm(txt), mod(6), mod(7)), heads_);
              const torch::Tensor out = rope_attention(torch::cat({tq, iq}, 2), torch::cat({tk, ik}, 2),
                                                       torch::cat({tv, iv}, 2), t[3], t[4], t[5]);
              const int64_t n_txt = txt.size(1);
              return Tensors{img + mod(2) * img_.proj(out.narrow(1, n_txt, img.size(1))),
                             txt + mod(8) * txt_.proj(out.narrow(1, 0, n_txt))};
            },
            {in.at(0), in.at(1), in.at(2), in.at(3), in.at(4), in.at(5)});
    return run(SubBlock::mlp,
               [this](const Tensors& t) {
                 const torch::Tensor& m = t[2];
                 const auto mod = [&m](int64_t i) { return m.narrow(1, i, 1); };
                 const torch::Tensor img = t[0] + mod(5) * img_.mlp(shift_scale(layer_norm(t[0]), mod(3), mod(4)));
                 const torch::Tensor txt = t[1] + mod(11) * txt_.mlp(shift_scale(layer_norm(t[1]), mod(9), mod(10)));
                 return Tensors{img, txt};
               },
               {after_attn[0], after_attn[1], in.at(2)});
  }

 private:
  int64_t heads_;
  Stream img_, txt_;
};

// layers.py SingleStreamBlock: linear1 gives [q | k | v | mlp], attention and a GELU-tanh MLP in parallel,
// linear2 over their concatenation. Inputs {x, mods [B, 3, D] (shift, scale, gate), cos, sin, mask} -> {x}.
class ChromaSingleBlock : public TransformerBlock {
 public:
  ChromaSingleBlock(int64_t dim, int64_t heads, int64_t mlp_hidden, const torch::TensorOptions& o)
      : dim_(dim), heads_(heads), mlp_hidden_(mlp_hidden) {
    linear1 = register_module("linear1", Linear(LinearOptions(dim, 3 * dim + mlp_hidden).tensor_options(o)));
    linear2 = register_module("linear2", Linear(LinearOptions(dim + mlp_hidden, dim).tensor_options(o)));
    q_norm = ScaleNorm(*this, "norm.query_norm", dim / heads, o);
    k_norm = ScaleNorm(*this, "norm.key_norm", dim / heads, o);
  }
  std::vector<Linear> modulation_linears() override { return {}; }

  Tensors forward_block(const Tensors& in, const SubBlockRunner& run) override {
    const torch::Tensor& x = in.at(0);
    const torch::Tensor& m = in.at(1);
    const torch::Tensor h = linear1(shift_scale(layer_norm(x), m.narrow(1, 0, 1), m.narrow(1, 1, 1)));
    const torch::Tensor attn_out = run(SubBlock::attn,
                                       [this](const Tensors& t) {
                                         auto [q, k, v] = split_qkv(t[0], heads_);
                                         return Tensors{rope_attention(q_norm(q), k_norm(k), v, t[1], t[2], t[3])};
                                       },
                                       {h.narrow(-1, 0, 3 * dim_), in.at(2), in.at(3), in.at(4)})[0];
    const torch::Tensor mlp_out =
        run(SubBlock::mlp, [](const Tensors& t) { return Tensors{nn::activate(nn::Activation::gelu_tanh, t[0])}; },
            {h.narrow(-1, 3 * dim_, mlp_hidden_)})[0];
    return {x + m.narrow(1, 2, 1) * linear2(torch::cat({attn_out, mlp_out}, 2))};
  }

 private:
  int64_t dim_, heads_, mlp_hidden_;
  Linear linear1{nullptr}, linear2{nullptr};
  ScaleNorm q_norm, k_norm;
};

class ChromaTransformer : public DiffusionTransformer {
 public:
  ChromaTransformer(const ModelSpec& s, const torch::TensorOptions& o) : DiffusionTransformer(s) {
    const int64_t d = s.hidden, packed = s.latent_channels * s.patch * s.patch, a = s.t_embed_mid;
    img_in = register_module("img_in", Linear(LinearOptions(packed, d).tensor_options(o)));
    in_proj = register_at(*this, "distilled_guidance_layer.in_proj",
                          Linear(LinearOptions(kApproximatorInput, a).tensor_options(o)));
    for (int i = 0; i < kApproximatorDepth; ++i) {
      const std::string p = "distilled_guidance_layer.layers." + std::to_string(i);
      layers.emplace_back(*this, p + ".in_layer", p + ".out_layer", a, a, a, o);
      norms.emplace_back(*this, "distilled_guidance_layer.norms." + std::to_string(i), a, o);
    }
    out_proj = register_at(*this, "distilled_guidance_layer.out_proj", Linear(LinearOptions(a, d).tensor_options(o)));
    txt_in = register_module("txt_in", Linear(LinearOptions(s.text_dim, d).tensor_options(o)));
    for (int i = 0; i < s.double_blocks; ++i)
      add_block("double_blocks." + std::to_string(i), std::make_shared<ChromaDoubleBlock>(d, s.heads, s.mlp_hidden, o));
    for (int i = 0; i < s.single_blocks; ++i)
      add_block("single_blocks." + std::to_string(i), std::make_shared<ChromaSingleBlock>(d, s.heads, s.mlp_hidden, o));
    final_linear = register_at(*this, "final_layer.linear", Linear(LinearOptions(d, packed).tensor_options(o)));
  }

  torch::Tensor forward(const ModelInputs& in) override {
    const int64_t p = spec_.patch, h = in.latents.size(2), w = in.latents.size(3);
    torch::Tensor img = img_in(patchify(in.latents, p, /*channels_last=*/false));
    torch::Tensor txt = txt_in(in.text);
    const int64_t n_img = img.size(1), n_txt = txt.size(1);
    const torch::Tensor mods = modulations(in.timestep, img.size(0), img.scalar_type());
    std::vector<std::array<int64_t, 3>> ids(static_cast<size_t>(n_txt), {0, 0, 0});
    add_image_ids(ids, 0, h / p, w / p);
    const auto [cos, sin] = rope_cos_sin(ids_tensor(ids, img.device()), spec_.rope_axes, spec_.rope_theta);
    const torch::Tensor mask = attention_mask(in.text_mask, img.size(0), n_txt, n_img, img.device());
    const int64_t singles = 3 * spec_.single_blocks, doubles = spec_.double_blocks;
    size_t b = 0;
    for (; b < static_cast<size_t>(doubles); ++b) {
      const int64_t i = static_cast<int64_t>(b);
      const torch::Tensor m =
          torch::cat({mods.narrow(1, singles + 6 * i, 6), mods.narrow(1, singles + 6 * (doubles + i), 6)}, 1);
      const Tensors out = call_block(b, {img, txt, m, cos, sin, mask});
      img = out[0], txt = out[1];
    }
    torch::Tensor x = torch::cat({txt, img}, 1);
    for (; b < blocks().size(); ++b) {
      const int64_t i = static_cast<int64_t>(b) - doubles;
      x = call_block(b, {x, mods.narrow(1, 3 * i, 3), cos, sin, mask})[0];
    }
    img = x.narrow(1, n_txt, n_img);
    const int64_t last = mods.size(1) - 2;  // LastLayer: shift, scale
    img = final_linear(shift_scale(layer_norm(img), mods.narrow(1, last, 1), mods.narrow(1, last + 1, 1)));
    return unpatchify(img, h, w, p, spec_.out_channels, false);
  }

 private:
  static constexpr int64_t kApproximatorInput = 64;  // 16 (timestep) + 16 (guidance) + 32 (the vector's index)

  // model.py:205-221, under no_grad: each of the 3·singles + 12·doubles + 2 vectors' input row is
  // [timestep_embedding(t, 16), timestep_embedding(0, 16), timestep_embedding(index, 32)] (each x1000 inside,
  // float32), cast to the weights' dtype (`dtype`: the model's, a quantized Linear's dequantized one — quanto's
  // QTensor reports it as its dtype), through the approximator: [B, rows, D].
  torch::Tensor modulations(const torch::Tensor& t, int64_t batch, torch::ScalarType dtype) {
    torch::NoGradGuard no_grad;
    const int64_t rows = 3 * spec_.single_blocks + 12 * spec_.double_blocks + 2;
    const auto f = torch::TensorOptions().dtype(torch::kFloat).device(t.device());
    const torch::Tensor tg = torch::cat(
        {timestep_embedding(t.to(torch::kFloat) * 1000, 16), timestep_embedding(torch::zeros({batch}, f), 16)}, 1);
    const torch::Tensor index =
        timestep_embedding(torch::arange(rows, f) * 1000, 32).unsqueeze(0).repeat({batch, 1, 1});
    torch::Tensor x = torch::cat({tg.unsqueeze(1).repeat({1, rows, 1}), index}, -1).to(dtype);
    x = in_proj(x);
    for (size_t i = 0; i < layers.size(); ++i) x = x + layers[i](norms[i](x));
    return out_proj(x);
  }

  // model.py:227-250: the prompt's tokens and, after them, one padding token (modify_mask_to_attend_padding,
  // attn_padding 1), then every image token; the pairs (query, key) that are allowed in any sample of the
  // batch (txt_img_mask.float().T @ txt_img_mask.float(): a union over the batch), repeated to
  // [B, heads, L, L] as float32, then int32, then bool — each step a tensor of its own, as AI Toolkit's
  // chain holds them. `text_mask` [B, T] (undefined: every row a token).
  torch::Tensor attention_mask(const torch::Tensor& text_mask, int64_t batch, int64_t n_txt, int64_t n_img,
                               const torch::Device& device) const {
    torch::NoGradGuard no_grad;
    const auto f = torch::TensorOptions().dtype(torch::kFloat).device(device);
    torch::Tensor tokens = torch::ones({batch, n_txt + n_img}, f);
    if (text_mask.defined() && !device.is_meta()) {
      const torch::Tensor lengths = text_mask.to(torch::kCPU, torch::kFloat).sum(1).to(torch::kLong);
      torch::Tensor rows = torch::zeros({batch, n_txt}, torch::kFloat);
      for (int64_t i = 0; i < batch; ++i)
        rows[i].narrow(0, 0, std::min(lengths[i].item<int64_t>() + 1, n_txt)).fill_(1);
      tokens.narrow(1, 0, n_txt).copy_(rows);
    }
    const torch::Tensor pairs = tokens.t().matmul(tokens);
    torch::Tensor repeated = pairs.unsqueeze(0).unsqueeze(0).repeat({batch, spec_.heads, 1, 1});
    torch::Tensor ints = repeated.to(torch::kInt);
    repeated.reset();
    return ints.to(torch::kBool);
  }

  Linear img_in{nullptr}, txt_in{nullptr}, in_proj{nullptr}, out_proj{nullptr}, final_linear{nullptr};
  std::vector<TwoLayerMlp> layers;
  std::vector<ScaleNorm> norms;
};

}  // namespace

std::shared_ptr<DiffusionTransformer> build_transformer(const ModelSpec& spec, const torch::TensorOptions& options) {
  return std::make_shared<ChromaTransformer>(spec, options);
}

}  // namespace gclab::model::chroma
