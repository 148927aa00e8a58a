// The DiT transformer (facebookresearch/DiT models.py, diffusers DiTTransformer2DModel).
#include <algorithm>
#include <array>

#include "gclab/nn/activation.h"
#include "gclab/nn/meta_kernels.h"
#include "model/transformer_parts.h"

namespace gclab::model::dit {

using nn::attention;
namespace {

// DiT block with adaLN-Zero conditioning (DiTBlock). Inputs {x, c} -> {x}.
class DiTBlock : public TransformerBlock {
 public:
  std::vector<Linear> modulation_linears() override { return {adaLN}; }
  DiTBlock(int64_t dim, int64_t heads, int64_t mlp_hidden, const torch::TensorOptions& options);
  Tensors forward_block(const Tensors& inputs, const SubBlockRunner& run) override;

 private:
  int64_t heads_;
  Linear qkv{nullptr}, proj{nullptr}, fc1{nullptr}, fc2{nullptr}, adaLN{nullptr};
};

DiTBlock::DiTBlock(int64_t dim, int64_t heads, int64_t mlp_hidden, const torch::TensorOptions& options)
    : heads_(heads) {
  qkv = register_at(*this, "attn.qkv", Linear(LinearOptions(dim, 3 * dim).tensor_options(options)));
  proj = register_at(*this, "attn.proj", Linear(LinearOptions(dim, dim).tensor_options(options)));
  fc1 = register_at(*this, "mlp.fc1", Linear(LinearOptions(dim, mlp_hidden).tensor_options(options)));
  fc2 = register_at(*this, "mlp.fc2", Linear(LinearOptions(mlp_hidden, dim).tensor_options(options)));
  adaLN = register_at(*this, "adaLN_modulation.1", Linear(LinearOptions(dim, 6 * dim).tensor_options(options)));
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
    final_linear = register_at(*this, "final_layer.linear",
                               Linear(LinearOptions(d, s.patch * s.patch * s.out_channels).tensor_options(o)));
    final_adaLN =
        register_at(*this, "final_layer.adaLN_modulation.1", Linear(LinearOptions(d, 2 * d).tensor_options(o)));
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
