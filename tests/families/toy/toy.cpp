// An image family that lives only in the test tree (issue 30): a text-conditioned DiT — its own blocks
// (adaLN-Zero around the shared self-attention and GELU MLP), adaLN on the timestep and the caption's mean
// embedding, its own text pipeline over Qwen3, FLUX.1's autoencoder. It is one folder and one registration
// line (tests/families/registry.cpp); nothing in src/ names it, and tests/families/toy_family_test.cpp
// trains, previews, checkpoints and estimates it like a shipped family.
#include "toy/toy.h"

#include <nlohmann/json.hpp>

#include "gclab/config/user_error.h"
#include "gclab/model/registry.h"
#include "model/transformer_parts.h"

namespace gclab::model::toy {
namespace {

const Family kToyId("toy");

// Its block: adaLN-Zero modulation (shift, scale, gate for each sub-block from SiLU(c)) of the shared
// self-attention (q/k/v, RMS QK-norms, to_out.0; no rotary) and GELU(tanh) MLP over the image tokens.
// Inputs {x, c} -> {x}.
class ToyBlock : public TransformerBlock {
 public:
  ToyBlock(int64_t dim, int64_t heads, int64_t mlp_hidden, const torch::TensorOptions& o) {
    adaLN = register_at(*this, "adaLN_modulation.1", Linear(LinearOptions(dim, 6 * dim).tensor_options(o)));
    attn = register_module("attn", SelfAttention(dim, heads, /*bias=*/true, /*out_proj=*/true, 1e-6, o));
    ff = register_module("ff", GeluFeedForward(dim, mlp_hidden, o));
  }
  std::vector<Linear> modulation_linears() override { return {adaLN}; }
  Tensors forward_block(const Tensors& in, const SubBlockRunner& run) override {
    const torch::Tensor emb = adaLN(torch::silu(in.at(1)));
    const torch::Tensor h = run(SubBlock::attn,
                                [this](const Tensors& t) {
                                  const auto m = chunks(t[1], 6);
                                  const torch::Tensor a =
                                      attn(modulate(layer_norm(t[0]), m[0], m[1]), torch::Tensor(), torch::Tensor());
                                  return Tensors{t[0] + m[2].unsqueeze(1) * a};
                                },
                                {in.at(0), emb})[0];
    return run(SubBlock::mlp,
               [this](const Tensors& t) {
                 const auto m = chunks(t[1], 6);
                 return Tensors{t[0] + m[5].unsqueeze(1) * ff(modulate(layer_norm(t[0]), m[3], m[4]))};
               },
               {h, emb});
  }

 private:
  Linear adaLN{nullptr};
  SelfAttention attn{nullptr};
  GeluFeedForward ff{nullptr};
};

class ToyTransformer : public DiffusionTransformer {
 public:
  ToyTransformer(const ModelSpec& s, const torch::TensorOptions& o) : DiffusionTransformer(s) {
    const int64_t d = s.hidden, p = s.patch;
    x_embedder =
        register_at(*this, "x_embedder", Linear(LinearOptions(p * p * s.latent_channels, d).tensor_options(o)));
    t_embedder = TwoLayerMlp(*this, "t_embedder.linear_1", "t_embedder.linear_2", 256, d, d, o);
    text_proj = register_at(*this, "text_proj", Linear(LinearOptions(s.text_dim, d).tensor_options(o)));
    for (int i = 0; i < s.single_blocks; ++i)
      add_block("blocks." + std::to_string(i), std::make_shared<ToyBlock>(d, s.heads, s.mlp_hidden, o));
    final_adaLN = register_at(*this, "final_layer.adaLN", Linear(LinearOptions(d, 2 * d).tensor_options(o)));
    final_linear =
        register_at(*this, "final_layer.linear", Linear(LinearOptions(d, p * p * s.out_channels).tensor_options(o)));
  }

  // Images [B, C, H, W].
  torch::Tensor forward(const ModelInputs& in) override {
    const int64_t p = spec_.patch, h = in.latents.size(2), w = in.latents.size(3);
    torch::Tensor x = x_embedder(patchify(in.latents, p, true));
    x = x + sincos_2d(h / p, w / p, spec_.hidden, x.device()).to(x.scalar_type()).unsqueeze(0);
    const torch::Tensor c = t_embedder(timestep_embedding(in.timestep * 1000, 256).to(x.scalar_type())) +
                            text_proj(in.text.to(x.scalar_type()).mean(1));
    for (size_t b = 0; b < blocks().size(); ++b) x = call_block(b, {x, c})[0];
    const auto ss = final_adaLN(torch::silu(c)).chunk(2, 1);  // shift, scale
    torch::Tensor out = final_linear(modulate(layer_norm(x), ss[0], ss[1]));
    return unpatchify(out, h, w, p, spec_.out_channels, true);
  }

 private:
  Linear x_embedder{nullptr}, text_proj{nullptr}, final_adaLN{nullptr}, final_linear{nullptr};
  TwoLayerMlp t_embedder;
};

// Its own text pipeline: Qwen3 on the bare caption, cut and padded to the text length with the mask passed,
// the real tokens' last hidden states.
class ToyText final : public text::OneEncoderPipeline {
 public:
  ToyText() : OneEncoderPipeline(config::TextEncoderKind::qwen3) {}
  std::vector<text::PipelineCall> calls(const std::vector<const text::TextEncoderBase*>&,
                                        const text::PipelineTarget& t) const override {
    return {text::PipelineCall().max_length(t.max_tokens).pad(true).mask(true)};
  }
};

ModelSpec tiny_toy() {
  ModelSpec s;
  s.preset = "tiny-toy";
  s.family = kToyId;
  s.tiny = true;
  s.hidden = 64, s.heads = 2, s.head_dim = 32, s.mlp_hidden = 128;
  s.single_blocks = 3;
  s.latent_channels = 16, s.out_channels = 16, s.patch = 2;
  s.text_dim = 64, s.max_text_tokens = 32;
  s.divisibility = 16, s.preview_divisibility = 16;
  return s;
}

class Toy final : public ModelFamily {
 public:
  Family id() const override { return kToyId; }
  std::shared_ptr<DiffusionTransformer> build_transformer(const ModelSpec& spec,
                                                          const torch::TensorOptions& options) const override {
    return std::make_shared<ToyTransformer>(spec, options);
  }
  std::string describe_blocks(const ModelSpec& s) const override { return std::to_string(s.single_blocks) + " toy"; }
  std::vector<ArchFacts> archs() const override {
    const auto L = TransformerLoading::on_device_unless_low_vram;
    return {{"tiny-toy", kToyId, "tiny-toy", true, "", "", L, {"Toy-Image"}}};
  }
  std::vector<ModelSpec> presets() const override { return {tiny_toy()}; }

  vae::AutoencoderConfig autoencoder(const ModelSpec&) const override { return vae::AutoencoderKLConfig{}.shrunk(); }
  std::shared_ptr<const text::TextPipeline> text_pipeline() const override { return std::make_shared<ToyText>(); }
  std::shared_ptr<const Guidance> preview_guidance(const ModelSpec&, bool) const override {
    return std::make_shared<Guidance>();
  }

  int64_t encoder_tokens(const ModelSpec& spec, int64_t prompt_tokens) const override {
    return std::min(prompt_tokens, spec.max_text_tokens);
  }
  int64_t sequence_rows(const ModelSpec&, int64_t pipeline_rows) const override {
    return std::max<int64_t>(pipeline_rows, 1);
  }
  int64_t text_tokens(const ModelSpec&, int64_t) const override { return 0; }  // not in the blocks' sequence

  std::string diffusers_class() const override { return "ToyTransformer2DModel"; }
  nlohmann::ordered_json diffusers_config(const ModelSpec& s) const override {
    return {{"_class_name", "ToyTransformer2DModel"},
            {"dim", s.hidden},
            {"n_heads", s.heads},
            {"n_layers", s.single_blocks},
            {"patch_size", s.patch},
            {"cap_feat_dim", s.text_dim}};
  }
  void read_diffusers_config(ModelSpec& s, const nlohmann::json& c) const override {
    using families_shared::config_int;
    s.hidden = config_int(c, "dim", s.hidden);
    s.heads = config_int(c, "n_heads", s.heads);
    s.head_dim = s.hidden / s.heads, s.mlp_hidden = 2 * s.hidden;
    s.single_blocks = static_cast<int>(config_int(c, "n_layers", s.single_blocks));
    s.patch = config_int(c, "patch_size", s.patch);
    s.text_dim = config_int(c, "cap_feat_dim", s.text_dim);
  }
  void read_tensor_shapes(ModelSpec&, const TensorShapes& t) const override {
    throw UserError(t.file() + ": the toy family reads its shape from a config.json only");
  }
};

}  // namespace

const ModelFamily& toy_family() {
  static const Toy family;
  return family;
}

}  // namespace gclab::model::toy
