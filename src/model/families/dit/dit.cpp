// DiT-XL/2 (facebookresearch/DiT, diffusers' DiTTransformer2DModel): class-conditional, gclab's own
// addition (not in AI Toolkit).
#include <nlohmann/json.hpp>

#include "gclab/config/user_error.h"
#include "gclab/model/registry.h"

namespace gclab::model {
namespace dit {
std::shared_ptr<DiffusionTransformer> build_transformer(const ModelSpec& spec, const torch::TensorOptions& options);
}  // namespace dit

namespace {

const Family kDitId("dit");  // the registry's key: this folder's name

ModelSpec dit_xl2() {
  ModelSpec s;
  s.preset = "dit-xl2";
  s.family = kDitId;
  s.hidden = 1152, s.heads = 16, s.head_dim = 72, s.mlp_hidden = 4 * 1152;
  s.single_blocks = 28;
  s.latent_channels = 4, s.out_channels = 8, s.patch = 2;  // SD VAE latents; learned sigma doubles the output
  s.num_classes = 1000;
  s.divisibility = 16, s.preview_divisibility = 16;  // gclab's own: 2x2 patches of an 8x latent
  return s;
}

class Dit final : public ModelFamily {
 public:
  Family id() const override { return kDitId; }
  std::shared_ptr<DiffusionTransformer> build_transformer(const ModelSpec& spec,
                                                          const torch::TensorOptions& options) const override {
    return dit::build_transformer(spec, options);
  }
  std::string describe_blocks(const ModelSpec& s) const override { return std::to_string(s.single_blocks) + " DiT"; }

  std::vector<ArchFacts> archs() const override {
    const auto L = TransformerLoading::on_device_unless_low_vram;
    return {{"dit", kDitId, "dit-xl2", false, "", "", L, {"DiT-XL"}},
            {"tiny-dit", kDitId, "tiny-dit", true, "", "", L, {}}};
  }

  std::vector<ModelSpec> presets() const override {
    const ModelSpec xl = dit_xl2();
    ModelSpec tiny = families_shared::tiny(xl, "tiny-dit");
    tiny.single_blocks = 2, tiny.num_classes = 10;
    return {xl, tiny};
  }

  // The SD VAE; no text encoder (class labels).
  // The SD VAE DiTPipeline decodes with (sd-vae-ft-ema): 4 channels, quant convs, scaling 0.18215, no
  // shift, 256-pixel tiles (83,653,863 parameters).
  vae::AutoencoderConfig autoencoder(const ModelSpec& spec) const override {
    vae::AutoencoderKLConfig c;
    c.latent_channels = 4, c.use_quant_conv = c.use_post_quant_conv = true;
    c.scaling_factor = 0.18215, c.shift_factor = 0, c.sample_size = 256;
    return spec.tiny ? c.shrunk() : c;
  }
  std::shared_ptr<const text::TextPipeline> text_pipeline() const override { return nullptr; }
  // DiTPipeline's CFG on the class label: both in one batch.
  std::shared_ptr<const Guidance> preview_guidance(const ModelSpec&, bool) const override {
    return std::make_shared<Guidance>();
  }

  // A class label, no text sequence.
  int64_t encoder_tokens(const ModelSpec&, int64_t) const override { return 0; }
  int64_t sequence_rows(const ModelSpec&, int64_t) const override { return 0; }

  std::string diffusers_class() const override { return "DiTTransformer2DModel"; }
  nlohmann::ordered_json diffusers_config(const ModelSpec& s) const override {
    return {{"_class_name", "DiTTransformer2DModel"},
            {"num_attention_heads", s.heads},
            {"attention_head_dim", s.head_dim},
            {"in_channels", s.latent_channels},
            {"out_channels", s.out_channels},
            {"num_layers", s.single_blocks},
            {"sample_size", 32},
            {"patch_size", s.patch},
            {"num_embeds_ada_norm", s.num_classes}};
  }
  void read_diffusers_config(ModelSpec& s, const nlohmann::json& c) const override {
    using families_shared::config_int;
    families_shared::read_mmdit_config(s, c);
    s.single_blocks = static_cast<int>(config_int(c, "num_layers", s.single_blocks));
    s.latent_channels = config_int(c, "in_channels", s.latent_channels);
    s.out_channels = config_int(c, "out_channels", s.out_channels);
    s.num_classes = config_int(c, "num_embeds_ada_norm", s.num_classes);
  }
  void read_tensor_shapes(ModelSpec&, const TensorShapes& t) const override {
    throw UserError(t.file() +
                    ": a single DiT weights file carries no shape gclab reads; use a diffusers "
                    "folder (transformer/config.json beside the weights)");
  }
};

}  // namespace

const ModelFamily& dit_family() {
  static const Dit family;
  return family;
}

}  // namespace gclab::model
