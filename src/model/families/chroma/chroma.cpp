// Chroma (lodestones/Chroma, Chroma1-Base / -HD) as AI Toolkit trains it (arch "chroma": ChromaModel,
// extensions_built_in/diffusion_models/chroma/chroma_model.py at the commit docs/flux-line-aitk-reading.md
// reads): FLUX.1-schnell's blocks with an approximator in place of the per-block modulation (transformer.cpp),
// T5-XXL alone with its padding masked in the transformer, FLUX.1's autoencoder, no guidance input.
#include <nlohmann/json.hpp>

#include "gclab/config/user_error.h"
#include "gclab/model/guidance.h"
#include "gclab/model/registry.h"
#include "model/families/bfl/layout.h"

namespace gclab::model {
namespace chroma {
std::shared_ptr<DiffusionTransformer> build_transformer(const ModelSpec& spec, const torch::TensorOptions& options);
std::shared_ptr<const text::TextPipeline> text_pipeline();
}  // namespace chroma

namespace {

const Family kChromaId("chroma");  // the registry's key: this folder's name

// src/model.py chroma_params: in_channels 64, context_in_dim 4096, hidden 3072, mlp_ratio 4, 24 heads,
// depth 19 + 38, axes_dim [16, 56, 56], theta 10000; the approximator 64 -> 5120 (x5) -> 3072.
ModelSpec chroma_preset() {
  ModelSpec s;
  s.preset = "chroma";
  s.family = kChromaId;
  s.hidden = 3072, s.heads = 24, s.head_dim = 128, s.mlp_hidden = 12288;
  s.double_blocks = 19, s.single_blocks = 38;
  s.latent_channels = 16, s.out_channels = 16, s.patch = 2;
  s.text_dim = 4096, s.max_text_tokens = 512;  // get_prompt_embeds: max_length 512
  s.t_embed_mid = 5120;                        // the approximator's hidden width
  s.rope_axes = {16, 56, 56}, s.rope_theta = 10000;
  // ChromaModel.get_bucket_divisibility (chroma_model.py:94-96) 32; its pipeline rounds previews to 16
  // (prepare_latents: 2 * (height // (vae_scale_factor * 2))).
  s.divisibility = 32, s.preview_divisibility = 16;
  return s;
}

// ChromaPipeline.__call__ (pipeline.py:254-279): the unconditional prompt (the sample's neg, "" by default)
// runs in a forward of its own when guidance_scale > 1.00001, and u + g (c - u).
class ChromaCfg final : public Guidance {
 public:
  bool runs_cfg(double g) const override { return g > 1.00001; }
  bool one_batch() const override { return false; }
};

class Chroma final : public ModelFamily {
 public:
  Family id() const override { return kChromaId; }
  std::vector<ArchFacts> archs() const override {
    // ChromaModel.load_model moves the transformer whole to the device, then quantizes it (:177-191); it has
    // no low_vram path.
    using L = TransformerLoading;
    return {{"chroma", kChromaId, "chroma", false, "", "", L::on_device, {"Chroma"}},
            {"tiny-chroma", kChromaId, "tiny-chroma", true, "", "", L::on_device, {}}};
  }
  std::vector<ModelSpec> presets() const override {
    const ModelSpec full = chroma_preset();
    ModelSpec tiny = families_shared::tiny(full, "tiny-chroma");
    tiny.double_blocks = 2, tiny.single_blocks = 2, tiny.max_text_tokens = 32, tiny.t_embed_mid = 64;
    return {full, tiny};
  }
  std::shared_ptr<DiffusionTransformer> build_transformer(const ModelSpec& spec,
                                                          const torch::TensorOptions& options) const override {
    return chroma::build_transformer(spec, options);
  }
  std::string describe_blocks(const ModelSpec& s) const override {
    return std::to_string(s.double_blocks) + " double-stream + " + std::to_string(s.single_blocks) +
           " single-stream (modulation from one approximator)";
  }
  // The VAE from ostris/Flex.1-alpha's vae/ (:221-227): FLUX.1's AutoencoderKL.
  vae::AutoencoderConfig autoencoder(const ModelSpec& spec) const override {
    return spec.tiny ? vae::AutoencoderKLConfig{}.shrunk() : vae::AutoencoderKLConfig{};
  }
  std::shared_ptr<const text::TextPipeline> text_pipeline() const override { return chroma::text_pipeline(); }
  // T5 under quantize_te, as model.qtype (chroma_model.py:207-212).
  TextEncoderQuantization text_encoder_quantization() const override {
    return {/*t5_only=*/true, /*under_quantize=*/false, /*as_qtype_te=*/false};
  }
  std::shared_ptr<const Guidance> preview_guidance(const ModelSpec&, bool) const override {
    return std::make_shared<ChromaCfg>();
  }
  // ChromaModel's transformer config is a FakeConfig with patch_size 1 and its arch is not "flux", so the
  // shift timestep types count the latents' h·w (BaseSDTrainProcess.py:1211-1225): four times the tokens.
  int64_t shift_tokens(const ModelSpec& spec, const SampleShape& shape) const override {
    return image_tokens(spec, shape) * spec.patch * spec.patch;
  }
  int64_t encoder_tokens(const ModelSpec& spec, int64_t) const override { return spec.max_text_tokens; }
  int64_t sequence_rows(const ModelSpec& spec, int64_t) const override { return spec.max_text_tokens; }

  // The LoRA keys ChromaModel saves: PEFT's "transformer." renamed "diffusion_model." for ComfyUI
  // (convert_lora_weights_before_save, :446-452), on the BFL module names.
  std::string lora_file_key(const std::string& module_path) const override { return "diffusion_model." + module_path; }
  std::string base_model_version(const std::string&) const override { return "chroma"; }  // :462-463

  // AI Toolkit's Chroma module order of the Linears (model.py, layers.py): the order its LoRA network makes them.
  std::vector<std::string> diffusers_linear_order() const override {
    std::vector<std::string> out = {"img_in",
                                    "distilled_guidance_layer.in_proj",
                                    "distilled_guidance_layer.layers.*.in_layer",
                                    "distilled_guidance_layer.layers.*.out_layer",
                                    "distilled_guidance_layer.out_proj",
                                    "txt_in"};
    for (const auto& name : bfl::block_linear_order()) out.push_back(name);
    out.push_back("final_layer.linear");
    return out;
  }
  std::string diffusers_class() const override { return "ChromaTransformer2DModel"; }
  nlohmann::ordered_json diffusers_config(const ModelSpec& s) const override {
    const int64_t packed = families_shared::packed_features(s);
    return {{"_class_name", "ChromaTransformer2DModel"},
            {"approximator_hidden_dim", s.t_embed_mid},
            {"approximator_layers", 5},
            {"approximator_num_channels", 64},
            {"attention_head_dim", s.head_dim},
            {"axes_dims_rope", s.rope_axes},
            {"in_channels", packed},
            {"joint_attention_dim", s.text_dim},
            {"num_attention_heads", s.heads},
            {"num_layers", s.double_blocks},
            {"num_single_layers", s.single_blocks},
            {"patch_size", 1}};
  }
  // ChromaModel.load_model takes one .safetensors file and nothing else (:104-143); a folder is read only
  // where gclab wrote it (a full fine-tune's save: its config.json says so, its weights in the BFL names).
  void read_diffusers_config(ModelSpec& s, const nlohmann::json& c) const override {
    bfl::read_gclab_folder(
        s, c,
        "Chroma loads one Black Forest Labs-format .safetensors file (Chroma1-Base.safetensors, "
        "chroma-unlocked-vN.safetensors), as AI Toolkit's ChromaModel does; a diffusers folder is not read");
    s.t_embed_mid = families_shared::config_int(c, "approximator_hidden_dim", s.t_embed_mid);
  }
  std::string foreign_layout(const std::string& key) const override {
    return bfl::foreign_layout(key, "Chroma", "lodestones' Chroma1-Base.safetensors");
  }
  // load_model reads the block counts from the file (:153-169); the widths follow from its tensors.
  void read_tensor_shapes(ModelSpec& s, const TensorShapes& t) const override {
    bfl::read_tensor_shapes(s, t);
    s.t_embed_mid = t.dim("distilled_guidance_layer.in_proj.weight", 0);
    if (t.count("distilled_guidance_layer.layers") != 5)
      throw UserError(t.file() + ": Chroma's approximator has 5 layers, the file " +
                      std::to_string(t.count("distilled_guidance_layer.layers")));
  }
};

}  // namespace

const ModelFamily& chroma_family() {
  static const Chroma family;
  return family;
}

}  // namespace gclab::model
