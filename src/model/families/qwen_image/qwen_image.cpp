// Qwen-Image and Qwen-Image-Edit (-2509, -2511): Qwen/Qwen-Image's transformer/config.json; diffusers'
// QwenImageTransformer2DModel, QwenImagePipeline, QwenImageEditPipeline and QwenImageEditPlusPipeline.
#include <nlohmann/json.hpp>

#include "gclab/model/registry.h"

namespace gclab::model {
namespace qwen_image {
std::shared_ptr<DiffusionTransformer> build_transformer(const ModelSpec& spec, const torch::TensorOptions& options);
std::shared_ptr<const text::TextPipeline> text_pipeline();
}  // namespace qwen_image

namespace {

const Family kQwenImageId("qwen_image");  // the registry's key: this folder's name
// AI Toolkit's qwen_image_edit_plus model class (Qwen-Image-Edit-2509, -2511): the diffusers Plus pipeline
// (control images numbered "Picture i: " in the template, conditions at 384²; references at reference_area
// of each control image's own aspect, in training and previews alike; cfg norm only with do_cfg_norm).
constexpr const char* kEditPlus = "edit_plus";

// QwenImagePipeline's true CFG: when g > 1, two separate forwards (half a batch of two's activations), u +
// g (c - u), rescaled token by token to the conditional prediction's norm where the pipeline does; a token
// is a patch x patch square of all channels (the packed vector its norm is taken over).
class TrueCfg final : public Guidance {
 public:
  TrueCfg(int64_t patch, bool rescale) : patch_(patch), rescale_(rescale) {}
  bool one_batch() const override { return false; }
  torch::Tensor combine(const torch::Tensor& cond, const torch::Tensor& uncond, double g) const override {
    const torch::Tensor guided = Guidance::combine(cond, uncond, g);
    if (!rescale_) return guided;
    const int64_t b = guided.size(0), c = guided.size(1), h = guided.size(2), w = guided.size(3), p = patch_;
    auto tokens = [&](const torch::Tensor& x) { return x.reshape({b, c, h / p, p, w / p, p}); };
    const torch::Tensor cond_norm = tokens(cond).pow(2).sum({1, 3, 5}, true).sqrt();
    const torch::Tensor guided_norm = tokens(guided).pow(2).sum({1, 3, 5}, true).sqrt();
    return (tokens(guided) * (cond_norm / guided_norm)).reshape({b, c, h, w});
  }

 private:
  int64_t patch_;
  bool rescale_;
};

ModelSpec qwen_preset(const std::string& preset, bool edit) {
  ModelSpec s;
  s.preset = preset;
  s.family = kQwenImageId;
  s.hidden = 3072, s.heads = 24, s.head_dim = 128, s.mlp_hidden = 12288;
  s.double_blocks = 60;
  s.latent_channels = 16, s.out_channels = 16, s.patch = 2;
  s.text_dim = 3584, s.max_text_tokens = 1024;
  s.rope_axes = {16, 56, 56}, s.rope_theta = 10000;
  // qwen_image.py:84-85 "16 for the VAE, 2 for patch size"; generate_single_image rounds previews to it
  // (:287-289).
  s.divisibility = 32, s.preview_divisibility = 32;
  // qwen_image_edit.py trains each control image at the image's size (references_at_image_size).
  s.reference_tokens = s.references_at_image_size = edit;
  if (edit) s.condition_area = 1024 * 1024, s.condition_text_rows = 1369 + 2;
  return s;
}

// Qwen-Image-Edit-2509 and -2511 (AI Toolkit's qwen_image_edit_plus: the diffusers Plus pipeline's
// CONDITION_IMAGE_SIZE, each control image numbered in the template).
ModelSpec qwen_edit_plus(const std::string& preset) {
  ModelSpec s = qwen_preset(preset, true);
  s.condition_area = 384 * 384, s.condition_text_rows = 196 + 2 + 5;
  s.variant = kEditPlus, s.references_at_image_size = false;
  return s;
}

// Qwen/Qwen-Image-Edit-2511: 2509's shape; zero_cond_t (transformer/config.json) modulates the reference
// images' tokens with the embedding of t = 0.
ModelSpec qwen_edit_2511() {
  ModelSpec s = qwen_edit_plus("qwen-image-edit-2511");
  s.zero_cond_t = true;
  return s;
}

ModelSpec tiny_preset(const ModelSpec& full, const std::string& preset) {
  ModelSpec s = families_shared::tiny(full, preset);
  s.double_blocks = 2, s.max_text_tokens = 64;
  // A 112²-area control image: 128² -> the processor's 140² -> 25 tokens (+ 2 markers, + 5 numbered); its
  // reference latent from a 512²-area image (1024 tokens, four times a 256² bucket's, as 4096 are to 1024²).
  if (s.reference_tokens)
    s.condition_area = 112 * 112, s.condition_text_rows = 25 + 2 + (s.variant == kEditPlus ? 5 : 0),
    s.reference_area = 512 * 512;
  return s;
}

class QwenImage final : public ModelFamily {
 public:
  Family id() const override { return kQwenImageId; }
  // qwen_image.py:412-413 (the edit classes inherit it), and its LoRA keys renamed before saving
  // (convert_lora_weights_before_save, qwen_image.py:418-423; back again before loading, :425-430).
  std::string base_model_version(const std::string&) const override { return "qwen_image"; }
  std::string lora_file_key(const std::string& module_path) const override { return "diffusion_model." + module_path; }
  // quantize_model (toolkit/util/quantize.py:264-279) with BaseModel's get_quantization_exclude_modules
  // (None, models/base_model.py:1640-1644) and no quantize_kwargs: every Linear.
  config::QuantizeKwargs quantization_filter(const config::ModelConfig&) const override { return {}; }
  std::shared_ptr<DiffusionTransformer> build_transformer(const ModelSpec& spec,
                                                          const torch::TensorOptions& options) const override {
    return qwen_image::build_transformer(spec, options);
  }
  std::string describe_blocks(const ModelSpec& s) const override {
    return std::to_string(s.double_blocks) + " double-stream";
  }

  // quantize_model (toolkit/util/quantize.py) per block; the transformer reaches the device after the text
  // encoders are loaded and quantized (qwen_image.py).
  std::vector<ArchFacts> archs() const override {
    const auto L = TransformerLoading::per_block;
    return {{"qwen_image", kQwenImageId, "qwen-image", false, "", "", L, {"Qwen-Image"}},
            {"qwen_image_edit", kQwenImageId, "qwen-image-edit", false, "", "", L, {"Qwen-Image-Edit"}},
            {"qwen_image_edit_plus",
             kQwenImageId,
             "qwen-image-edit-2509",
             false,
             "2511",
             "qwen-image-edit-2511",
             L,
             {"Qwen-Image-Edit-2509"}},
            {"tiny-qwen-image", kQwenImageId, "tiny-qwen-image", true, "", "", L, {}},
            {"tiny-qwen-image-edit", kQwenImageId, "tiny-qwen-image-edit", true, "", "", L, {}}};
  }

  std::vector<ModelSpec> presets() const override {
    const ModelSpec image = qwen_preset("qwen-image", false), edit = qwen_preset("qwen-image-edit", true);
    return {image,
            edit,
            qwen_edit_plus("qwen-image-edit-2509"),
            qwen_edit_2511(),
            tiny_preset(image, "tiny-qwen-image"),
            tiny_preset(edit, "tiny-qwen-image-edit")};
  }

  // AutoencoderKLQwenImage (vae/qwen_image_vae.h).
  vae::AutoencoderConfig autoencoder(const ModelSpec& spec) const override {
    return spec.tiny ? vae::QwenImageVaeConfig::tiny() : vae::QwenImageVaeConfig::preset();
  }
  std::shared_ptr<const text::TextPipeline> text_pipeline() const override { return qwen_image::text_pipeline(); }
  // The Plus template numbers the control images ("Picture i: ").
  text::PipelineTarget text_target(const ModelSpec& spec) const override {
    text::PipelineTarget t = ModelFamily::text_target(spec);
    t.numbered_conditions = spec.variant == kEditPlus;
    return t;
  }
  // qwen_image.py: the whole encoder, under quantize_te, as qtype_te.
  TextEncoderQuantization text_encoder_quantization() const override { return {}; }
  // QwenImagePipeline and QwenImageEditPipeline rescale always (diffusers' pipeline_qwenimage.py:668-672);
  // the Plus models preview through AI Toolkit's QwenImageEditPlusCustomPipeline, which rescales only with
  // sample.do_cfg_norm, off by default ("I find it hurts more often than it helps", qwen_image_pipelines.py:
  // 278-284; qwen_image_edit_plus.py:157; config_modules.py:77).
  std::shared_ptr<const Guidance> preview_guidance(const ModelSpec& spec, bool do_cfg_norm) const override {
    return std::make_shared<TrueCfg>(spec.patch, spec.variant != kEditPlus || do_cfg_norm);
  }
  // qwen_image.py scheduler_config: dynamic, mu 0.5 at 256 tokens to 0.9 at 8192, shift_terminal 0.02.
  FlowSchedule flow_schedule() const override {
    FlowSchedule s;
    s.dynamic = true, s.shift = 1.0, s.max_shift = 0.9, s.max_seq_len = 8192, s.shift_terminal = 0.02;
    return s;
  }
  // generate_single_image of every Qwen-Image model class: `if self.model_config.low_vram:
  // pipeline.vae.enable_tiling()` (qwen_image.py:291-293, qwen_image_edit.py:118-120,
  // qwen_image_edit_plus.py:136-138).
  bool low_vram_tiles_previews(const ModelSpec&) const override { return true; }

  // The prompt's own length (the padding masked out), at most max_text_tokens — QwenImagePipeline's
  // tokenizer truncates there; the edit pipelines' processor does not (pipeline_qwenimage_edit.py's
  // _get_qwen_prompt_embeds takes no max_length, and encode_prompt never reads max_sequence_length) — and an
  // edit model's one square control image's rows after it.
  int64_t encoder_tokens(const ModelSpec& spec, int64_t prompt_tokens) const override {
    if (spec.reference_tokens) return prompt_tokens + spec.condition_text_rows;
    return std::min(prompt_tokens, spec.max_text_tokens);
  }
  int64_t sequence_rows(const ModelSpec&, int64_t pipeline_rows) const override {
    return std::max<int64_t>(pipeline_rows, 1);
  }

  std::string diffusers_class() const override { return "QwenImageTransformer2DModel"; }
  // diffusers' QwenImageTransformer2DModel.named_modules() order of its Linears (as diffusers 0.42 builds it).
  std::vector<std::string> diffusers_linear_order() const override {
    return {"time_text_embed.timestep_embedder.linear_1",
            "time_text_embed.timestep_embedder.linear_2",
            "img_in",
            "txt_in",
            "transformer_blocks.*.img_mod.1",
            "transformer_blocks.*.attn.to_q",
            "transformer_blocks.*.attn.to_k",
            "transformer_blocks.*.attn.to_v",
            "transformer_blocks.*.attn.add_k_proj",
            "transformer_blocks.*.attn.add_v_proj",
            "transformer_blocks.*.attn.add_q_proj",
            "transformer_blocks.*.attn.to_out.0",
            "transformer_blocks.*.attn.to_add_out",
            "transformer_blocks.*.img_mlp.net.0.proj",
            "transformer_blocks.*.img_mlp.net.2",
            "transformer_blocks.*.txt_mod.1",
            "transformer_blocks.*.txt_mlp.net.0.proj",
            "transformer_blocks.*.txt_mlp.net.2",
            "norm_out.linear",
            "proj_out"};
  }
  nlohmann::ordered_json diffusers_config(const ModelSpec& s) const override {
    return {{"_class_name", "QwenImageTransformer2DModel"},
            {"attention_head_dim", s.head_dim},
            {"axes_dims_rope", s.rope_axes},
            {"guidance_embeds", false},
            {"in_channels", families_shared::packed_features(s)},
            {"joint_attention_dim", s.text_dim},
            {"num_attention_heads", s.heads},
            {"num_layers", s.double_blocks},
            {"out_channels", s.out_channels},
            {"patch_size", s.patch},
            {"zero_cond_t", s.zero_cond_t}};
  }
  void read_diffusers_config(ModelSpec& s, const nlohmann::json& c) const override {
    families_shared::read_mmdit_config(s, c);
    s.double_blocks = static_cast<int>(families_shared::config_int(c, "num_layers", s.double_blocks));
    s.zero_cond_t = c.value("zero_cond_t", false);
  }
  void read_tensor_shapes(ModelSpec& s, const TensorShapes& t) const override {
    s.hidden = t.dim("img_in.weight", 0);
    s.head_dim = t.dim("transformer_blocks.0.attn.norm_q.weight", 0);
    s.mlp_hidden = t.dim("transformer_blocks.0.img_mlp.net.0.proj.weight", 0);
    s.double_blocks = t.count("transformer_blocks");
    s.text_dim = t.dim("txt_in.weight", 1);
  }
};

}  // namespace

const ModelFamily& qwen_image_family() {
  static const QwenImage family;
  return family;
}

}  // namespace gclab::model
