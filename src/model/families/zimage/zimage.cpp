// Z-Image (and Z-Image-Turbo): Tongyi-MAI/Z-Image-Turbo's transformer/config.json; diffusers'
// ZImageTransformer2DModel and ZImagePipeline; AI Toolkit's z_image.py.
#include <algorithm>
#include <nlohmann/json.hpp>

#include "gclab/model/registry.h"

namespace gclab::model {
namespace zimage {
std::shared_ptr<DiffusionTransformer> build_transformer(const ModelSpec& spec, const torch::TensorOptions& options);
std::shared_ptr<const text::TextPipeline> text_pipeline();
}  // namespace zimage

namespace {

// AI Toolkit passes g' = max(0, g - 1) to ZImagePipeline ("CFG is 0 normalized for this model", z_image.py
// generate_single_image), which guides c + g' (c - u) when g' > 0: so only when g > 1, both prompts in one
// batch.
class ZImageCfg final : public Guidance {
 public:
  torch::Tensor combine(const torch::Tensor& cond, const torch::Tensor& uncond, double g) const override {
    return cond + (g - 1) * (cond - uncond);
  }
};

const Family kZImageId("zimage");  // the registry's key: this folder's name

// Z-Image's adaLN input is min(width, 256) wide; the timestep MLP's middle is 1024 at every width
// (diffusers ZImageTransformer2DModel: TimestepEmbedder(min(dim, 256), mid_size=1024)).
int64_t adaln_dim(int64_t hidden) { return std::min<int64_t>(hidden, 256); }

ModelSpec zimage_preset(const std::string& preset) {
  ModelSpec s;
  s.preset = preset;
  s.family = kZImageId;
  s.hidden = 3840, s.heads = 30, s.head_dim = 128, s.mlp_hidden = 10240;  // int(3840 / 3 * 8)
  s.single_blocks = 30, s.refiner_blocks = 2;
  s.latent_channels = 16, s.out_channels = 16, s.patch = 2;
  s.text_dim = 2560, s.max_text_tokens = 512;
  s.rope_axes = {32, 48, 48}, s.rope_theta = 256;
  s.adaln_dim = adaln_dim(s.hidden), s.t_embed_mid = 1024;
  // z_image.py:81-82 "8 for the VAE, 2 for patch size"; generate_single_image rounds previews to it
  // (:358-360).
  s.divisibility = 16, s.preview_divisibility = 16;
  return s;
}

class ZImage final : public ModelFamily {
 public:
  Family id() const override { return kZImageId; }
  // z_image.py:461-462, and its LoRA keys renamed before saving (z_image.py:467-472).
  std::string base_model_version(const std::string&) const override { return "zimage"; }
  std::string lora_file_key(const std::string& module_path) const override { return "diffusion_model." + module_path; }
  // load_training_adapter (z_image.py:84-165): merged in, inverted while sampling.
  bool takes_assistant_adapter(const std::string&) const override { return true; }
  // ZImageModel.load_model (extensions_built_in/diffusion_models/z_image/z_image.py:224-228): with an assistant
  // adapter the transformer is quantized after the merge, and a qtype of qfloat8 becomes float8 first.
  std::string resolve_model_config(config::ModelConfig& model) const override {
    if (!model.assistant_lora_path || model.qtype != config::QType::qfloat8) return {};
    model.qtype = config::QType::float8;
    return "qfloat8 becomes float8 with an assistant adapter, as AI Toolkit's Z-Image model class makes it "
           "(the transformer is quantized after the adapter is merged)";
  }
  // z_image.py:464-465: adapters on the main `layers`, not on the noise and context refiners.
  std::vector<std::string> lora_block_names() const override { return {"layers"}; }
  // ZImageTransformer2DModel.get_quantization_exclude_modules (toolkit/models/v2/z_image.py:18-35, read by
  // OstrisModelMixin.quantize_, _mixin.py:236-266): the embedders and the final layer stay in their dtype;
  // its loader passes no quantize_kwargs.
  config::QuantizeKwargs quantization_filter(const config::ModelConfig&) const override {
    return {{}, {"t_embedder*", "cap_embedder*", "all_x_embedder*", "all_final_layer*", "siglip_embedder*"}};
  }
  std::shared_ptr<DiffusionTransformer> build_transformer(const ModelSpec& spec,
                                                          const torch::TensorOptions& options) const override {
    return zimage::build_transformer(spec, options);
  }
  std::string describe_blocks(const ModelSpec& s) const override {
    return std::to_string(s.refiner_blocks) + " noise + " + std::to_string(s.refiner_blocks) + " context refiners + " +
           std::to_string(s.single_blocks) + " single-stream";
  }

  // quantize_model per block, the transformer on the device after the text encoder (under low_vram
  // z_image.py waits for its first use); the UI's `zimage:turbo` tag, or a Turbo name, picks Turbo.
  std::vector<ArchFacts> archs() const override {
    const auto L = TransformerLoading::per_block;
    return {{"zimage", kZImageId, "zimage", false, "turbo", "zimage-turbo", L, {"Z-Image"}},
            {"tiny-zimage", kZImageId, "tiny-zimage", true, "", "", L, {}}};
  }

  std::vector<ModelSpec> presets() const override {
    const ModelSpec base = zimage_preset("zimage");
    ModelSpec tiny = families_shared::tiny(base, "tiny-zimage");
    tiny.single_blocks = 2, tiny.refiner_blocks = 1, tiny.mlp_hidden = 341, tiny.max_text_tokens = 64;
    tiny.adaln_dim = adaln_dim(tiny.hidden);
    return {base, zimage_preset("zimage-turbo"), tiny};
  }

  // FLUX.1's AutoencoderKL configuration.
  // FLUX.1's AutoencoderKL (its vae/ config.json is FLUX's).
  vae::AutoencoderConfig autoencoder(const ModelSpec& spec) const override {
    return spec.tiny ? vae::AutoencoderKLConfig{}.shrunk() : vae::AutoencoderKLConfig{};
  }
  std::shared_ptr<const text::TextPipeline> text_pipeline() const override { return zimage::text_pipeline(); }
  // z_image.py: the whole encoder, under quantize_te, as qtype_te.
  TextEncoderQuantization text_encoder_quantization() const override { return {}; }
  // z_image.py scheduler_config: static shift 3.0.
  FlowSchedule flow_schedule() const override {
    FlowSchedule s;
    s.dynamic = false, s.shift = 3.0;
    return s;
  }
  std::shared_ptr<const Guidance> preview_guidance(const ModelSpec&, bool) const override {
    return std::make_shared<ZImageCfg>();
  }

  // The prompt's own length, at most max_text_tokens; the transformer pads the caption to a multiple of 32
  // with its learned cap_pad_token.
  int64_t encoder_tokens(const ModelSpec& spec, int64_t prompt_tokens) const override {
    return std::min(prompt_tokens, spec.max_text_tokens);
  }
  int64_t sequence_rows(const ModelSpec&, int64_t pipeline_rows) const override {
    return std::max<int64_t>(pipeline_rows, 1);
  }
  int64_t text_tokens(const ModelSpec&, int64_t encoder_rows) const override { return (encoder_rows + 31) / 32 * 32; }

  std::string diffusers_class() const override { return "ZImageTransformer2DModel"; }
  // diffusers' ZImageTransformer2DModel.named_modules() order of its Linears (as diffusers 0.42 builds it).
  std::vector<std::string> diffusers_linear_order() const override {
    return {"all_x_embedder.2-1",
            "all_final_layer.2-1.linear",
            "all_final_layer.2-1.adaLN_modulation.1",
            "noise_refiner.*.attention.to_q",
            "noise_refiner.*.attention.to_k",
            "noise_refiner.*.attention.to_v",
            "noise_refiner.*.attention.to_out.0",
            "noise_refiner.*.feed_forward.w1",
            "noise_refiner.*.feed_forward.w2",
            "noise_refiner.*.feed_forward.w3",
            "noise_refiner.*.adaLN_modulation.0",
            "context_refiner.*.attention.to_q",
            "context_refiner.*.attention.to_k",
            "context_refiner.*.attention.to_v",
            "context_refiner.*.attention.to_out.0",
            "context_refiner.*.feed_forward.w1",
            "context_refiner.*.feed_forward.w2",
            "context_refiner.*.feed_forward.w3",
            "t_embedder.mlp.0",
            "t_embedder.mlp.2",
            "cap_embedder.1",
            "layers.*.attention.to_q",
            "layers.*.attention.to_k",
            "layers.*.attention.to_v",
            "layers.*.attention.to_out.0",
            "layers.*.feed_forward.w1",
            "layers.*.feed_forward.w2",
            "layers.*.feed_forward.w3",
            "layers.*.adaLN_modulation.0"};
  }
  nlohmann::ordered_json diffusers_config(const ModelSpec& s) const override {
    return {{"_class_name", "ZImageTransformer2DModel"},
            {"all_patch_size", {s.patch}},
            {"all_f_patch_size", {1}},
            {"in_channels", s.latent_channels},
            {"dim", s.hidden},
            {"n_layers", s.single_blocks},
            {"n_refiner_layers", s.refiner_blocks},
            {"n_heads", s.heads},
            {"n_kv_heads", s.heads},
            {"norm_eps", 1e-5},
            {"qk_norm", true},
            {"cap_feat_dim", s.text_dim},
            {"rope_theta", s.rope_theta},
            {"t_scale", 1000.0},
            {"axes_dims", s.rope_axes},
            {"axes_lens", {1536, 512, 512}}};
  }
  void read_diffusers_config(ModelSpec& s, const nlohmann::json& c) const override {
    using families_shared::config_int;
    s.hidden = config_int(c, "dim", s.hidden);
    s.heads = config_int(c, "n_heads", s.heads);
    s.head_dim = s.hidden / s.heads;
    s.mlp_hidden = static_cast<int64_t>(static_cast<double>(s.hidden) / 3 * 8);  // int(dim / 3 * 8)
    s.single_blocks = static_cast<int>(config_int(c, "n_layers", s.single_blocks));
    s.refiner_blocks = static_cast<int>(config_int(c, "n_refiner_layers", s.refiner_blocks));
    s.text_dim = config_int(c, "cap_feat_dim", s.text_dim);
    s.rope_theta = c.value("rope_theta", s.rope_theta);
    if (c.contains("axes_dims")) s.rope_axes = c["axes_dims"].get<std::vector<int64_t>>();
  }
  void read_tensor_shapes(ModelSpec& s, const TensorShapes& t) const override {
    s.hidden = t.dim("all_x_embedder.2-1.weight", 0);
    s.head_dim = t.dim("layers.0.attention.norm_q.weight", 0);
    s.mlp_hidden = t.dim("layers.0.feed_forward.w1.weight", 0);
    s.single_blocks = t.count("layers"), s.refiner_blocks = t.count("noise_refiner");
    s.text_dim = t.dim("cap_embedder.1.weight", 1);
  }
  void complete_shape(ModelSpec& s) const override { s.adaln_dim = adaln_dim(s.hidden); }
};

}  // namespace

const ModelFamily& zimage_family() {
  static const ZImage family;
  return family;
}

}  // namespace gclab::model
