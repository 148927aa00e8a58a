// Stable Diffusion 3.5 (Large): stabilityai/stable-diffusion-3.5-large's transformer/config.json; diffusers'
// SD3Transformer2DModel and StableDiffusion3Pipeline.
#include <cmath>
#include <nlohmann/json.hpp>

#include "gclab/model/registry.h"

namespace gclab::model {
namespace sd3 {
std::shared_ptr<DiffusionTransformer> build_transformer(const ModelSpec& spec, const torch::TensorOptions& options);
std::shared_ptr<const text::TextPipeline> text_pipeline();
}  // namespace sd3

namespace {

const Family kSd3Id("sd3");  // the registry's key: this folder's name

ModelSpec sd35_large() {
  ModelSpec s;
  s.preset = "sd35-large";
  s.family = kSd3Id;
  s.hidden = 2432, s.heads = 38, s.head_dim = 64, s.mlp_hidden = 4 * 2432;
  s.double_blocks = 38;
  s.latent_channels = 16, s.out_channels = 16, s.patch = 2;
  s.text_dim = 4096, s.pooled_dim = 2048, s.max_text_tokens = 333;
  s.pos_embed_max = 192, s.sd3_base_size = 64;  // sample_size 128 / patch 2
  // StableDiffusion.get_bucket_divisibility (stable_diffusion_model.py:289-297) 32; StableDiffusion3Pipeline
  // takes multiples of 16 (its check_inputs).
  s.divisibility = 32, s.preview_divisibility = 16;
  return s;
}

class Sd3 final : public ModelFamily {
 public:
  Family id() const override { return kSd3Id; }
  std::string base_model_version(const std::string&) const override {
    return "sd_3";  // stable_diffusion_model.py:3163-3164
  }
  std::shared_ptr<DiffusionTransformer> build_transformer(const ModelSpec& spec,
                                                          const torch::TensorOptions& options) const override {
    return sd3::build_transformer(spec, options);
  }
  std::string describe_blocks(const ModelSpec& s) const override { return std::to_string(s.double_blocks) + " joint"; }

  std::vector<ArchFacts> archs() const override {
    const auto L = TransformerLoading::on_device_unless_low_vram;
    return {{"sd3", kSd3Id, "sd35-large", false, "", "", L, {"stable-diffusion-3"}},
            {"tiny-sd3", kSd3Id, "tiny-sd3", true, "", "", L, {}}};
  }

  std::vector<ModelSpec> presets() const override {
    const ModelSpec large = sd35_large();
    ModelSpec tiny = families_shared::tiny(large, "tiny-sd3");
    tiny.double_blocks = 3, tiny.max_text_tokens = 48, tiny.pos_embed_max = 64, tiny.sd3_base_size = 16;
    return {large, tiny};
  }

  // SD3 / SD3.5's AutoencoderKL: FLUX's shape (16 channels, no quant convs), scaling 1.5305, shift 0.0609.
  vae::AutoencoderConfig autoencoder(const ModelSpec& spec) const override {
    vae::AutoencoderKLConfig c;
    c.scaling_factor = 1.5305, c.shift_factor = 0.0609;
    return spec.tiny ? c.shrunk() : c;
  }
  // The StableDiffusion loader's SD3 branch quantizes with `quantize(transformer, weights=qtype)` and no
  // model.quantize_kwargs (toolkit/stable_diffusion_model.py:425-429): every Linear.
  config::QuantizeKwargs quantization_filter(const config::ModelConfig&) const override { return {}; }
  // CLIP-L and bigG (projected) and T5-XXL (text_pipeline.cpp).
  std::shared_ptr<const text::TextPipeline> text_pipeline() const override { return sd3::text_pipeline(); }
  // stable_diffusion_model.py: T5 only, under model.quantize (quantize_te is not read), as model.qtype.
  TextEncoderQuantization text_encoder_quantization() const override {
    return {/*t5_only=*/true, /*under_quantize=*/true, /*as_qtype_te=*/false};
  }
  // AI Toolkit trains and previews SD3 through get_sampler("flowmatch", arch="sd") (BaseSDTrainProcess.py:
  // 1773-1786, stable_diffusion_model.py:1212-1224): sd_flow_config, a static shift of 3.0
  // (toolkit/sampler.py:90-100, 166-167); StableDiffusion3Pipeline passes no sigmas (stable_diffusion_model.py:
  // 1581-1593 calls it without), so the scheduler lays out its own.
  FlowSchedule flow_schedule() const override {
    FlowSchedule s;
    s.dynamic = false, s.shift = 3.0, s.preview_from_scheduler = true;
    return s;
  }
  // StableDiffusion3Pipeline's CFG: both prompts in one batch.
  std::shared_ptr<const Guidance> preview_guidance(const ModelSpec&, bool) const override {
    return std::make_shared<Guidance>();
  }

  // 77 CLIP + 256 T5 rows, padded, whatever the prompt.
  int64_t encoder_tokens(const ModelSpec& spec, int64_t) const override { return spec.max_text_tokens; }
  int64_t sequence_rows(const ModelSpec& spec, int64_t) const override { return spec.max_text_tokens; }

  std::string diffusers_class() const override { return "SD3Transformer2DModel"; }
  // diffusers' SD3Transformer2DModel.named_modules() order of its Linears (as diffusers 0.42 builds it).
  std::vector<std::string> diffusers_linear_order() const override {
    return {"time_text_embed.timestep_embedder.linear_1",
            "time_text_embed.timestep_embedder.linear_2",
            "time_text_embed.text_embedder.linear_1",
            "time_text_embed.text_embedder.linear_2",
            "context_embedder",
            "transformer_blocks.*.norm1.linear",
            "transformer_blocks.*.norm1_context.linear",
            "transformer_blocks.*.attn.to_q",
            "transformer_blocks.*.attn.to_k",
            "transformer_blocks.*.attn.to_v",
            "transformer_blocks.*.attn.add_k_proj",
            "transformer_blocks.*.attn.add_v_proj",
            "transformer_blocks.*.attn.add_q_proj",
            "transformer_blocks.*.attn.to_out.0",
            "transformer_blocks.*.attn.to_add_out",
            "transformer_blocks.*.ff.net.0.proj",
            "transformer_blocks.*.ff.net.2",
            "transformer_blocks.*.ff_context.net.0.proj",
            "transformer_blocks.*.ff_context.net.2",
            "norm_out.linear",
            "proj_out"};
  }
  nlohmann::ordered_json diffusers_config(const ModelSpec& s) const override {
    return {{"_class_name", "SD3Transformer2DModel"},
            {"sample_size", s.sd3_base_size * s.patch},
            {"patch_size", s.patch},
            {"in_channels", s.latent_channels},
            {"num_layers", s.double_blocks},
            {"attention_head_dim", s.head_dim},
            {"num_attention_heads", s.heads},
            {"joint_attention_dim", s.text_dim},
            {"caption_projection_dim", s.hidden},
            {"pooled_projection_dim", s.pooled_dim},
            {"out_channels", s.out_channels},
            {"pos_embed_max_size", s.pos_embed_max},
            {"qk_norm", "rms_norm"}};
  }
  void read_diffusers_config(ModelSpec& s, const nlohmann::json& c) const override {
    using families_shared::config_int;
    families_shared::read_mmdit_config(s, c);
    s.double_blocks = static_cast<int>(config_int(c, "num_layers", s.double_blocks));
    s.pos_embed_max = config_int(c, "pos_embed_max_size", s.pos_embed_max);
    s.sd3_base_size = config_int(c, "sample_size", s.sd3_base_size * s.patch) / s.patch;
  }
  void read_tensor_shapes(ModelSpec& s, const TensorShapes& t) const override {
    s.hidden = t.dim("pos_embed.proj.weight", 0);
    families_shared::read_joint_block_shapes(s, t);
    if (t.contains("pos_embed.pos_embed"))
      s.pos_embed_max =
          static_cast<int64_t>(std::lround(std::sqrt(static_cast<double>(t.dim("pos_embed.pos_embed", 1)))));
  }
};

}  // namespace

const ModelFamily& sd3_family() {
  static const Sd3 family;
  return family;
}

}  // namespace gclab::model
