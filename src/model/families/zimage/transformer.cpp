// The Z-Image transformer (diffusers ZImageTransformer2DModel).
#include <algorithm>
#include <array>

#include "model/transformer_parts.h"

namespace gclab::model::zimage {
namespace {

// Z-Image single-stream block (ZImageTransformerBlock): sandwich RMSNorms around attention and the SwiGLU
// MLP, tanh gates; without modulation (the context refiner) no adaLN input.
// Inputs {x, adaln, cos, sin} (modulated) or {x, cos, sin} -> {x}.
class ZImageBlock : public TransformerBlock {
 public:
  std::vector<Linear> modulation_linears() override {
    return adaLN ? std::vector<Linear>{adaLN} : std::vector<Linear>{};
  }
  ZImageBlock(int64_t dim, int64_t heads, int64_t mlp_hidden, int64_t adaln_dim, bool modulation,
              const torch::TensorOptions& options);
  Tensors forward_block(const Tensors& inputs, const SubBlockRunner& run) override;

 private:
  bool modulation_;
  SelfAttention attention{nullptr};
  Linear w1{nullptr}, w2{nullptr}, w3{nullptr};  // feed_forward.w1/w2/w3: w2(silu(w1 x) * w3 x)
  RMSNorm attention_norm1{nullptr}, attention_norm2{nullptr}, ffn_norm1{nullptr}, ffn_norm2{nullptr};
  Linear adaLN{nullptr};  // adaLN_modulation.0
};

ZImageBlock::ZImageBlock(int64_t dim, int64_t heads, int64_t mlp_hidden, int64_t adaln_dim, bool modulation,
                         const torch::TensorOptions& options)
    : modulation_(modulation) {
  const double eps = 1e-5;  // Z-Image's norm_eps
  attention = register_module("attention", SelfAttention(dim, heads, /*bias=*/false, /*out_proj=*/true, eps, options));
  w1 =
      register_at(*this, "feed_forward.w1", Linear(LinearOptions(dim, mlp_hidden).bias(false).tensor_options(options)));
  w2 =
      register_at(*this, "feed_forward.w2", Linear(LinearOptions(mlp_hidden, dim).bias(false).tensor_options(options)));
  w3 =
      register_at(*this, "feed_forward.w3", Linear(LinearOptions(dim, mlp_hidden).bias(false).tensor_options(options)));
  attention_norm1 = register_module("attention_norm1", RMSNorm(dim, eps, true, options));
  ffn_norm1 = register_module("ffn_norm1", RMSNorm(dim, eps, true, options));
  attention_norm2 = register_module("attention_norm2", RMSNorm(dim, eps, true, options));
  ffn_norm2 = register_module("ffn_norm2", RMSNorm(dim, eps, true, options));
  if (modulation)
    adaLN = register_at(*this, "adaLN_modulation.0", Linear(LinearOptions(adaln_dim, 4 * dim).tensor_options(options)));
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

class ZImageTransformer : public DiffusionTransformer {
 public:
  ZImageTransformer(const ModelSpec& s, const torch::TensorOptions& o) : DiffusionTransformer(s) {
    const int64_t d = s.hidden, patch_dim = s.latent_channels * s.patch * s.patch;
    x_embedder = register_at(*this, "all_x_embedder.2-1", Linear(LinearOptions(patch_dim, d).tensor_options(o)));
    final_linear =
        register_at(*this, "all_final_layer.2-1.linear", Linear(LinearOptions(d, patch_dim).tensor_options(o)));
    final_adaLN = register_at(*this, "all_final_layer.2-1.adaLN_modulation.1",
                              Linear(LinearOptions(s.adaln_dim, d).tensor_options(o)));
    t_embedder = TwoLayerMlp(*this, "t_embedder.mlp.0", "t_embedder.mlp.2", 256, s.t_embed_mid, s.adaln_dim, o);
    cap_norm = register_at(*this, "cap_embedder.0", RMSNorm(s.text_dim, 1e-5, true, o));
    cap_linear = register_at(*this, "cap_embedder.1", Linear(LinearOptions(s.text_dim, d).tensor_options(o)));
    x_pad_token = register_parameter("x_pad_token", nn::normal_parameter({1, d}, 0.02, o));
    cap_pad_token = register_parameter("cap_pad_token", nn::normal_parameter({1, d}, 0.02, o));
    for (int i = 0; i < s.refiner_blocks; ++i)
      add_block("noise_refiner." + std::to_string(i),
                std::make_shared<ZImageBlock>(d, s.heads, s.mlp_hidden, s.adaln_dim, true, o));
    for (int i = 0; i < s.refiner_blocks; ++i)
      add_block("context_refiner." + std::to_string(i),
                std::make_shared<ZImageBlock>(d, s.heads, s.mlp_hidden, s.adaln_dim, false, o));
    for (int i = 0; i < s.single_blocks; ++i)
      add_block("layers." + std::to_string(i),
                std::make_shared<ZImageBlock>(d, s.heads, s.mlp_hidden, s.adaln_dim, true, o));
  }

  // gclab's flow convention in, Z-Image's out: the real model takes t = 1 - sigma and predicts x0 - noise
  // (its pipeline passes (1000 - t) / 1000 and negates the output), so the input is flipped here and the
  // prediction negated, and training and sampling see the velocity noise - x0 as for every family.
  torch::Tensor forward(const ModelInputs& in) override {
    const int64_t p = spec_.patch, h = in.latents.size(2), w = in.latents.size(3), gh = h / p, gw = w / p;
    const int64_t n_img = gh * gw, n_img_padded = padded(n_img), n_cap = in.text.size(1), n_cap_padded = padded(n_cap);
    torch::Tensor x = x_embedder(patchify(in.latents, p, /*channels_last=*/true));
    // Both sequences are padded to a multiple of 32 (SEQ_MULTI_OF) with their learned pad tokens.
    x = pad_with(x, x_pad_token, n_img_padded);
    torch::Tensor cap = pad_with(cap_linear(cap_norm(in.text)), cap_pad_token, n_cap_padded);
    const torch::Tensor adaln = t_embedder(timestep_embedding((1.0 - in.timestep) * 1000, 256).to(x.scalar_type()));
    // Positions: caption token j at (1 + j, 0, 0), its padding included; the image at frame
    // n_cap_padded + 1, (row, column); the image's padding at 0.
    std::vector<std::array<int64_t, 3>> cap_ids, img_ids;
    for (int64_t j = 0; j < n_cap_padded; ++j) cap_ids.push_back({1 + j, 0, 0});
    add_image_ids(img_ids, n_cap_padded + 1, gh, gw);
    img_ids.resize(static_cast<size_t>(n_img_padded), {0, 0, 0});
    const auto [img_cos, img_sin] = rope_cos_sin(ids_tensor(img_ids, x.device()), spec_.rope_axes, spec_.rope_theta);
    const auto [cap_cos, cap_sin] = rope_cos_sin(ids_tensor(cap_ids, x.device()), spec_.rope_axes, spec_.rope_theta);
    size_t b = 0;
    for (int i = 0; i < spec_.refiner_blocks; ++i, ++b) x = call_block(b, {x, adaln, img_cos, img_sin})[0];
    for (int i = 0; i < spec_.refiner_blocks; ++i, ++b) cap = call_block(b, {cap, cap_cos, cap_sin})[0];
    torch::Tensor unified = torch::cat({x, cap}, 1);
    const torch::Tensor cos = torch::cat({img_cos, cap_cos}, 0), sin = torch::cat({img_sin, cap_sin}, 0);
    for (; b < blocks().size(); ++b) unified = call_block(b, {unified, adaln, cos, sin})[0];
    // FinalLayer: LN(x) * (1 + adaLN(SiLU(c))), then the linear projection back to patches.
    const torch::Tensor scale = 1.0 + final_adaLN(torch::silu(adaln));
    torch::Tensor out = -final_linear(layer_norm(unified.narrow(1, 0, n_img)) * scale.unsqueeze(1));
    return unpatchify(out, h, w, p, spec_.out_channels, /*channels_last=*/true);
  }

 private:
  Linear x_embedder{nullptr}, final_linear{nullptr}, final_adaLN{nullptr}, cap_linear{nullptr};
  RMSNorm cap_norm{nullptr};
  TwoLayerMlp t_embedder;
  torch::Tensor x_pad_token, cap_pad_token;

  static int64_t padded(int64_t n) { return (n + 31) / 32 * 32; }
  // The sequence with `token` appended up to `length` tokens.
  static torch::Tensor pad_with(const torch::Tensor& seq, const torch::Tensor& token, int64_t length) {
    if (length == seq.size(1)) return seq;
    const auto pad = token.to(seq.scalar_type()).unsqueeze(0).expand({seq.size(0), length - seq.size(1), -1});
    return torch::cat({seq, pad}, 1);
  }
};

}  // namespace

std::shared_ptr<DiffusionTransformer> build_transformer(const ModelSpec& spec, const torch::TensorOptions& options) {
  return std::make_shared<ZImageTransformer>(spec, options);
}

}  // namespace gclab::model::zimage
