// The family registry (docs/architecture.md): each model family is one folder, src/model/families/<name>/,
// whose ModelFamily answers everything generic code asks of a family — its archs and presets, what its
// pipeline decodes and conditions with, how it guides previews, its token accounting, and how a diffusers
// config.json or a weights file gives its shape. registry.cpp lists the families, one line each; the free
// functions of family.h and spec.h ask the registry. docs/adding-a-family.md walks through adding one.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "gclab/model/activations.h"
#include "gclab/model/family.h"
#include "gclab/model/flow_schedule.h"
#include "gclab/model/frame_conditioning.h"
#include "gclab/model/guidance.h"
#include "gclab/model/spec.h"
#include "gclab/model/transformer.h"
#include "gclab/text/pipeline.h"
#include "gclab/vae/codec.h"

namespace gclab::model {

// A weights file's tensor shapes, as a family reads its transformer's shape from them (a single
// `.safetensors` as model.name_or_path, no config.json). The lookups throw UserError naming the file.
class TensorShapes {
 public:
  virtual ~TensorShapes() = default;
  virtual bool contains(const std::string& name) const = 0;
  virtual int64_t dim(const std::string& name, size_t d) const = 0;
  virtual int count(const std::string& prefix) const = 0;  // blocks "<prefix>.<N>." present: the largest N + 1
  virtual std::string file() const = 0;                    // for messages
};

class ModelFamily {
 public:
  virtual ~ModelFamily() = default;
  virtual Family id() const = 0;

  // The model.arch ids it answers, its own first and then its tiny ones (listed to users in that order,
  // family by family).
  virtual std::vector<ArchFacts> archs() const = 0;
  // Its presets, full size and tiny (`family`, `divisibility` and `preview_divisibility` set).
  virtual std::vector<ModelSpec> presets() const = 0;

  // Its transformer for `spec` (one of its presets, or a shape read from a user's files); `options` place
  // and type the weights (kMeta: no memory).
  virtual std::shared_ptr<DiffusionTransformer> build_transformer(const ModelSpec& spec,
                                                                  const torch::TensorOptions& options) const = 0;

  // Its blocks in words, for summaries ("19 double-stream + 38 single-stream").
  virtual std::string describe_blocks(const ModelSpec& spec) const = 0;

  // The autoencoder its pipeline encodes and decodes with.
  virtual vae::AutoencoderConfig autoencoder(const ModelSpec& spec) const = 0;
  // Its text pipeline (text/pipeline.h): which text encoders, in the diffusers folder's order (text_encoder,
  // text_encoder_2, text_encoder_3), how the pipeline calls them and composes what they return; null: no text
  // (DiT's class labels).
  virtual std::shared_ptr<const text::TextPipeline> text_pipeline() const = 0;
  // The pipeline of the model class `spec` is, where a family's classes condition on other encoders (FLUX.2-dev
  // on Mistral, klein on Qwen3); the family's by default. What every caller asks.
  virtual std::shared_ptr<const text::TextPipeline> text_pipeline(const ModelSpec& /*spec*/) const {
    return text_pipeline();
  }
  // What the transformer of `spec` takes from that pipeline: by default its text and pooled widths, its
  // text length and its condition_area.
  virtual text::PipelineTarget text_target(const ModelSpec& spec) const {
    text::PipelineTarget t;
    t.text_width = spec.text_dim;
    t.pooled_width = spec.pooled_dim;
    t.max_tokens = spec.max_text_tokens;
    t.condition_area = spec.condition_area;
    return t;
  }
  // Which text encoders AI Toolkit's loader quantizes, under which switch, as which qtype.
  virtual TextEncoderQuantization text_encoder_quantization() const { return {}; }
  // The same for the model class `spec` is (the family's by default): what every caller asks.
  virtual TextEncoderQuantization text_encoder_quantization(const ModelSpec& /*spec*/) const {
    return text_encoder_quantization();
  }
  // Whether a training step leaves the guidance embedder of a guidance-distilled `spec` out: AI Toolkit's
  // train.bypass_guidance_embedding, which FLUX.1's and Flex's model classes read; a class without the switch
  // says false (the step embeds train.cfg_scale).
  virtual bool bypasses_guidance(const ModelSpec& /*spec*/, const config::TrainConfig& train) const {
    return train.bypass_guidance_embedding;
  }
  // How its preview pipeline guides (model/guidance.h), for this shape; `do_cfg_norm` is sample.do_cfg_norm,
  // AI Toolkit's key, read by the pipelines whose rescale is optional.
  virtual std::shared_ptr<const Guidance> preview_guidance(const ModelSpec& spec, bool do_cfg_norm) const = 0;
  // The flow-matching schedule AI Toolkit trains and previews it with (flow_schedule.h); by default its
  // flux_config: dynamic, mu 0.5 at 256 tokens to 1.15 at 4096.
  virtual FlowSchedule flow_schedule() const {
    FlowSchedule s;  // flux_config: shift 3 (unused), dynamic, 0.5 / 1.15 over 256 / 4096 tokens
    s.dynamic = true;
    return s;
  }
  // The schedule of the model class `spec` is, where a family's classes differ (Wan 2.2's shift 5 beside Wan
  // 2.1's 3); the family's by default. What a run trains and previews with.
  virtual FlowSchedule flow_schedule(const ModelSpec& /*spec*/) const { return flow_schedule(); }
  // AI Toolkit's get_transformer_block_names: with network.transformer_only (its default) LoRA goes on the
  // Linears of the blocks whose name contains one of these (toolkit/lora_special.py:531-541); empty: every
  // block (the families whose model classes name none, FLUX.1 / SD3, get every block there too).
  virtual std::vector<std::string> lora_block_names() const { return {}; }
  // A module's key in a LoRA file as AI Toolkit saves it (before ".lora_A.weight"): the PEFT network's
  // "transformer.<path>", which the model classes with a convert_lora_weights_before_save rename (Qwen-Image's
  // and Z-Image's prefix "diffusion_model.", Wan's original module names: ComfyUI's).
  virtual std::string lora_file_key(const std::string& module_path) const { return "transformer." + module_path; }
  // The diffusers model class's Linears in its named_modules order, a block's index written "*" (the first
  // ".<N>." of a path), each listed once: the order AI Toolkit's LoRA network creates its modules in, and so
  // the order of its optimizer's parameters (toolkit/lora_special.py:484-486, toolkit/kohya_lora.py:1030-
  // 1075). Empty: not known, and an AI Toolkit optimizer.pt is not mapped onto this family's adapters.
  virtual std::vector<std::string> diffusers_linear_order() const { return {}; }
  // AI Toolkit's get_base_model_version for one of the family's archs: a LoRA file's ss_base_model_version
  // (BaseModel's default: the arch).
  virtual std::string base_model_version(const std::string& arch) const { return arch; }
  // Which of the transformer's Linears model.quantize leaves in their dtype, as the arch's AI Toolkit
  // loader chooses them: fnmatch patterns on module names to exclude, and (empty: all) to include. The
  // default is the StableDiffusion loader's and Flex.2's: model.quantize_kwargs (stable_diffusion_model.py:
  // 799, flex2.py:126); a model class with its own list overrides it.
  virtual config::QuantizeKwargs quantization_filter(const config::ModelConfig& model) const {
    return model.quantize_kwargs;
  }
  // Whether the arch's AI Toolkit model class loads model.assistant_lora_path (merged for training, taken
  // back out while sampling); the others fail on it when they sample (BaseModel.generate_images reads an
  // assistant network they never built), so gclab refuses it up front.
  virtual bool takes_assistant_adapter(const std::string& /*arch*/) const { return false; }
  // What the arch's model class changes in model's settings as it loads (run once, after the config is read;
  // returns what to tell the user, empty when nothing changed). Z-Image: an assistant adapter turns qfloat8
  // into float8.
  virtual std::string resolve_model_config(config::ModelConfig& /*model*/) const { return {}; }
  // Whether a dataset's control_path images enter as channels beside the latents (Flex.2: encoded at the
  // training image's size every step, flex2.py:513-521) rather than as reference tokens (spec.reference_tokens).
  virtual bool controls_as_channels(const ModelSpec& /*spec*/) const { return false; }
  // The channels it concatenates on the noisy latents in training (AI Toolkit's condition_noisy_latents),
  // from the clean latents `x0` (in the compute dtype), the batch's encoded control latents (one per
  // control folder; empty: none) and its inpainting mask `keep` ([B, 1, H, W] in pixels, 1 where the image
  // is kept: the inpainting images' alpha, else the loss mask; undefined: none), drawing from torch's
  // generator; undefined: none.
  virtual torch::Tensor training_condition(const ModelSpec& /*spec*/, const config::ModelKwargs& /*kwargs*/,
                                           const torch::Tensor& /*x0*/, const std::vector<torch::Tensor>& /*controls*/,
                                           const torch::Tensor& /*keep*/) const {
    return {};
  }
  // A preview's ctrl_img taken as channels beside the latents (Flex.2's pipeline): refuses, when the run is
  // planned, what AI Toolkit's pipeline would fail on at the preview (a UserError naming the file and the
  // fix); `index` is the prompt's ctrl_idx.
  virtual void check_preview_control(const ModelSpec& /*spec*/, const std::filesystem::path& /*file*/,
                                     int /*index*/) const {}
  // Those channels for a preview of width x height from ctrl_img `file` at slot `index`, `encode` taking
  // [1, 3, H, W] in [-1, 1] to latents on the device; undefined: the arch's previews take none.
  virtual torch::Tensor preview_condition(const ModelSpec& /*spec*/, const std::filesystem::path& /*file*/,
                                          int /*index*/, int /*width*/, int /*height*/,
                                          const std::function<torch::Tensor(const torch::Tensor&)>& /*encode*/) const {
    return {};
  }
  // The tokens AI Toolkit's trainer shifts a step's timesteps by (set_train_timesteps' image_seq_len: the
  // latents' h·w over the square of the patch BaseSDTrainProcess passes — 2 for FLUX.1 / Flex, else the
  // transformer config's patch_size, jobs/process/BaseSDTrainProcess.py:1212-1217): the image's tokens,
  // unless the family's model class gives another patch.
  virtual int64_t shift_tokens(const ModelSpec& spec, const SampleShape& shape) const {
    return image_tokens(spec, shape);
  }
  // An edit model's reference images (spec.reference_tokens): whether each preview must have a ctrl_img (the
  // model class fails without one), and the most control images a sample may have (0: any number).
  virtual bool preview_needs_control(const ModelSpec& /*spec*/) const { return false; }
  virtual int max_control_images(const ModelSpec& /*spec*/) const { return 0; }
  // An image-to-video model's first frames (frame_conditioning.h): whether a dataset's steps condition on its
  // samples' first frames (their pixels are then needed in every step), and whether a preview takes its
  // ctrl_img as the first frame — required (Wan 2.1 I2V), optional (Wan 2.2 TI2V 5B) or not at all.
  virtual bool trains_on_first_frame(const ModelSpec& /*spec*/, const config::DatasetConfig& /*dataset*/) const {
    return false;
  }
  virtual PreviewFirstFrame preview_first_frame(const ModelSpec& /*spec*/) const { return PreviewFirstFrame::none; }
  // Whether a dataset that caches its latents caches each clip's first frame's latents beside them (AI
  // Toolkit's first_frame_latent), the steps conditioning on those (FirstFrames::latents); false: the
  // conditioning reads the pixels in every step, which a batch of cached latents does not carry.
  virtual bool caches_first_frame_latents(const ModelSpec& /*spec*/) const { return false; }
  // That conditioning, built for a run (frame_conditioning.h): its image encoder's weights from `source`.
  virtual std::unique_ptr<FrameConditioning> frame_conditioning(const ModelSpec& /*spec*/,
                                                                const FrameConditioningSource& /*source*/) const {
    return nullptr;
  }
  // A model of several experts (ModelSpec::expert_boundaries, experts.h): the experts a config trains, by
  // index (every one by default), and each expert's LoRA file suffix where one file is saved per expert.
  virtual std::vector<size_t> trained_experts(const ModelSpec& spec, const config::ModelKwargs& /*kwargs*/) const {
    std::vector<size_t> all;
    for (size_t i = 0; i < spec.expert_boundaries.size(); ++i) all.push_back(i);
    return all;
  }
  virtual std::vector<std::string> expert_lora_suffixes(const ModelSpec& /*spec*/) const { return {}; }
  // The frames a preview of sample.num_frames `frames` renders, as the family's model class and the pipeline
  // it builds for `model` round them (a video family's latents take 1 + t k frames).
  virtual int64_t preview_frames(const ModelSpec& /*spec*/, const config::ModelConfig& /*model*/,
                                 int64_t frames) const {
    return frames;
  }
  // Whether AI Toolkit's model class tiles the preview decode under model.low_vram.
  virtual bool low_vram_tiles_previews(const ModelSpec& /*spec*/) const { return false; }

  // Token accounting (spec.h): the rows the text encoder hands the transformer for a prompt of
  // `prompt_tokens` (>= 1) tokenizer tokens; the rows the transformer takes when the pipeline gave
  // `pipeline_rows`; the text tokens in its sequence for `encoder_rows` of the encoder.
  virtual int64_t encoder_tokens(const ModelSpec& spec, int64_t prompt_tokens) const = 0;
  virtual int64_t sequence_rows(const ModelSpec& spec, int64_t pipeline_rows) const = 0;
  virtual int64_t text_tokens(const ModelSpec& /*spec*/, int64_t encoder_rows) const { return encoder_rows; }

  // Its shape from a user's files, over the arch's preset: the diffusers transformer class its
  // config.json names, that config.json's keys, or a weights file's tensors (diffusers naming).
  virtual std::string diffusers_class() const = 0;
  // The transformer/config.json diffusers writes for it (a full fine-tune saved as a diffusers folder):
  // keys and values as the reference configs have them.
  virtual nlohmann::ordered_json diffusers_config(const ModelSpec& spec) const = 0;
  virtual void read_diffusers_config(ModelSpec& spec, const nlohmann::json& config) const = 0;
  virtual void read_tensor_shapes(ModelSpec& spec, const TensorShapes& tensors) const = 0;
  // What a weights file holding `key` is when that key is in a layout the family does not load (a BFL /
  // Stability / ComfyUI checkpoint for the diffusers-named families): said to the user; empty: not foreign.
  virtual std::string foreign_layout(const std::string& key) const;
  // What a shape read from a file implies beyond its own numbers (Z-Image's adaLN width).
  virtual void complete_shape(ModelSpec& /*spec*/) const {}
};

// Every registered family: the ones gclab ships (registry.cpp, a line each), then any registered since.
const std::vector<const ModelFamily*>& families();
// Adds a family that lives outside src/ (a test's own, tests/families/): its archs and presets are then
// known like the shipped ones'. Throws std::logic_error for an id registered already.
void register_family(const ModelFamily& family);
// The family `id` names (std::logic_error for one not registered).
const ModelFamily& family_of(Family id);

// Helpers the family folders share (families/shared.cpp).
namespace families_shared {
// Tiny presets: the full-size spec at CPU-test size (width 128, 4 heads of 32, text width 64, pooled 32,
// rotary axes 8/12/12); each family then sets its depth and text length.
ModelSpec tiny(const ModelSpec& full, const std::string& preset);
// The features of one packed latent token (FLUX / Qwen-Image: patch x patch pieces of every channel).
int64_t packed_features(const ModelSpec& spec);
// A number from a diffusers config.json, or `fallback` where the key is absent.
int64_t config_int(const nlohmann::json& config, const char* key, int64_t fallback);
// The keys diffusers' MM-DiT-style transformers share (FLUX, Qwen-Image, SD3, DiT): num_attention_heads,
// attention_head_dim (the width follows, the MLP 4x), joint_attention_dim, pooled_projection_dim,
// axes_dims_rope.
void read_mmdit_config(ModelSpec& spec, const nlohmann::json& config);
// FLUX and SD3 name their joint blocks and embedders alike (diffusers' MM-DiT): head width, MLP width,
// depth, text and pooled widths from the tensors.
void read_joint_block_shapes(ModelSpec& spec, const TensorShapes& tensors);
}  // namespace families_shared

}  // namespace gclab::model
