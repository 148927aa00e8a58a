// FLUX.2 as AI Toolkit trains it (arch flux2: Flux2Model, extensions_built_in/diffusion_models/flux2/
// flux2_model.py; archs flux2_klein_4b / flux2_klein_9b: Flux2Klein4BModel / Flux2Klein9BModel,
// flux2_klein_model.py on it; at the commit docs/flux-line-aitk-reading.md reads): BFL's FLUX.2 transformer
// (transformer.cpp), three layers' hidden states of a decoder as the text (text_pipeline.cpp: Mistral-Small-3.1
// for dev, Qwen3 for klein), FLUX.2's autoencoder (vae::AutoencoderKLConfig::batch_normed: 32 channels, 2 x 2
// patches, BatchNorm statistics). dev is guidance-distilled (its scale a model input, trained at
// train.cfg_scale); klein takes none (CFG previews).
#include <nlohmann/json.hpp>

#include "gclab/model/guidance.h"
#include "gclab/model/registry.h"
#include "model/families/bfl/layout.h"

namespace gclab::model {
namespace flux2 {
std::shared_ptr<DiffusionTransformer> build_transformer(const ModelSpec& spec, const torch::TensorOptions& options);
std::shared_ptr<const text::TextPipeline> klein_text_pipeline(bool nine_b);
std::shared_ptr<const text::TextPipeline> dev_text_pipeline();
}  // namespace flux2

namespace {

const Family kFlux2Id("flux2");  // the registry's key: this folder's name
const char* const kKlein9b = "klein-9b";
const char* const kDev = "dev";

// src/model.py Klein4BParams / Klein9BParams (:23-48): in_channels 128 (the VAE's 32 channels x 2 x 2),
// mlp_ratio 3, axes_dim [32, 32, 32, 32], theta 2000, no guidance embedder; context_in_dim = 3 x the text
// encoder's width.
ModelSpec flux2_preset(const std::string& preset, int64_t heads, int doubles, int singles, int64_t text_width) {
  ModelSpec s;
  s.preset = preset;
  s.family = kFlux2Id;
  s.hidden = heads * 128, s.heads = heads, s.head_dim = 128, s.mlp_hidden = 3 * s.hidden;
  s.double_blocks = doubles, s.single_blocks = singles;
  s.latent_channels = 128, s.out_channels = 128, s.latent_spatial = 16, s.patch = 1;
  s.text_dim = 3 * text_width, s.max_text_tokens = 512;  // pipeline.py: 512 rows, always
  s.rope_axes = {32, 32, 32, 32}, s.rope_theta = 2000;
  // Flux2Model.get_bucket_divisibility (flux2_model.py:88-89); previews floored to 16 (:295-300).
  s.divisibility = 16, s.preview_divisibility = 16;
  // Reference images (has_multiple_control_images, use_raw_control_images: :78-81): each control image raw,
  // capped at 1024² (get_noise_prediction's control_image_max_res, :365), its tokens after the image's.
  s.reference_tokens = s.raw_references = true;
  s.reference_area = 1024 * 1024;
  return s;
}

// FLUX.2-dev (Flux2Params, src/model.py:9-20): 48 heads of 128, 8 double + 48 single blocks, Mistral's 5120
// wide states x 3, the guidance embedder.
ModelSpec dev_preset() {
  ModelSpec s = flux2_preset("flux2-dev", 48, 8, 48, 5120);
  s.variant = kDev, s.guidance_embed = true;
  return s;
}

// Flux2Pipeline without guidance distillation (pipeline.py:415-424): the negative prompt in a forward of its
// own when guidance_scale > 1, u + g (c - u).
class KleinCfg final : public Guidance {
 public:
  bool one_batch() const override { return false; }
};

class Flux2 final : public ModelFamily {
 public:
  Family id() const override { return kFlux2Id; }
  std::vector<ArchFacts> archs() const override {
    // Quantized block by block through the device by quantize_model, the rest in host memory; on the device
    // after the text encoder loads, or under low_vram at its first use (flux2_model.py:158-182, 249-258).
    using L = TransformerLoading;
    // A local folder holds BFL's files (flux2_model.py:138-148, 189-190): flux2_te_filename (:51, 60; klein's
    // flux2_klein_model.py:73, 85) and ae.safetensors (FLUX2_VAE_FILENAME, :50).
    const char* ae = "ae.safetensors";
    return {{"flux2", kFlux2Id, "flux2-dev", false, "", "", L::per_block, {"FLUX.2-dev"}, "flux2-dev.safetensors", ae},
            {"tiny-flux2-dev", kFlux2Id, "tiny-flux2-dev", true, "", "", L::per_block, {}, "flux2-dev.safetensors", ae},
            {"flux2_klein_4b",
             kFlux2Id,
             "flux2-klein-4b",
             false,
             "",
             "",
             L::per_block,
             {"FLUX.2-klein-base-4B", "FLUX.2-klein-4B"},
             "flux-2-klein-base-4b.safetensors",
             ae},
            {"flux2_klein_9b",
             kFlux2Id,
             "flux2-klein-9b",
             false,
             "",
             "",
             L::per_block,
             {"FLUX.2-klein-base-9B", "FLUX.2-klein-9B"},
             "flux-2-klein-base-9b.safetensors",
             ae},
            {"tiny-flux2-klein",
             kFlux2Id,
             "tiny-flux2-klein",
             true,
             "",
             "",
             L::per_block,
             {},
             "flux-2-klein-base-4b.safetensors",
             ae}};
  }
  std::vector<ModelSpec> presets() const override {
    const ModelSpec four = flux2_preset("flux2-klein-4b", 24, 5, 20, 2560);
    ModelSpec nine = flux2_preset("flux2-klein-9b", 32, 8, 24, 4096);
    nine.variant = kKlein9b;
    ModelSpec tiny = families_shared::tiny(four, "tiny-flux2-klein");
    tiny.double_blocks = 2, tiny.single_blocks = 2, tiny.max_text_tokens = 32;
    tiny.mlp_hidden = 3 * tiny.hidden, tiny.text_dim = 3 * 64, tiny.rope_axes = {8, 8, 8, 8};
    const ModelSpec dev = dev_preset();
    ModelSpec tiny_dev = tiny;  // the tiny klein's blocks with the guidance embedder and the tiny Mistral
    tiny_dev.preset = "tiny-flux2-dev", tiny_dev.variant = kDev, tiny_dev.guidance_embed = true;
    return {dev, tiny_dev, four, nine, tiny};
  }
  std::shared_ptr<DiffusionTransformer> build_transformer(const ModelSpec& spec,
                                                          const torch::TensorOptions& options) const override {
    return flux2::build_transformer(spec, options);
  }
  std::string describe_blocks(const ModelSpec& s) const override {
    return std::to_string(s.double_blocks) + " double-stream + " + std::to_string(s.single_blocks) +
           " single-stream (modulation shared by all)";
  }
  vae::AutoencoderConfig autoencoder(const ModelSpec& spec) const override {
    return spec.tiny ? vae::AutoencoderKLConfig::batch_normed().shrunk() : vae::AutoencoderKLConfig::batch_normed();
  }
  std::shared_ptr<const text::TextPipeline> text_pipeline() const override { return flux2::klein_text_pipeline(false); }
  std::shared_ptr<const text::TextPipeline> text_pipeline(const ModelSpec& spec) const override {
    if (spec.variant == kDev) return flux2::dev_text_pipeline();
    return flux2::klein_text_pipeline(spec.variant == kKlein9b);
  }
  // Flux2Model.load_te quantizes Mistral under quantize_te as model.qtype (flux2_model.py:108-112); klein's
  // Qwen3 as qtype_te (flux2_klein_model.py:47-51).
  TextEncoderQuantization text_encoder_quantization(const ModelSpec& spec) const override {
    TextEncoderQuantization q;
    q.as_qtype_te = spec.variant != kDev;
    return q;
  }
  // dev: the sample's guidance_scale embedded, one forward a step, no negative prompt (is_guidance_distilled,
  // flux2_model.py:320-321); klein: CFG.
  std::shared_ptr<const Guidance> preview_guidance(const ModelSpec& spec, bool) const override {
    if (spec.guidance_embed) return std::make_shared<NoGuidance>(/*embeds_scale=*/true);
    return std::make_shared<KleinCfg>();
  }
  // Flux2Model.get_noise_prediction embeds guidance_embedding_scale (train.cfg_scale) and has no
  // bypass_guidance_embedding (flux2_model.py:336-345, 438-453): the switch is not read.
  bool bypasses_guidance(const ModelSpec&, const config::TrainConfig&) const override { return false; }
  int64_t encoder_tokens(const ModelSpec& spec, int64_t) const override { return spec.max_text_tokens; }
  int64_t sequence_rows(const ModelSpec& spec, int64_t) const override { return spec.max_text_tokens; }

  // convert_lora_weights_before_save (flux2_model.py:508-513): PEFT's "transformer." as "diffusion_model.".
  std::string lora_file_key(const std::string& module_path) const override { return "diffusion_model." + module_path; }
  // flux2_model.py:502-503, flux2_klein_model.py:78-79, 90-91: the arch.
  std::string base_model_version(const std::string& arch) const override { return arch; }

  // Flux2's module order of the Linears (src/model.py): the order AI Toolkit's LoRA network makes them.
  std::vector<std::string> diffusers_linear_order() const override {
    std::vector<std::string> out = {"img_in", "time_in.in_layer", "time_in.out_layer", "txt_in"};
    for (const auto& name : bfl::block_linear_order()) out.push_back(name);
    for (const char* name : {"double_stream_modulation_img.lin", "double_stream_modulation_txt.lin",
                             "single_stream_modulation.lin", "final_layer.linear", "final_layer.adaLN_modulation.1"})
      out.push_back(name);
    return out;
  }
  std::string diffusers_class() const override { return "Flux2Transformer2DModel"; }
  nlohmann::ordered_json diffusers_config(const ModelSpec& s) const override {
    return {{"_class_name", "Flux2Transformer2DModel"},
            {"attention_head_dim", s.head_dim},
            {"axes_dims_rope", s.rope_axes},
            {"guidance_embeds", s.guidance_embed},
            {"in_channels", s.latent_channels},
            {"joint_attention_dim", s.text_dim},
            {"mlp_ratio", 3.0},
            {"num_attention_heads", s.heads},
            {"num_layers", s.double_blocks},
            {"num_single_layers", s.single_blocks},
            {"patch_size", 1},
            {"rope_theta", s.rope_theta}};
  }
  // Flux2Model.load_model reads one BFL-format file (flux2-dev.safetensors, flux-2-klein-base-4b.safetensors,
  // ...), no config.json (:134-156); a folder is read only where gclab wrote it.
  void read_diffusers_config(ModelSpec& s, const nlohmann::json& c) const override {
    bfl::read_gclab_folder(
        s, c,
        "FLUX.2 loads one Black Forest Labs-format .safetensors file (flux-2-klein-base-4b.safetensors, ...), as "
        "AI Toolkit's Flux2Model does; a diffusers folder is not read");
    s.mlp_hidden = 3 * s.hidden;
    s.guidance_embed = c.value("guidance_embeds", s.guidance_embed);
    if (c.contains("rope_theta") && c["rope_theta"].is_number()) s.rope_theta = c["rope_theta"].get<double>();
  }
  std::string foreign_layout(const std::string& key) const override {
    return bfl::foreign_layout(key, "FLUX.2", "flux-2-klein-base-4b.safetensors");
  }
  void read_tensor_shapes(ModelSpec& s, const TensorShapes& t) const override {
    bfl::read_tensor_shapes(s, t);
    s.guidance_embed = t.contains("guidance_in.in_layer.weight");
  }
};

}  // namespace

const ModelFamily& flux2_family() {
  static const Flux2 family;
  return family;
}

}  // namespace gclab::model
