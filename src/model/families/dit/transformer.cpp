// The DiT transformer (facebookresearch/DiT models.py, diffusers DiTTransformer2DModel).
#include <algorithm>
#include <array>

#include "gclab/nn/meta_kernels.h"
#include "model/transformer_parts.h"

namespace gclab::model::dit {
namespace {

class DiTTransformer : public DiffusionTransformer {
 public:
  DiTTransformer(const ModelSpec& s, const torch::TensorOptions& o) : DiffusionTransformer(s) {
    const int64_t d = s.hidden;
    x_embedder = PatchConv(*this, "x_embedder.proj", s.latent_channels, d, s.patch, o);
    t_embedder = TwoLayerMlp(*this, "t_embedder.mlp.0", "t_embedder.mlp.2", 256, d, d, o);
    // One extra row: the "null" class that classifier-free guidance drops labels to.
    y_table = holder_at(*this, "y_embedder")
                  .register_parameter("embedding_table", nn::normal_parameter({s.num_classes + 1, d}, 0.02, o));
    for (int i = 0; i < s.single_blocks; ++i)
      add_block("blocks." + std::to_string(i), std::make_shared<DiTBlock>(d, s.heads, s.mlp_hidden, o));
    final_linear = register_at(*this, "final_layer.linear", Linear(d, s.patch * s.patch * s.out_channels, true, o));
    final_adaLN = register_at(*this, "final_layer.adaLN_modulation.1", Linear(d, 2 * d, true, o));
  }

  torch::Tensor forward(const ModelInputs& in) override {
    const int64_t p = spec_.patch, h = in.latents.size(2), w = in.latents.size(3);
    torch::Tensor x = x_embedder(in.latents);
    x = x + sincos_2d(h / p, w / p, spec_.hidden, x.device()).to(x.scalar_type()).unsqueeze(0);
    torch::Tensor labels = in.class_labels.defined() ? in.class_labels
                                                     : torch::full({x.size(0)}, spec_.num_classes,
                                                                   torch::dtype(torch::kLong).device(x.device()));
    const torch::Tensor c =
        t_embedder(timestep_embedding(in.timestep * 1000, 256).to(x.scalar_type())) + nn::index_rows(y_table, labels);
    for (size_t b = 0; b < blocks().size(); ++b) x = call_block(b, {x, c})[0];
    const auto ss = final_adaLN(torch::silu(c)).chunk(2, 1);  // shift, scale
    return unpatchify(final_linear(modulate(layer_norm(x), ss[0], ss[1])), h, w, p, spec_.out_channels, true);
  }

 private:
  PatchConv x_embedder;
  TwoLayerMlp t_embedder;
  torch::Tensor y_table;
  Linear final_linear{nullptr}, final_adaLN{nullptr};
};

}  // namespace

std::shared_ptr<DiffusionTransformer> build_transformer(const ModelSpec& spec, const torch::TensorOptions& options) {
  return std::make_shared<DiTTransformer>(spec, options);
}

}  // namespace gclab::model::dit
