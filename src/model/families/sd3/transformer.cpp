// The SD3.5 transformer (diffusers SD3Transformer2DModel).
#include <algorithm>
#include <array>

#include "model/transformer_parts.h"

namespace gclab::model::sd3 {
namespace {

class SD3Transformer : public DiffusionTransformer {
 public:
  SD3Transformer(const ModelSpec& s, const torch::TensorOptions& o) : DiffusionTransformer(s) {
    const int64_t d = s.hidden;
    pos_embed = PatchConv(*this, "pos_embed.proj", s.latent_channels, d, s.patch, o);
    timestep_embedder = TwoLayerMlp(*this, "time_text_embed.timestep_embedder.linear_1",
                                    "time_text_embed.timestep_embedder.linear_2", 256, d, d, o);
    text_embedder = TwoLayerMlp(*this, "time_text_embed.text_embedder.linear_1",
                                "time_text_embed.text_embedder.linear_2", s.pooled_dim, d, d, o);
    context_embedder = register_module("context_embedder", Linear(s.text_dim, d, true, o));
    for (int i = 0; i < s.double_blocks; ++i)
      add_block("transformer_blocks." + std::to_string(i),
                std::make_shared<SD3JointBlock>(d, s.heads, s.mlp_hidden, i == s.double_blocks - 1, o));
    norm_out_linear = register_at(*this, "norm_out.linear", Linear(d, 2 * d, true, o));
    proj_out = register_module("proj_out", Linear(d, s.patch * s.patch * s.out_channels, true, o));
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
