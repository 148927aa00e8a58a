// The SD3.5 transformer (diffusers SD3Transformer2DModel).
#include <algorithm>
#include <array>

#include "model/transformer_parts.h"

namespace gclab::model::sd3 {
namespace {

// SD3 / SD3.5 joint block (JointTransformerBlock); the last block's text stream is pre-only (its output is
// not used). Inputs {img, txt, temb} -> {img, txt}.
class SD3JointBlock : public TransformerBlock {
 public:
  std::vector<Linear> modulation_linears() override { return {norm1_linear, norm1_context_linear}; }
  std::vector<Linear> text_stream_linears() override {
    std::vector<Linear> out = attn->text_linears();
    if (ff_context)
      for (const Linear& l : ff_context->linears()) out.push_back(l);
    return out;
  }
  SD3JointBlock(int64_t dim, int64_t heads, int64_t mlp_hidden, bool context_pre_only,
                const torch::TensorOptions& options);
  Tensors forward_block(const Tensors& inputs, const SubBlockRunner& run) override;

 private:
  bool context_pre_only_;
  Linear norm1_linear{nullptr}, norm1_context_linear{nullptr};
  JointAttention attn{nullptr};
  GeluFeedForward ff{nullptr}, ff_context{nullptr};
};

SD3JointBlock::SD3JointBlock(int64_t dim, int64_t heads, int64_t mlp_hidden, bool context_pre_only,
                             const torch::TensorOptions& options)
    : context_pre_only_(context_pre_only) {
  norm1_linear = register_at(*this, "norm1.linear", Linear(LinearOptions(dim, 6 * dim).tensor_options(options)));
  // The last block's text stream only feeds this block's attention: AdaLayerNormContinuous (scale, shift).
  norm1_context_linear =
      register_at(*this, "norm1_context.linear",
                  Linear(LinearOptions(dim, (context_pre_only ? 2 : 6) * dim).tensor_options(options)));
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

class SD3Transformer : public DiffusionTransformer {
 public:
  SD3Transformer(const ModelSpec& s, const torch::TensorOptions& o) : DiffusionTransformer(s) {
    const int64_t d = s.hidden;
    pos_embed = PatchConv(*this, "pos_embed.proj", s.latent_channels, d, s.patch, o);
    timestep_embedder = TwoLayerMlp(*this, "time_text_embed.timestep_embedder.linear_1",
                                    "time_text_embed.timestep_embedder.linear_2", 256, d, d, o);
    text_embedder = TwoLayerMlp(*this, "time_text_embed.text_embedder.linear_1",
                                "time_text_embed.text_embedder.linear_2", s.pooled_dim, d, d, o);
    context_embedder = register_module("context_embedder", Linear(LinearOptions(s.text_dim, d).tensor_options(o)));
    for (int i = 0; i < s.double_blocks; ++i)
      add_block("transformer_blocks." + std::to_string(i),
                std::make_shared<SD3JointBlock>(d, s.heads, s.mlp_hidden, i == s.double_blocks - 1, o));
    norm_out_linear = register_at(*this, "norm_out.linear", Linear(LinearOptions(d, 2 * d).tensor_options(o)));
    proj_out =
        register_module("proj_out", Linear(LinearOptions(d, s.patch * s.patch * s.out_channels).tensor_options(o)));
  }

  torch::Tensor forward(const ModelInputs& in) override {
    const int64_t p = spec_.patch, h = in.latents.size(2), w = in.latents.size(3), gh = h / p, gw = w / p;
    TORCH_CHECK(gh <= spec_.pos_embed_max && gw <= spec_.pos_embed_max, spec_.preset, ": a ", gh, "x", gw,
                " patch grid exceeds the position embedding's ", spec_.pos_embed_max);
    // PatchEmbed: the fixed sin-cos table of the largest grid, centre-cropped to this one.
    const double scale = static_cast<double>(spec_.pos_embed_max) / static_cast<double>(spec_.sd3_base_size);
    torch::Tensor img = pos_embed(in.latents);
    img = img + sincos_2d(gh, gw, spec_.hidden, img.device(), scale, (spec_.pos_embed_max - gh) / 2,
                          (spec_.pos_embed_max - gw) / 2)
                    .to(img.scalar_type())
                    .unsqueeze(0);  // the table is a temporary: nothing holds it through the blocks
    torch::Tensor txt = context_embedder(in.text);
    const torch::Tensor temb =
        timestep_embedder(timestep_embedding(in.timestep * 1000, 256).to(img.scalar_type())) + text_embedder(in.pooled);
    for (size_t b = 0; b < blocks().size(); ++b) {
      const Tensors out = call_block(b, {img, txt, temb});
      img = out[0], txt = out[1];
    }
    return unpatchify(proj_out(norm_out(norm_out_linear, img, temb)), h, w, p, spec_.out_channels, true);
  }

 private:
  PatchConv pos_embed;
  TwoLayerMlp timestep_embedder, text_embedder;
  Linear context_embedder{nullptr}, norm_out_linear{nullptr}, proj_out{nullptr};
};

}  // namespace

std::shared_ptr<DiffusionTransformer> build_transformer(const ModelSpec& spec, const torch::TensorOptions& options) {
  return std::make_shared<SD3Transformer>(spec, options);
}

}  // namespace gclab::model::sd3
