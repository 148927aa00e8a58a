// FLUX.1 (dev, schnell, Kontext) and Flex.1 / Flex.2: black-forest-labs/FLUX.1-dev's transformer/config.json,
// ostris/Flex.1-alpha, ostris/Flex.2-preview; diffusers' FluxTransformer2DModel, FluxPipeline and
// FluxKontextPipeline.
#include <nlohmann/json.hpp>

#include "gclab/config/user_error.h"
#include "gclab/model/registry.h"
#include "model/families/flux/flex2_condition.h"

namespace gclab::model {
namespace flux {
std::shared_ptr<DiffusionTransformer> build_transformer(const ModelSpec& spec, const torch::TensorOptions& options);
std::shared_ptr<const text::TextPipeline> text_pipeline();
}  // namespace flux

namespace {

const Family kFluxId("flux");  // the registry's key: this folder's name

ModelSpec flux_preset(const std::string& preset, int double_blocks, bool guidance, int64_t text_tokens) {
  ModelSpec s;
  s.preset = preset;
  s.family = kFluxId;
  s.hidden = 3072, s.heads = 24, s.head_dim = 128, s.mlp_hidden = 12288;
  s.double_blocks = double_blocks, s.single_blocks = 38;
  s.latent_channels = 16, s.out_channels = 16, s.patch = 2;
  s.text_dim = 4096, s.pooled_dim = 768, s.max_text_tokens = text_tokens, s.guidance_embed = guidance;
  s.rope_axes = {16, 56, 56}, s.rope_theta = 10000;
  // StableDiffusion.get_bucket_divisibility (stable_diffusion_model.py:289-297): the VAE's 8, x2 for the
  // packing, x2 again; previews go to FluxPipeline as given, which rounds them to 16.
  s.divisibility = 32, s.preview_divisibility = 16;
  return s;
}

// ostris/Flex.2-preview: Flex.1's shape with a 196-feature input (x_embedder), the latent's 64 plus
// an inpainting latent, its mask and a control latent (AI Toolkit's flex2 model; DiffSynth's input_dim 196).
ModelSpec flex2() {
  ModelSpec s = flux_preset("flex2", 8, true, 512);
  s.extra_input_features = 196 - families_shared::packed_features(s);
  s.divisibility = 16;  // flex2.py:88-89, its own get_bucket_divisibility (StableDiffusion's gives 32)
  return s;
}

// black-forest-labs/FLUX.1-Kontext-dev: FLUX.1-dev's transformer, trained and previewed with a reference
// image's latents appended to the image sequence (AI Toolkit's FluxKontextModel,
// extensions_built_in/diffusion_models/flux_kontext/flux_kontext.py): in training the dataset's control image
// scaled and cropped as its image and encoded at its size (condition_noisy_latents, :394-417), in previews the
// ctrl_img resized to the preview's size (generate_single_image, :204-241: the pipeline's max_area is the
// preview's, _auto_resize off).
const char* const kKontext = "kontext";

ModelSpec flux_kontext() {
  ModelSpec s = flux_preset("flux-kontext", 19, true, 512);
  s.variant = kKontext;
  s.reference_tokens = s.references_at_image_size = true;
  s.reference_area = 0;  // a preview's reference at the preview's own size
  s.divisibility = 16;   // FluxKontextModel.get_bucket_divisibility (:70-71)
  return s;
}

bool kontext(const std::string& arch) { return arch.find("kontext") != std::string::npos; }

class Flux final : public ModelFamily {
 public:
  Family id() const override { return kFluxId; }
  // stable_diffusion_model.py:3168-3169 (is_flux: FLUX.1, Flex.1); Flex.2's own class keeps BaseModel's
  // default, its arch (toolkit/models/base_model.py:1646-1648).
  // FLUX.1 / Flex.1: StableDiffusion.load_model fuses it in (stable_diffusion_model.py:718-725) and
  // load_assistant_lora_from_path keeps it (toolkit/assistant_lora.py:10-11: "Only Flux models"); Flex.2's
  // own model class does not.
  bool takes_assistant_adapter(const std::string& arch) const override { return arch != "flex2" && !kontext(arch); }
  // Flex.2: features beyond the latents' (an inpainting latent, its mask, a control latent).
  bool controls_as_channels(const ModelSpec& spec) const override {
    return spec.extra_input_features == 2 * families_shared::packed_features(spec) + spec.patch * spec.patch;
  }
  // Flex2.condition_noisy_latents (flex2_condition.cpp). With no control latents, no inpainting mask and no
  // random inpainting its inputs are the transformer's default (zeros, a mask of ones, zeros): left to it.
  torch::Tensor training_condition(const ModelSpec& spec, const config::ModelKwargs& k, const torch::Tensor& x0,
                                   const std::vector<torch::Tensor>& controls,
                                   const torch::Tensor& keep) const override {
    if (!controls_as_channels(spec) || (controls.empty() && !keep.defined() && !k.do_random_inpainting)) return {};
    return flux::flex2_condition(k, x0, controls, keep);
  }
  void check_preview_control(const ModelSpec& spec, const std::filesystem::path& file, int index) const override {
    if (controls_as_channels(spec)) flux::check_flex2_preview_control(file, index);
  }
  torch::Tensor preview_condition(const ModelSpec& spec, const std::filesystem::path& file, int index, int width,
                                  int height,
                                  const std::function<torch::Tensor(const torch::Tensor&)>& encode) const override {
    if (!controls_as_channels(spec)) return {};
    return flux::flex2_preview_condition(file, index, width, height, encode);
  }
  std::string base_model_version(const std::string& arch) const override {
    return arch == "flex2" ? "flex2" : kontext(arch) ? "flux.1_kontext" : "flux.1";  // flux_kontext.py:419-420
  }
  // FluxKontextModel.generate_single_image: "Control image is required for Flux Kontext model generation"
  // (:213-216); its batch's control_tensor is one image (condition_noisy_latents encodes it as one, :394-417).
  bool preview_needs_control(const ModelSpec& spec) const override { return spec.variant == kKontext; }
  int max_control_images(const ModelSpec& spec) const override { return spec.variant == kKontext ? 1 : 0; }
  // FluxKontextModel is not `is_flux` (its arch is not "flux": toolkit/models/base_model.py:261-262), so the
  // trainer takes its transformer config's patch_size, 1 (BaseSDTrainProcess.py:1212-1217): the shift counts
  // the latents' h·w, four times the packed tokens.
  int64_t shift_tokens(const ModelSpec& spec, const SampleShape& shape) const override {
    const int64_t tokens = image_tokens(spec, shape);
    return spec.variant == kKontext ? tokens * spec.patch * spec.patch : tokens;
  }
  std::shared_ptr<DiffusionTransformer> build_transformer(const ModelSpec& spec,
                                                          const torch::TensorOptions& options) const override {
    return flux::build_transformer(spec, options);
  }
  std::string describe_blocks(const ModelSpec& s) const override {
    return std::to_string(s.double_blocks) + " double-stream + " + std::to_string(s.single_blocks) + " single-stream";
  }

  std::vector<ArchFacts> archs() const override {
    using L = TransformerLoading;
    return {{"flux", kFluxId, "flux-dev", false, "schnell", "flux-schnell", L::on_device_unless_low_vram, {"FLUX.1"}},
            {"flex1", kFluxId, "flex1", false, "", "", L::on_device_unless_low_vram, {"Flex.1"}},
            {"flex2", kFluxId, "flex2", false, "", "", L::on_device, {"Flex.2"}},
            // FluxKontextModel.load_model: `transformer.to(self.quantize_device)` (the device), low_vram or not.
            {"flux_kontext", kFluxId, "flux-kontext", false, "", "", L::on_device, {"FLUX.1-Kontext"}},
            // The tiny presets load as their archs do.
            {"tiny-flux", kFluxId, "tiny-flux", true, "", "", L::on_device_unless_low_vram, {}},
            {"tiny-flux-kontext", kFluxId, "tiny-flux-kontext", true, "", "", L::on_device, {}}};
  }

  std::vector<ModelSpec> presets() const override {
    const ModelSpec dev = flux_preset("flux-dev", 19, true, 512), kontext_dev = flux_kontext();
    auto shrunk = [](const ModelSpec& full, const std::string& name) {
      ModelSpec tiny = families_shared::tiny(full, name);
      tiny.double_blocks = 2, tiny.single_blocks = 2, tiny.max_text_tokens = 32;
      return tiny;
    };
    return {dev,
            flux_preset("flux-schnell", 19, false, 256),
            flux_preset("flex1", 8, true, 512),
            flex2(),
            kontext_dev,
            shrunk(dev, "tiny-flux"),
            shrunk(kontext_dev, "tiny-flux-kontext")};
  }

  // FLUX.1's AutoencoderKL (vae::AutoencoderKLConfig's defaults), Flex's too.
  vae::AutoencoderConfig autoencoder(const ModelSpec& spec) const override {
    return spec.tiny ? vae::AutoencoderKLConfig{}.shrunk() : vae::AutoencoderKLConfig{};
  }
  std::shared_ptr<const text::TextPipeline> text_pipeline() const override { return flux::text_pipeline(); }
  // stable_diffusion_model.py, flex2.py: T5 only, under quantize_te (which defaults to quantize), as
  // model.qtype; CLIP-L never.
  TextEncoderQuantization text_encoder_quantization() const override {
    return {/*t5_only=*/true, /*under_quantize=*/false, /*as_qtype_te=*/false};
  }
  // FLUX.1-dev / Flex: the scale is a model input (distilled CFG); FLUX.1-schnell: none.
  std::shared_ptr<const Guidance> preview_guidance(const ModelSpec& spec, bool) const override {
    return std::make_shared<NoGuidance>(/*embeds_scale=*/spec.guidance_embed);
  }

  // T5 padded to its max length (dev 512, schnell 256) whatever the prompt.
  int64_t encoder_tokens(const ModelSpec& spec, int64_t) const override { return spec.max_text_tokens; }
  int64_t sequence_rows(const ModelSpec& spec, int64_t) const override { return spec.max_text_tokens; }

  std::string diffusers_class() const override { return "FluxTransformer2DModel"; }
  // diffusers' FluxTransformer2DModel.named_modules() order of its Linears (as diffusers 0.42 builds it).
  std::vector<std::string> diffusers_linear_order() const override {
    return {"time_text_embed.timestep_embedder.linear_1",
            "time_text_embed.timestep_embedder.linear_2",
            "time_text_embed.guidance_embedder.linear_1",
            "time_text_embed.guidance_embedder.linear_2",
            "time_text_embed.text_embedder.linear_1",
            "time_text_embed.text_embedder.linear_2",
            "context_embedder",
            "x_embedder",
            "transformer_blocks.*.norm1.linear",
            "transformer_blocks.*.norm1_context.linear",
            "transformer_blocks.*.attn.to_q",
            "transformer_blocks.*.attn.to_k",
            "transformer_blocks.*.attn.to_v",
            "transformer_blocks.*.attn.to_out.0",
            "transformer_blocks.*.attn.add_q_proj",
            "transformer_blocks.*.attn.add_k_proj",
            "transformer_blocks.*.attn.add_v_proj",
            "transformer_blocks.*.attn.to_add_out",
            "transformer_blocks.*.ff.net.0.proj",
            "transformer_blocks.*.ff.net.2",
            "transformer_blocks.*.ff_context.net.0.proj",
            "transformer_blocks.*.ff_context.net.2",
            "single_transformer_blocks.*.norm.linear",
            "single_transformer_blocks.*.proj_mlp",
            "single_transformer_blocks.*.proj_out",
            "single_transformer_blocks.*.attn.to_q",
            "single_transformer_blocks.*.attn.to_k",
            "single_transformer_blocks.*.attn.to_v",
            "norm_out.linear",
            "proj_out"};
  }
  nlohmann::ordered_json diffusers_config(const ModelSpec& s) const override {
    const int64_t packed = families_shared::packed_features(s);  // FluxPipeline packs 2x2 patches
    return {{"_class_name", "FluxTransformer2DModel"},
            {"attention_head_dim", s.head_dim},
            {"axes_dims_rope", s.rope_axes},
            {"guidance_embeds", s.guidance_embed},
            {"in_channels", packed + s.extra_input_features},  // Flex.2: 196
            {"out_channels", packed},
            {"joint_attention_dim", s.text_dim},
            {"num_attention_heads", s.heads},
            {"num_layers", s.double_blocks},
            {"num_single_layers", s.single_blocks},
            {"patch_size", 1},
            {"pooled_projection_dim", s.pooled_dim}};
  }
  void read_diffusers_config(ModelSpec& s, const nlohmann::json& c) const override {
    families_shared::read_mmdit_config(s, c);
    s.double_blocks = static_cast<int>(families_shared::config_int(c, "num_layers", s.double_blocks));
    s.single_blocks = static_cast<int>(families_shared::config_int(c, "num_single_layers", s.single_blocks));
    s.guidance_embed = c.value("guidance_embeds", s.guidance_embed);
    const int64_t packed = families_shared::packed_features(s);
    s.extra_input_features = families_shared::config_int(c, "in_channels", packed) - packed;
  }
  void read_tensor_shapes(ModelSpec& s, const TensorShapes& t) const override {
    s.hidden = t.dim("x_embedder.weight", 0);
    s.extra_input_features = t.dim("x_embedder.weight", 1) - families_shared::packed_features(s);
    families_shared::read_joint_block_shapes(s, t);
    s.single_blocks = t.count("single_transformer_blocks");
    s.guidance_embed = t.contains("time_text_embed.guidance_embedder.linear_1.weight");
  }
};

}  // namespace

const ModelFamily& flux_family() {
  static const Flux family;
  return family;
}

}  // namespace gclab::model
