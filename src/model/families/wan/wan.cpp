// Wan 2.1 text-to-video (Wan-AI/Wan2.1-T2V-1.3B and -14B, diffusers' WanTransformer3DModel and WanPipeline),
// as AI Toolkit trains it (toolkit/models/wan21/wan21.py, class Wan21, arch "wan21"; its UI names the two
// sizes `wan21:1b` and `wan21:14b`, the tag dropped before the arch is read: config_modules.py:764-768).
// Its parts: the transformer (transformer.cpp), UMT5-XXL's prompt (text_pipeline.cpp), the Wan 2.1 VAE — the
// causal video autoencoder Qwen-Image's derives from, the same layers and latent statistics
// (vae/qwen_image_vae.h; latents 1 + (F - 1) / 4 frames, 8x spatial, 16 channels) — classifier-free guidance
// in two forwards (WanPipeline) and the flow schedule's static shift 3 (wan21.py:79-84).
#include <nlohmann/json.hpp>

#include "gclab/config/user_error.h"
#include "gclab/model/registry.h"

namespace gclab::model {
namespace wan {
std::shared_ptr<DiffusionTransformer> build_transformer(const ModelSpec& spec, const torch::TensorOptions& options);
std::shared_ptr<const text::TextPipeline> text_pipeline();
std::unique_ptr<FrameConditioning> first_frame_conditioning(const ModelSpec& spec,
                                                            const FrameConditioningSource& source);
std::unique_ptr<FrameConditioning> first_latents_conditioning(const ModelSpec& spec,
                                                              const FrameConditioningSource& source);
}  // namespace wan

namespace {

const Family kWanId("wan");  // the registry's key: this folder's name

// WanRotaryPosEmbed's split of a head: rows and columns 2 (d / 6) each, frames the rest (128: 44, 42, 42).
std::vector<int64_t> rope_axes(int64_t head_dim) {
  const int64_t side = 2 * (head_dim / 6);
  return {head_dim - 2 * side, side, side};
}

// The transformer's shape (diffusers' scripts/convert_wan_to_diffusers.py get_transformer_config: layers,
// heads of 128, FFN) with what every Wan shares: patch (1, 2, 2), UMT5's 4096-wide text padded to 512 rows,
// the Wan 2.1 VAE's latents.
ModelSpec wan_preset(const std::string& preset, int64_t heads, int64_t ffn, int layers) {
  ModelSpec s;
  s.preset = preset;
  s.family = kWanId;
  s.heads = heads, s.head_dim = 128, s.hidden = heads * 128, s.mlp_hidden = ffn;
  s.single_blocks = layers;
  s.latent_channels = 16, s.out_channels = 16, s.latent_spatial = 8, s.latent_temporal = 4;
  s.patch = 2, s.patch_frames = 1;
  s.text_dim = 4096, s.max_text_tokens = 512;  // wan21.py get_prompt_embeds: max_sequence_length=512
  s.rope_axes = rope_axes(s.head_dim), s.rope_theta = 10000;
  // wan21.py get_bucket_divisibility: 16 (the VAE's 8 x the patch's 2).
  s.divisibility = 16, s.preview_divisibility = 16;
  return s;
}

ModelSpec tiny_wan21() {
  ModelSpec s = families_shared::tiny(wan_preset("tiny-wan21", 12, 8960, 30), "tiny-wan21");
  s.single_blocks = 2, s.mlp_hidden = 256, s.max_text_tokens = 16;
  s.rope_axes = rope_axes(s.head_dim);
  return s;
}

// Wan 2.2 TI2V 5B (Wan-AI/Wan2.2-TI2V-5B-Diffusers; convert_wan_to_diffusers.py: 30 layers of 24 heads, FFN
// 14336, 48 channels in and out) on the Wan 2.2 VAE (48 channels, 16x): AI Toolkit's Wan225bModel
// (extensions_built_in/diffusion_models/wan22/wan22_5b_model.py), buckets of 32 (its 16x and the 2x2 patch,
// :117-119), previews rounded to 32 as well (the token grid needs even latent sides).
constexpr const char* kWan22_5b = "wan22_5b";  // ModelSpec::variant: the model class

ModelSpec wan22_5b(ModelSpec s) {
  s.latent_channels = s.out_channels = 48, s.latent_spatial = 16;
  s.divisibility = s.preview_divisibility = 32;
  s.variant = kWan22_5b;
  return s;
}

// Wan 2.2 A14B (Wan-AI/Wan2.2-T2V-A14B-Diffusers, -I2V-A14B-: two 14B transformers, `transformer` and
// `transformer_2`, each Wan 2.1 14B's shape): AI Toolkit's Wan2214bModel and Wan2214bI2VModel
// (extensions_built_in/diffusion_models/wan22/wan22_14b_model.py, wan22_14b_i2v_model.py) — the high-noise
// expert above 0.875 and the low-noise one below (multistage_boundaries [0.875, 0.0], :191-194; I2V too: its
// boundary_ratio_i2v is never read, :34-35, 356), shift 5 (wan22_5b_model.py's scheduler_config), the Wan 2.1
// VAE (_wan_vae_path "ai-toolkit/wan2.1-vae").
constexpr const char* kWan22_14b = "wan22_14b";  // ModelSpec::variant

ModelSpec wan22_14b(ModelSpec s, const std::string& preset) {
  s.preset = preset;
  s.variant = kWan22_14b;
  s.expert_boundaries = {0.875, 0.0};
  return s;
}

// Wan 2.1 I2V (Wan-AI/Wan2.1-I2V-14B-480P and -720P, one shape; convert_wan_to_diffusers.py): the 14B with
// 36 input channels (the noisy 16, the first frame's mask 4 and latents 16) and CLIP ViT-H/14's 257 image
// tokens of width 1280 cross-attended through their own keys and values.
ModelSpec image_to_video(ModelSpec s, const std::string& preset, int64_t image_dim, int64_t image_tokens) {
  s.preset = preset;
  s.condition_input_channels = s.latent_temporal + s.latent_channels;
  s.image_embed_dim = image_dim, s.image_embed_tokens = image_tokens;
  return s;
}

// WanPipeline's guidance: the conditional and unconditional predictions from two forwards of one sample.
class TwoForwardCfg final : public Guidance {
 public:
  bool one_batch() const override { return false; }
};

// AI Toolkit's convert_to_original (toolkit/models/wan21/wan_lora_convert.py:40-79), which
// convert_lora_weights_before_save applies (wan21.py:726-727): a PEFT key in Wan's original names, ComfyUI's.
// Python's str.replace (every occurrence) and `in` tests, each group's first rule that applies.
std::string original_lora_key(const std::string& module_path) {
  std::string key = "diffusion_model." + module_path;
  auto has = [&](const std::string& what) { return key.find(what) != std::string::npos; };
  auto replace = [&](const std::string& from, const std::string& to) {
    for (size_t at = key.find(from); at != std::string::npos; at = key.find(from, at + to.size()))
      key.replace(at, from.size(), to);
  };
  if (has("attn1"))
    replace("attn1", "self_attn");
  else if (has("attn2"))
    replace("attn2", "cross_attn");
  const std::pair<const char*, const char*> attention[] = {
      {"to_out.0", "o"}, {"to_q", "q"}, {"to_k", "k"}, {"to_v", "v"}, {"add_k_proj", "k_img"}, {"add_v_proj", "v_img"}};
  for (const auto& [from, to] : attention)
    if (has(from)) {
      replace(from, to);
      break;
    }
  if (has("ffn.net.0.proj"))
    replace("ffn.net.0.proj", "ffn.0");
  else if (has("ffn.net.2"))
    replace("ffn.net.2", "ffn.2");
  return key;
}

// The model class an arch's preset is (ModelSpec::variant).
std::string variant_of(const std::string& arch) {
  const ArchFacts* facts = find_arch(arch);
  return facts ? spec_by_preset(facts->preset).variant : "";
}

class Wan final : public ModelFamily {
 public:
  using ModelFamily::flow_schedule;
  Family id() const override { return kWanId; }
  std::string lora_file_key(const std::string& module_path) const override { return original_lora_key(module_path); }
  // wan21.py:732-733, wan22_5b_model.py:152-153 (ss_base_model_version in a saved LoRA).
  // wan22_14b_model.py:408-409 for both A14B classes.
  std::string base_model_version(const std::string& arch) const override {
    const std::string variant = variant_of(arch);
    return variant == kWan22_5b ? "wan_2.2_5b" : variant == kWan22_14b ? "wan_2.2_14b" : "wan_2.1";
  }
  // quantize_model (toolkit/util/quantize.py) with BaseModel's get_quantization_exclude_modules (None) and no
  // quantize_kwargs: every Linear of the blocks; the 5B keeps its conditioning embedders and output
  // projection in their dtype (wan22_5b_model.py:121-124).
  config::QuantizeKwargs quantization_filter(const config::ModelConfig& model) const override {
    config::QuantizeKwargs k;
    // The A14B's too, each expert quantized alone (wan22_14b_model.py:214-218).
    const std::string variant = variant_of(model.arch);
    if (variant == kWan22_5b || variant == kWan22_14b) k.exclude = {"condition_embedder*", "proj_out*"};
    return k;
  }
  // wan21.py:432-436: under quantize_te, UMT5 whole, as model.qtype (not qtype_te).
  TextEncoderQuantization text_encoder_quantization() const override {
    TextEncoderQuantization q;
    q.as_qtype_te = false;
    return q;
  }
  std::shared_ptr<DiffusionTransformer> build_transformer(const ModelSpec& spec,
                                                          const torch::TensorOptions& options) const override {
    return wan::build_transformer(spec, options);
  }
  std::string describe_blocks(const ModelSpec& s) const override {
    return std::to_string(s.single_blocks) + " video (self + cross attention)";
  }
  // Wan21.load_wan_transformer and load_model (wan21.py:344-391, 445-448, 479-485): the transformer in its
  // dtype, whole on the device unless low_vram; quantize_model sends each quantized block to the CPU; UMT5
  // loads; then the transformer comes back to the device.
  std::vector<ArchFacts> archs() const override {
    const auto L = TransformerLoading::parked_while_text_encoders_load;
    const auto E = TransformerLoading::experts_in_turn;
    // Wan21I2V (wan21_i2v.py:283-284) loads as Wan21 does; its UI's 14b480p and 14b (720P) are one shape.
    // Wan225bModel (wan22_5b_model.py:83-84) loads as Wan21 does.
    return {{"wan21", kWanId, "wan21-14b", false, "1.3B", "wan21-1.3b", L, {"Wan2.1-T2V"}},
            {"wan21_i2v", kWanId, "wan21-i2v-14b", false, "", "", L, {"Wan2.1-I2V"}},
            {"wan22_5b", kWanId, "wan22-5b", false, "", "", L, {"Wan2.2-TI2V"}},
            // Wan2214bModel.load_wan_transformer (wan22_14b_model.py:252-381): the experts in turn.
            {"wan22_14b", kWanId, "wan22-14b", false, "", "", E, {"Wan2.2-T2V-A14B"}},
            {"wan22_14b_i2v", kWanId, "wan22-14b-i2v", false, "", "", E, {"Wan2.2-I2V-A14B"}},
            {"tiny-wan21", kWanId, "tiny-wan21", true, "", "", L, {}},
            {"tiny-wan21-i2v", kWanId, "tiny-wan21-i2v", true, "", "", L, {}},
            {"tiny-wan22-5b", kWanId, "tiny-wan22-5b", true, "", "", L, {}},
            {"tiny-wan22-14b", kWanId, "tiny-wan22-14b", true, "", "", E, {}},
            {"tiny-wan22-14b-i2v", kWanId, "tiny-wan22-14b-i2v", true, "", "", E, {}}};
  }
  std::vector<ModelSpec> presets() const override {
    const ModelSpec wan14b = wan_preset("wan21-14b", 40, 13824, 40);
    ModelSpec tiny5b = tiny_wan21();
    tiny5b.preset = "tiny-wan22-5b";
    return {wan_preset("wan21-1.3b", 12, 8960, 30), wan14b, image_to_video(wan14b, "wan21-i2v-14b", 1280, 257),
            wan22_5b(wan_preset("wan22-5b", 24, 14336, 30)), tiny_wan21(),
            // The tiny CLIP tower's (text::ClipVisionConfig::tiny): width 32, 4 x 4 patches and its class token.
            image_to_video(tiny_wan21(), "tiny-wan21-i2v", 32, 17), wan22_5b(tiny5b),
            // Wan 2.2 I2V: 36 input channels, no image tokens (image_dim None in its config).
            wan22_14b(wan14b, "wan22-14b"), wan22_14b(image_to_video(wan14b, "", 0, 0), "wan22-14b-i2v"),
            wan22_14b(tiny_wan21(), "tiny-wan22-14b"),
            wan22_14b(image_to_video(tiny_wan21(), "", 0, 0), "tiny-wan22-14b-i2v")};
  }

  // Wan21I2V.get_noise_prediction: every step encodes each sample's first frame; Wan225bModel's only for a
  // dataset with do_i2v (wan22_5b_model.py:266) — first_frame.cpp.
  bool trains_on_first_frame(const ModelSpec& spec, const config::DatasetConfig& dataset) const override {
    return spec.condition_input_channels > 0 || (spec.variant == kWan22_5b && dataset.do_i2v);
  }
  PreviewFirstFrame preview_first_frame(const ModelSpec& spec) const override {
    if (spec.condition_input_channels > 0) return PreviewFirstFrame::required;
    return spec.variant == kWan22_5b ? PreviewFirstFrame::optional : PreviewFirstFrame::none;
  }
  // Wan225bModel: the latent cache keeps first_frame_latent for a do_i2v dataset's clips (toolkit/
  // dataloader_mixins.py:2049-2064) and get_noise_prediction conditions on it (wan22_5b_model.py:266-279);
  // Wan21I2V reads batch.tensor, the pixels, in every step (wan21_i2v.py:489-498).
  bool caches_first_frame_latents(const ModelSpec& spec) const override { return spec.variant == kWan22_5b; }
  std::unique_ptr<FrameConditioning> frame_conditioning(const ModelSpec& spec,
                                                        const FrameConditioningSource& source) const override {
    if (spec.condition_input_channels > 0) return wan::first_frame_conditioning(spec, source);
    return spec.variant == kWan22_5b ? wan::first_latents_conditioning(spec, source) : nullptr;
  }

  // Wan 2.1's VAE (Qwen-Image's network); the 5B's, the Wan 2.2 VAE (wan22_5b_model.py leaves _wan_vae_path
  // unset: its repo's vae/, wan21.py:454-460).
  vae::AutoencoderConfig autoencoder(const ModelSpec& spec) const override {
    if (spec.variant == kWan22_5b)
      return spec.tiny ? vae::QwenImageVaeConfig::residual_16x_tiny() : vae::QwenImageVaeConfig::residual_16x();
    vae::QwenImageVaeConfig c = spec.tiny ? vae::QwenImageVaeConfig::tiny() : vae::QwenImageVaeConfig::preset();
    c.clamps_tiles = true;  // diffusers' AutoencoderKLWan
    return c;
  }
  // Wan21's and Wan225bModel's generate_single_image tile the decode under low_vram (wan21.py:523-528 use_vae_tiling,
  // :543-544; wan22_5b_model.py:213-215) at diffusers' default tile (256, stride 192); Wan21I2V's does not.
  bool low_vram_tiles_previews(const ModelSpec& spec) const override { return spec.condition_input_channels == 0; }
  // diffusers' WanPipeline and WanImageToVideoPipeline, and AI Toolkit's Wan22Pipeline (:77-78): a count that
  // is not 1 + 4k becomes F // 4 * 4 + 1 (40 -> 41). Rounded down to 1 + 4k (40 -> 37) where no pipeline
  // rounds first: Wan225bModel and Wan2214bI2VModel round so themselves (wan22_5b_model.py:167-170,
  // wan22_14b_i2v_model.py:33-36), and Wan 2.1's low_vram pipelines (AggressiveWanUnloadPipeline,
  // AggressiveWanI2VUnloadPipeline: wan21.py:87-213, wan21_i2v.py:46-183) take the latents' 1 + (F - 1) // 4.
  int64_t preview_frames(const ModelSpec& spec, const config::ModelConfig& model, int64_t frames) const override {
    const int64_t t = spec.latent_temporal;
    const bool wan21 = spec.variant != kWan22_5b && spec.variant != kWan22_14b;
    const bool down = spec.variant == kWan22_5b || (spec.variant == kWan22_14b && spec.condition_input_channels > 0) ||
                      (wan21 && model.low_vram);
    if (down) return ((frames - 1) / t) * t + 1;
    return frames % t == 1 ? frames : std::max<int64_t>(frames / t * t + 1, 1);
  }
  std::shared_ptr<const text::TextPipeline> text_pipeline() const override { return wan::text_pipeline(); }
  std::shared_ptr<const Guidance> preview_guidance(const ModelSpec&, bool) const override {
    return std::make_shared<TwoForwardCfg>();
  }
  // wan21.py:79-84 CustomFlowMatchEulerDiscreteScheduler(shift=3.0, use_dynamic_shifting=False); WanPipeline
  // sets its timesteps from the scheduler (no sigmas passed).
  FlowSchedule flow_schedule() const override {
    FlowSchedule s;
    s.shift = 3.0, s.dynamic = false, s.preview_from_scheduler = true;
    return s;
  }
  // Wan 2.2's: shift 5 (wan22_5b_model.py:52-57 scheduler_config, get_train_scheduler :146-150; the A14B's
  // imports it, wan22_14b_model.py:24-27 and :403-406).
  FlowSchedule flow_schedule(const ModelSpec& spec) const override {
    FlowSchedule s = flow_schedule();
    if (spec.variant == kWan22_5b || spec.variant == kWan22_14b) s.shift = 5.0;
    return s;
  }

  // Wan2214bModel (wan22_14b_model.py:196-208): model_kwargs train_high_noise (transformer_1) and
  // train_low_noise (transformer_2), both by default.
  std::vector<size_t> trained_experts(const ModelSpec& spec, const config::ModelKwargs& k) const override {
    if (spec.expert_boundaries.size() != 2) return ModelFamily::trained_experts(spec, k);
    std::vector<size_t> out;
    if (k.train_high_noise) out.push_back(0);
    if (k.train_low_noise) out.push_back(1);
    return out;
  }
  // Wan2214bModel.save_lora (wan22_14b_model.py:452-493).
  std::vector<std::string> expert_lora_suffixes(const ModelSpec& spec) const override {
    if (spec.expert_boundaries.size() != 2) return {};
    return {"_high_noise", "_low_noise"};
  }

  // Every prompt is UMT5's 512 rows (the padding zeroed), cross-attended: none in the video's sequence.
  int64_t encoder_tokens(const ModelSpec& spec, int64_t) const override { return spec.max_text_tokens; }
  int64_t sequence_rows(const ModelSpec& spec, int64_t) const override { return spec.max_text_tokens; }
  int64_t text_tokens(const ModelSpec&, int64_t) const override { return 0; }

  std::string diffusers_class() const override { return "WanTransformer3DModel"; }
  nlohmann::ordered_json diffusers_config(const ModelSpec& s) const override {
    return {{"_class_name", "WanTransformer3DModel"},
            {"added_kv_proj_dim", s.image_embed_dim > 0 ? nlohmann::json(s.hidden) : nlohmann::json()},
            {"attention_head_dim", s.head_dim},
            {"cross_attn_norm", true},
            {"eps", 1e-6},
            {"ffn_dim", s.mlp_hidden},
            {"freq_dim", 256},
            {"image_dim", s.image_embed_dim > 0 ? nlohmann::json(s.image_embed_dim) : nlohmann::json()},
            {"in_channels", s.latent_channels + s.condition_input_channels},
            {"num_attention_heads", s.heads},
            {"num_layers", s.single_blocks},
            {"out_channels", s.out_channels},
            {"patch_size", {s.patch_frames, s.patch, s.patch}},
            {"qk_norm", "rms_norm_across_heads"},
            {"rope_max_seq_len", 1024},
            {"text_dim", s.text_dim}};
  }
  void read_diffusers_config(ModelSpec& s, const nlohmann::json& c) const override {
    using families_shared::config_int;
    s.heads = config_int(c, "num_attention_heads", s.heads);
    s.head_dim = config_int(c, "attention_head_dim", s.head_dim);
    s.hidden = s.heads * s.head_dim;
    s.rope_axes = rope_axes(s.head_dim);
    s.single_blocks = static_cast<int>(config_int(c, "num_layers", s.single_blocks));
    s.mlp_hidden = config_int(c, "ffn_dim", s.mlp_hidden);
    s.text_dim = config_int(c, "text_dim", s.text_dim);
    s.out_channels = config_int(c, "out_channels", s.out_channels);
    s.latent_channels = s.out_channels;
    s.condition_input_channels = config_int(c, "in_channels", s.latent_channels) - s.latent_channels;
    s.image_embed_dim = config_int(c, "image_dim", 0);
    s.image_embed_tokens = s.image_embed_dim > 0 ? 257 : 0;  // CLIP ViT-H/14 at 224²: 16 x 16 + its class token
    if (c.contains("patch_size")) {
      const auto p = c.at("patch_size").get<std::vector<int64_t>>();
      if (p.size() != 3 || p[0] != 1 || p[1] != p[2])
        throw UserError("patch_size must be [1, p, p] (each frame patched alone), got " + c.at("patch_size").dump());
      s.patch_frames = p[0], s.patch = p[1];
    }
    if (c.value("qk_norm", std::string("rms_norm_across_heads")) != "rms_norm_across_heads" ||
        !c.value("cross_attn_norm", true) || config_int(c, "freq_dim", 256) != 256)
      throw UserError(
          "a WanTransformer3DModel with qk_norm rms_norm_across_heads, cross_attn_norm and freq_dim 256 "
          "(every Wan checkpoint's), got " +
          c.dump());
    if (c.contains("added_kv_proj_dim") && !c["added_kv_proj_dim"].is_null() &&
        config_int(c, "added_kv_proj_dim", 0) != s.hidden)
      throw UserError("added_kv_proj_dim must be the width " + std::to_string(s.hidden));
  }
  void read_tensor_shapes(ModelSpec& s, const TensorShapes& t) const override {
    s.hidden = t.dim("patch_embedding.weight", 0);
    s.heads = s.hidden / s.head_dim;
    s.latent_channels = s.out_channels = t.dim("proj_out.weight", 0) / (s.patch * s.patch);
    s.condition_input_channels = t.dim("patch_embedding.weight", 1) - s.latent_channels;
    s.mlp_hidden = t.dim("blocks.0.ffn.net.0.proj.weight", 0);
    s.single_blocks = t.count("blocks");
    s.text_dim = t.dim("condition_embedder.text_embedder.linear_1.weight", 1);
    if (t.contains("condition_embedder.image_embedder.norm1.weight"))
      s.image_embed_dim = t.dim("condition_embedder.image_embedder.norm1.weight", 0), s.image_embed_tokens = 257;
  }
};

}  // namespace

const ModelFamily& wan_family() {
  static const Wan family;
  return family;
}

}  // namespace gclab::model
