// The AI Toolkit training config as C++ structs: one struct per YAML block, with AI Toolkit's key
// names and defaults (ostris/ai-toolkit, toolkit/config_modules.py), plus gclab's own keys marked so.
//
// Each struct lists its keys exactly once, in `fields(V&)`; the loader reads through that list, the
// resolved-YAML writer writes through it, and `ignore(...)` names the AI Toolkit keys gclab accepts but
// does not act on (reported once as "ignored", never silently dropped).
#pragma once

#include <algorithm>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "gclab/ckpt/policy.h"
#include "gclab/config/choices.h"

namespace gclab::config {

// network.network_kwargs: what AI Toolkit hands LoRASpecialNetwork beside the config's own keys
// (BaseSDTrainProcess.py:1928-1978); the two that choose the adapted Linears (lora_special.py:524-525,
// 570-573): a Linear whose name ("transformer.<path>") contains an ignore_if_contains word gets none, and
// with only_if_contains only one whose name contains one of its words gets one.
struct NetworkKwargs {
  std::vector<std::string> only_if_contains;  // empty: no restriction
  std::vector<std::string> ignore_if_contains;

  template <class V>
  void fields(V& v) {
    v("only_if_contains", only_if_contains);
    v("ignore_if_contains", ignore_if_contains);
  }
};

struct NetworkConfig {
  std::string type = "lora";
  std::optional<int> linear;  // LoRA rank; AI Toolkit's older spelling is `rank`
  std::optional<int> rank;
  std::optional<double> linear_alpha;  // defaults to `alpha`
  double alpha = 1.0;
  std::optional<double> dropout;
  // gclab's: scale the adapters by linear_alpha / linear. AI Toolkit saves these families' LoRAs in PEFT
  // format and sets alpha = rank (scale 1) whatever linear_alpha says (toolkit/lora_special.py); off,
  // gclab does the same.
  bool use_linear_alpha = false;
  // AI Toolkit's default (config_modules.py:202): adapters only in the family's transformer blocks
  // (get_transformer_block_names); false: on every Linear of the transformer.
  bool transformer_only = true;
  NetworkKwargs network_kwargs;
  // A model of several experts saves one LoRA file per expert, <name>_high_noise / _low_noise.safetensors
  // (config_modules.py:217, default true; wan22_14b_model.py:452-493); false: one file with every adapter.
  bool split_multistage_loras = true;

  template <class V>
  void fields(V& v) {
    v("type", type);
    v("linear", linear);
    v("rank", rank);
    v("linear_alpha", linear_alpha);
    v("alpha", alpha);
    v("dropout", dropout);
    v("use_linear_alpha", use_linear_alpha);
    v("transformer_only", transformer_only);
    v("network_kwargs", network_kwargs);
    v("split_multistage_loras", split_multistage_loras);
    v.ignore({"conv", "conv_alpha", "lokr_full_rank", "lokr_factor", "split_multistage_loras", "lorm", "normalize"});
  }
};

struct SaveConfig {
  DType dtype = DType::fp16;
  int save_every = 1000;
  int max_step_saves_to_keep = 5;
  SaveFormat save_format = SaveFormat::safetensors;  // AI Toolkit's UI writes diffusers into every job

  template <class V>
  void fields(V& v) {
    v("dtype", dtype);
    v("save_every", save_every);
    v("max_step_saves_to_keep", max_step_saves_to_keep);
    v("save_format", save_format);
    v.ignore({"push_to_hub", "hf_repo_id", "hf_private"});
  }
};

struct DatasetConfig {
  std::optional<std::string> folder_path;
  std::optional<std::string> default_caption;
  std::optional<std::string> trigger_word;
  std::string caption_ext = ".txt";  // AI Toolkit adds the leading dot
  double caption_dropout_rate = 0.0;
  bool shuffle_tokens = false;
  int keep_tokens = 0;
  std::vector<int> resolution = {512};  // a scalar in YAML becomes a one-item list
  int num_repeats = 1;
  bool flip_x = false;
  bool flip_y = false;
  bool random_crop = false;
  bool cache_latents = false;
  bool cache_latents_to_disk = false;
  bool cache_text_embeddings = false;
  std::optional<int> batch_size;  // gclab: per-dataset batch size override
  std::vector<std::string> control_path;
  // The colour a transparent control image is pasted over (config_modules.py:985; data::decode_control_rgb).
  std::vector<int> control_transparent_color = {0, 0, 0};
  // Flex.2's inpainting images: the same-named RGBA .png / .webp, alpha 0 where the model learns to inpaint
  // (toolkit/config_modules.py:986-988).
  std::optional<std::string> inpaint_path;
  // The loss mask: the same-named image in mask_path (white: the loss counts), or the image's own alpha
  // (alpha_mask); invert_mask inverts it, mask_min_value is its floor (config_modules.py:989-997).
  std::optional<std::string> mask_path;
  bool alpha_mask = false;
  bool invert_mask = false;
  double mask_min_value = 0.0;
  bool is_reg = false;
  // Each item's loss times this (toolkit/config_modules.py:1042; SDTrainer.calculate_loss, SDTrainer.py:544,
  // 994: per item, before the batch's mean).
  double loss_multiplier = 1.0;
  // Video: each sample is num_frames frames (1: images; config_modules.py:1054-1064). A clip is a video file
  // (FFmpeg's libraries decode it) or a folder of numbered frames, beside its caption; shrink_video_to_frames
  // takes num_frames frames evenly spread over the clip (dataloader_mixins.py:563-566), false every
  // round(clip fps / fps)-th frame from a random start (:567-585; data::sample_frame_indices).
  int num_frames = 1;
  bool shrink_video_to_frames = true;
  // An image-to-video model trains on each clip's first frame (config_modules.py:1089, False; AI Toolkit's UI
  // sets it for Wan 2.2 TI2V 5B, options.tsx:383): read by the families whose model class reads it.
  bool do_i2v = false;
  // AI Toolkit's per-clip frame count (config_modules.py:1069-1074; dataloader_mixins.py:484-509): each video
  // at its own length at `fps`, snapped to the autoencoder's temporal factor (data::item_frames), its frames
  // from the start at `fps` with trim_auto_frame_count_tail (the default), else as num_frames picks them; a
  // dataset of videos even with num_frames 1 (data::video_dataset).
  bool auto_frame_count = false;
  bool trim_auto_frame_count_tail = true;
  int fps = 24;

  template <class V>
  void fields(V& v) {
    v("folder_path", folder_path);
    v("default_caption", default_caption);
    v("trigger_word", trigger_word);
    v("caption_ext", caption_ext);
    v("caption_dropout_rate", caption_dropout_rate);
    v("shuffle_tokens", shuffle_tokens);
    v("keep_tokens", keep_tokens);
    v("resolution", resolution);
    v("num_repeats", num_repeats);
    v("flip_x", flip_x);
    v("flip_y", flip_y);
    v("random_crop", random_crop);
    v("cache_latents", cache_latents);
    v("cache_latents_to_disk", cache_latents_to_disk);
    v("cache_text_embeddings", cache_text_embeddings);
    v("batch_size", batch_size);
    v("control_path", control_path);
    v("control_transparent_color", control_transparent_color);
    v("inpaint_path", inpaint_path);
    v("mask_path", mask_path);
    v("alpha_mask", alpha_mask);
    v("invert_mask", invert_mask);
    v("mask_min_value", mask_min_value);
    v("is_reg", is_reg);
    v("loss_multiplier", loss_multiplier);
    v("num_frames", num_frames);
    v("shrink_video_to_frames", shrink_video_to_frames);
    v("do_i2v", do_i2v);
    v("auto_frame_count", auto_frame_count);
    v("trim_auto_frame_count_tail", trim_auto_frame_count_tail);
    v("fps", fps);
    v.ignore({"type",
              "dataset_path",
              "random_triggers",
              "random_triggers_max",
              "random_scale",
              "scale",
              "buckets",
              "bucket_tolerance",
              "network_weight",
              "token_dropout_rate",
              "augments",
              "full_size_control_images",
              "unconditional_path",
              "poi",
              "use_short_captions",
              "cache_clip_vision_to_disk",
              "standardize_images",
              "augmentations",
              "shuffle_augmentations",
              "caption_type",
              "clip_image_path",
              "replacements",
              "num_workers",
              "prefetch_factor",
              "square_crop",
              "controls",
              "fast_image_size"});
  }
};

// train.lr_scheduler_params: what AI Toolkit passes to its scheduler (toolkit/scheduler.py); each unset
// value is the scheduler's own default.
struct LrSchedulerParams {
  std::optional<int> num_warmup_steps;    // constant_with_warmup (default 1000); refused under cosine
  std::optional<double> start_factor;     // linear: torch LinearLR (default 1/3)
  std::optional<double> end_factor;       // linear (default 1)
  std::optional<double> eta_min;          // cosine's floor (default 0)
  std::optional<int> cosine_decay_steps;  // read only to refuse it: CosineAnnealingLR takes no such keyword

  template <class V>
  void fields(V& v) {
    v("num_warmup_steps", num_warmup_steps);
    v("start_factor", start_factor);
    v("end_factor", end_factor);
    v("eta_min", eta_min);
    v("cosine_decay_steps", cosine_decay_steps);
  }
};

struct EmaConfig {
  bool use_ema = false;
  double ema_decay = 0.999;
  // toolkit/ema.py: push the trained weights away from the EMA by 10x its step, and scale them each update.
  bool use_feedback = false;
  double param_multiplier = 1.0;

  template <class V>
  void fields(V& v) {
    v("use_ema", use_ema);
    v("ema_decay", ema_decay);
    v("use_feedback", use_feedback);
    v("param_multiplier", param_multiplier);
  }
};

// train.optimizer_params: passed to the optimizer as AI Toolkit passes them (what is not given takes the
// optimizer's own default); a key the chosen optimizer does not take is refused by the loader.
struct OptimizerParams {
  double weight_decay = 0.01;  // torch.optim.AdamW's default, which AI Toolkit inherits
  std::vector<double> betas = {0.9, 0.999};
  double eps = 1e-8;
  // adafactor (AI Toolkit's toolkit/optimizers/adafactor.py)
  std::optional<bool> relative_step, scale_parameter, warmup_init;
  std::optional<double> clip_threshold, decay_rate, beta1;
  // prodigy (prodigyopt)
  std::optional<double> d0, d_coef, growth_rate, beta3;
  std::optional<bool> use_bias_correction, safeguard_warmup, decouple;

  template <class V>
  void fields(V& v) {
    v("weight_decay", weight_decay);
    v("betas", betas);
    v("eps", eps);
    v("relative_step", relative_step);
    v("scale_parameter", scale_parameter);
    v("warmup_init", warmup_init);
    v("clip_threshold", clip_threshold);
    v("decay_rate", decay_rate);
    v("beta1", beta1);
    v("d0", d0);
    v("d_coef", d_coef);
    v("growth_rate", growth_rate);
    v("beta3", beta3);
    v("use_bias_correction", use_bias_correction);
    v("safeguard_warmup", safeguard_warmup);
    v("decouple", decouple);
  }
};

struct TrainConfig {
  int batch_size = 1;
  int steps = 1000;
  double lr = 1e-6;
  OptimizerKind optimizer = OptimizerKind::adamw;
  OptimizerParams optimizer_params;
  LrScheduler lr_scheduler = LrScheduler::constant;
  LrSchedulerParams lr_scheduler_params;
  DType dtype = DType::fp32;  // bf16: bf16 weights and inputs, no autocast (LoRA: float32 adapters); fp16 refused
  std::string noise_scheduler = "ddpm";
  TimestepType timestep_type = TimestepType::sigmoid;
  // Which of the scheduler's num_train_timesteps a batch draws (BaseSDTrainProcess, prepare_timesteps_indices):
  // indices in [min_denoising_steps, max_denoising_steps], index 0 the noisiest.
  ContentOrStyle content_or_style = ContentOrStyle::balanced;
  int min_denoising_steps = 0;
  int max_denoising_steps = 999;
  int num_train_timesteps = 1000;
  int next_sample_timesteps = 8;  // timestep_type next_sample: the grid it steps along
  // The loss weighted per timestep by AI Toolkit's bell (linear_timesteps) or half bell (linear_timesteps2),
  // on the linear grid.
  bool linear_timesteps = false;
  bool linear_timesteps2 = false;
  // The guidance a guidance-distilled model (FLUX.1-dev, Flex) is trained at (SDTrainer passes
  // guidance_embedding_scale = cfg_scale), and Flex's switch that leaves the guidance embedder out of the
  // training forward (toolkit/models/flux.py's bypass of time_text_embed); previews still guide.
  double cfg_scale = 1.0;
  bool bypass_guidance_embedding = false;
  // The loss weight of an is_reg dataset's images (SDTrainer's loss_multiplier, SDTrainer.py:1455-1459).
  double reg_weight = 1.0;
  // toolkit/train_tools.py apply_noise_offset: noise + noise_offset * N(0, 1) per sample and channel.
  double noise_offset = 0.0;
  LossType loss_type = LossType::mse;
  bool gradient_checkpointing = true;
  int gradient_accumulation = 1;
  int gradient_accumulation_steps = 1;  // legacy; mutually exclusive with gradient_accumulation
  // A model of several experts: micro-batches on one expert's timesteps before the next expert's
  // (config_modules.py:605-606, default 1; SDTrainer.py:2250-2264 counts micro-batches).
  int switch_boundary_every = 1;
  double max_grad_norm = 1.0;
  bool skip_first_sample = false;
  bool force_first_sample = false;
  bool disable_sampling = false;
  bool cache_text_embeddings = false;
  bool unload_text_encoder = false;
  // AI Toolkit's: LoRA on the text encoders too. Refused: see the loader's check.
  bool train_text_encoder = false;
  EmaConfig ema_config;
  // gclab: off | full | every:N | first:K | blocks:[i,j] | selective:attn|mlp|ops | offload | budget:BYTES |
  // auto[:MARGIN] | modes:[MODE,...] (ckpt/policy.h).
  // Absent from the file means "follow gradient_checkpointing" (true -> full, false -> off); always set
  // after loading.
  std::optional<ckpt::CheckpointPolicy> checkpoint_policy;
  // gclab: on out of memory in a step, `skip` the batch as AI Toolkit does (the step counts with no update;
  // the 4th in a row stops the run: state saved, report written, exit 3) or `abort` at the first (the
  // same stop; configs/oom/ reproduce a scenario with it).
  OomPolicy oom_policy = OomPolicy::skip;
  // gclab: a step whose every micro-batch had a non-finite loss is skipped as AI Toolkit skips it (no
  // gradient, no update: SDTrainer.py:2221-2224); this many such steps in a row stop the run (exit 1) with
  // the saves it made before kept. AI Toolkit has no limit; 0 means none here too.
  int max_nonfinite_steps = 10;
  // gclab: with checkpoint_policy budget:BYTES, also measure the blocks' activations on a probe forward at
  // the largest batch and resolution (nothing checkpointed) and log them beside the walk's. The policy
  // comes from the walk either way; the probe runs under the out-of-memory handler.
  bool budget_probe = false;

  // The resolved policy (the loader always sets it).
  const ckpt::CheckpointPolicy& policy() const { return *checkpoint_policy; }
  // Micro-batches a step trains on: gradient_accumulation's N, summed into one update (SDTrainer).
  int accumulation() const { return std::max(1, gradient_accumulation); }
  // The legacy gradient_accumulation_steps: one micro-batch a step, the optimizer stepped on every Nth step
  // (BaseSDTrainProcess.run's is_grad_accumulation_step: at steps N-1, 2N-1, ...; -1 on the step that
  // starts a new epoch). SDTrainer.hook_train_loop zeroes the gradients at the start of every step, so that
  // update uses its own step's gradient only, and steps the learning-rate schedule every step.
  bool optimizer_steps_at(int64_t step, bool epoch_start) const {
    if (gradient_accumulation_steps == -1) return epoch_start;
    return gradient_accumulation_steps <= 1 || (step + 1) % gradient_accumulation_steps == 0;
  }

  template <class V>
  void fields(V& v) {
    v("batch_size", batch_size);
    v("steps", steps);
    v("lr", lr);
    v("optimizer", optimizer);
    v("optimizer_params", optimizer_params);
    v("lr_scheduler", lr_scheduler);
    v("lr_scheduler_params", lr_scheduler_params);
    v("dtype", dtype);
    v("noise_scheduler", noise_scheduler);
    v("timestep_type", timestep_type);
    v("content_or_style", content_or_style);
    v("min_denoising_steps", min_denoising_steps);
    v("max_denoising_steps", max_denoising_steps);
    v("num_train_timesteps", num_train_timesteps);
    v("next_sample_timesteps", next_sample_timesteps);
    v("linear_timesteps", linear_timesteps);
    v("linear_timesteps2", linear_timesteps2);
    v("cfg_scale", cfg_scale);
    v("reg_weight", reg_weight);
    v("bypass_guidance_embedding", bypass_guidance_embedding);
    v("noise_offset", noise_offset);
    v("loss_type", loss_type);
    v("gradient_checkpointing", gradient_checkpointing);
    v("gradient_accumulation", gradient_accumulation);
    v("gradient_accumulation_steps", gradient_accumulation_steps);
    v("max_grad_norm", max_grad_norm);
    v("skip_first_sample", skip_first_sample);
    v("force_first_sample", force_first_sample);
    v("disable_sampling", disable_sampling);
    v("cache_text_embeddings", cache_text_embeddings);
    v("unload_text_encoder", unload_text_encoder);
    v("train_text_encoder", train_text_encoder);
    v("ema_config", ema_config);
    v("checkpoint_policy", checkpoint_policy);
    v("oom_policy", oom_policy);
    v("max_nonfinite_steps", max_nonfinite_steps);
    v("budget_probe", budget_probe);
    v("switch_boundary_every", switch_boundary_every);
    v.ignore({"train_unet",
              "unet_lr",
              "text_encoder_lr",
              "refiner_lr",
              "embedding_lr",
              "adapter_lr",
              "xformers",
              "sdp",
              "train_refiner",
              "train_turbo",
              "min_snr_gamma",
              "snr_gamma",
              "weight_jitter",
              "merge_network_on_save",
              "start_step",
              "free_u",
              "noise_multiplier",
              "img_multiplier",
              "loss_target",
              "do_cfg",
              "short_and_long_captions",
              "single_item_batching",
              "inverted_mask_prior",
              "diff_output_preservation",
              "diff_output_preservation_multiplier",
              "diff_output_preservation_class",
              "standardize_images",
              "standardize_latents",
              "prompt_dropout_prob",
              "match_noise_norm",
              "do_paramiter_swapping",
              "paramiter_swapping_factor",
              "target_noise_multiplier",
              "random_noise_multiplier",
              "random_noise_shift",
              "optimal_noise_pairing_samples",
              "force_consistent_noise",
              "blended_blur_noise",
              "do_guidance_loss",
              "negative_prompt"});
  }
};

// model.quantize_kwargs: what AI Toolkit's StableDiffusion loader (FLUX.1 / Flex.1, SD3) and Flex.2 hand
// its quantize() (stable_diffusion_model.py:799, flex2.py:126): fnmatch patterns on module names ("*"
// any text, dots included); a Linear named by an exclude pattern, or by no include pattern when include
// is given, keeps its dtype (toolkit/util/quantize.py:165-175).
struct QuantizeKwargs {
  std::vector<std::string> include{};
  std::vector<std::string> exclude{};

  template <class V>
  void fields(V& v) {
    v("include", include);
    v("exclude", exclude);
  }
};

// model.model_kwargs: what AI Toolkit's model class reads from it — Flex.2's control and inpainting
// training switches (extensions_built_in/flex2/flex2.py:75-81), each a chance per step (0 to 1) or on/off.
struct ModelKwargs {
  double invert_inpaint_mask_chance = 0.0;
  double inpaint_dropout = 0.0;
  double control_dropout = 0.0;
  double inpaint_random_chance = 0.0;
  bool random_blur_mask = false;
  bool random_dialate_mask = false;
  bool do_random_inpainting = false;
  // Wan 2.2 A14B (wan22_14b_model.py:196-208): which of its two experts train — the high-noise
  // (transformer_1) and the low-noise (transformer_2); at least one.
  bool train_high_noise = true;
  bool train_low_noise = true;
  // FLUX.2 (flux2_model.py:365-406): each control image resized to the training image's area before it is
  // prepared as a reference.
  bool match_target_res = false;

  template <class V>
  void fields(V& v) {
    v("train_high_noise", train_high_noise);
    v("train_low_noise", train_low_noise);
    v("invert_inpaint_mask_chance", invert_inpaint_mask_chance);
    v("inpaint_dropout", inpaint_dropout);
    v("control_dropout", control_dropout);
    v("inpaint_random_chance", inpaint_random_chance);
    v("random_blur_mask", random_blur_mask);
    v("random_dialate_mask", random_dialate_mask);
    v("do_random_inpainting", do_random_inpainting);
    v("match_target_res", match_target_res);
  }
};

struct ModelConfig {
  std::optional<std::string> name_or_path;
  std::string arch;  // resolved: see arch.h (AI Toolkit's arch / is_* switches)
  // What followed a ':' in model.arch (AI Toolkit's UI writes "zimage:turbo", "qwen_image_edit_plus:2511";
  // AI Toolkit cuts it off and lets name_or_path decide; gclab lets either choose the variant).
  std::string arch_tag;
  bool is_flux = false;
  bool is_v3 = false;
  bool is_lumina2 = false;
  bool quantize = false;
  std::optional<bool> quantize_te;  // defaults to `quantize`
  QType qtype = QType::qfloat8;
  QType qtype_te = QType::qfloat8;
  // AI Toolkit's: a LoRA file applied, frozen, beside the quantized Linears it names (the Linears it does
  // not name stay unquantized). A `qtype: "uint3|FILE"` sets it, as in AI Toolkit (the loader splits the
  // text before the qtype is read as a QType).
  std::optional<std::string> accuracy_recovery_adapter;
  // AI Toolkit's assistant (training) adapter: a LoRA file merged into the base for training and taken
  // back out while sampling (the FLUX.1 schnell example; the UI's zimage:turbo default). A local file.
  std::optional<std::string> assistant_lora_path;
  QuantizeKwargs quantize_kwargs;
  ModelKwargs model_kwargs;
  bool low_vram = false;
  // AI Toolkit's layer offloading (toolkit/memory_management): that share of the transformer's (and of the
  // text encoders') Linears keep their frozen weights in host memory and are brought to the device for
  // each call.
  bool layer_offloading = false;
  double layer_offloading_transformer_percent = 1.0;
  double layer_offloading_text_encoder_percent = 1.0;
  // AI Toolkit's: bitsandbytes loading of the text encoder ("Only works with pixart currently", its
  // ModelConfig says): read and checked, without effect for the families gclab models, as in AI Toolkit.
  int text_encoder_bits = 16;
  // gclab: autoencoder (the family's, from vae_path or name_or_path's vae/ folder, else random at the real
  // shapes) or dct (the stand-in).
  VaeChoice vae = VaeChoice::autoencoder;
  // AI Toolkit's: the autoencoder's weights from elsewhere than name_or_path's vae/ — here a local diffusers
  // folder (config.json and weights) or a .safetensors file (the family's shape); a Hub id is not fetched.
  std::optional<std::string> vae_path;
  // AI Toolkit's, for a full fine-tune: the parameters trained are those whose name ("transformer.<path>")
  // contains none of ignore_if_contains and, when only_if_contains is given, one of its words
  // (stable_diffusion_model.py:2704-2713, models/base_model.py:1310-1318); the rest stay frozen.
  std::vector<std::string> only_if_contains;
  std::vector<std::string> ignore_if_contains;

  template <class V>
  void fields(V& v) {
    v("name_or_path", name_or_path);
    v("arch", arch);
    v("is_flux", is_flux);
    v("is_v3", is_v3);
    v("is_lumina2", is_lumina2);
    v("quantize", quantize);
    v("quantize_te", quantize_te);
    v("qtype", qtype);
    v("qtype_te", qtype_te);
    v("accuracy_recovery_adapter", accuracy_recovery_adapter);
    v("low_vram", low_vram);
    v("layer_offloading", layer_offloading);
    v("layer_offloading_transformer_percent", layer_offloading_transformer_percent);
    v("layer_offloading_text_encoder_percent", layer_offloading_text_encoder_percent);
    v("text_encoder_bits", text_encoder_bits);
    v("vae", vae);
    v("vae_path", vae_path);
    v("only_if_contains", only_if_contains);
    v("ignore_if_contains", ignore_if_contains);
    v("quantize_kwargs", quantize_kwargs);
    v("model_kwargs", model_kwargs);
    v("assistant_lora_path", assistant_lora_path);
    v.ignore({"dtype",
              "is_v2",
              "is_xl",
              "is_pixart",
              "is_pixart_sigma",
              "is_auraflow",
              "is_ssd",
              "is_vega",
              "is_v_pred",
              "use_flux_cfg",
              "refiner_name_or_path",
              "lora_path",
              "inference_lora_path",
              "te_name_or_path",
              "extras_name_or_path",
              "compile",
              "attn_masking",
              "split_model_over_gpus",
              "vae_device",
              "vae_dtype",
              "te_device",
              "te_dtype",
              "latent_space_version"});
  }
};

struct SampleItem {
  std::string prompt;
  std::optional<int> width;  // each unset value takes the sample block's
  std::optional<int> height;
  std::optional<std::string> neg;
  std::optional<std::int64_t> seed;         // the item's `seed`: carried to the items after it, as AI Toolkit
  std::optional<std::int64_t> prompt_seed;  // the prompt's --seed / --d flag: this image only (not a YAML key)
  std::optional<double> guidance_scale;
  std::optional<int> sample_steps;
  std::optional<std::string> ctrl_img;
  std::optional<std::string> ctrl_img_1;
  std::optional<std::string> ctrl_img_2;
  std::optional<std::string> ctrl_img_3;
  std::optional<double> network_multiplier;
  // Which of Flex.2's preview inputs ctrl_img replaces: 0 the inpainting latents and mask (AI Toolkit's
  // default), 1 the control latents (config_modules.py:61; flex2.py:251).
  std::optional<int> ctrl_idx;
  std::optional<int> num_frames;  // a video preview's frames and rate (unset: the sample block's)
  std::optional<int> fps;

  // The control images an edit model's preview reads, in AI Toolkit's order (qwen_image_edit_plus.py
  // generate_single_image): ctrl_img, else ctrl_img_1; then ctrl_img_2 and ctrl_img_3.
  std::vector<std::string> control_images() const {
    std::vector<std::string> out;
    for (const auto* f : {ctrl_img ? &ctrl_img : &ctrl_img_1, &ctrl_img_2, &ctrl_img_3})
      if (*f) out.push_back(**f);
    return out;
  }

  template <class V>
  void fields(V& v) {
    v("prompt", prompt);
    v("width", width);
    v("height", height);
    v("neg", neg);
    v("seed", seed);
    v("guidance_scale", guidance_scale);
    v("sample_steps", sample_steps);
    v("ctrl_img", ctrl_img);
    v("ctrl_img_1", ctrl_img_1);
    v("ctrl_img_2", ctrl_img_2);
    v("ctrl_img_3", ctrl_img_3);
    v("network_multiplier", network_multiplier);
    v("ctrl_idx", ctrl_idx);
    v("num_frames", num_frames);
    v("fps", fps);
  }
};

struct SampleConfig {
  std::string sampler = "ddpm";
  int sample_every = 100;
  int sample_start_step = 0;
  int width = 512;
  int height = 512;
  std::vector<std::string> prompts;  // legacy spelling; resolved into `samples`
  std::vector<SampleItem> samples;
  std::string neg;
  std::int64_t seed = 0;
  bool walk_seed = false;
  double guidance_scale = 7.0;
  int sample_steps = 20;
  double network_multiplier = 1.0;
  std::string format = "jpg";  // the previews' files: jpg (AI Toolkit's default, config_modules.py:93), png, webp
  // gclab: decode previews in overlapping tiles of vae_tile_size pixels, blended (diffusers' enable_tiling
  // and tiled_decode). diffusers' own default tile is the VAE's sample_size (1024 for FLUX.1's), which would
  // not tile a 1024² preview at all; gclab's default is 512.
  bool vae_tiling = false;
  int vae_tile_size = 512;
  // AI Toolkit's: the Plus edit models' true CFG rescaled to the conditional prediction's norm (off by
  // default, config_modules.py:77; the other Qwen-Image pipelines always rescale).
  bool do_cfg_norm = false;
  // Video previews: num_frames frames at fps (config_modules.py:98-99: 1 and 16), written as an animated
  // WebP beside the first frame.
  int num_frames = 1;
  int fps = 16;

  // Each sample's seed, as BaseSDTrainProcess.sample picks them: the current seed starts at `seed`, walks to
  // seed + i with walk_seed, and becomes an item's own `seed` for it and the items after; a prompt's --seed
  // flag is that image's alone.
  std::vector<std::int64_t> seeds() const {
    std::vector<std::int64_t> out;
    std::int64_t current = seed;
    for (size_t i = 0; i < samples.size(); ++i) {
      if (walk_seed) current = seed + static_cast<std::int64_t>(i);
      if (samples[i].seed) current = *samples[i].seed;
      out.push_back(samples[i].prompt_seed.value_or(current));
    }
    return out;
  }

  template <class V>
  void fields(V& v) {
    v("sampler", sampler);
    v("sample_every", sample_every);
    v("sample_start_step", sample_start_step);
    v("width", width);
    v("height", height);
    v("prompts", prompts);
    v("samples", samples);
    v("neg", neg);
    v("seed", seed);
    v("walk_seed", walk_seed);
    v("guidance_scale", guidance_scale);
    v("sample_steps", sample_steps);
    v("network_multiplier", network_multiplier);
    v("format", format);
    v("vae_tiling", vae_tiling);
    v("vae_tile_size", vae_tile_size);
    v("do_cfg_norm", do_cfg_norm);
    v("num_frames", num_frames);
    v("fps", fps);
    v.ignore({"guidance_rescale", "adapter_conditioning_scale", "refiner_start_at", "extra_values"});
  }
};

// Where each field's value came from, so later stages (model, data, train) can also point at a line.
struct SourceMap {
  std::map<std::string, std::string> origin_by_path;  // "train.batch_size" -> "line 42"
  std::string where(const std::string& path) const;
};

// A byte count written the way people write it ("24GiB", "512MiB", 25769803776); 0 means none.
struct ByteSize {
  std::int64_t bytes = 0;
};

// One AI Toolkit process (`config.process[0]`), the unit gclab runs.
struct ProcessConfig {
  std::string name;
  std::string training_folder = "output";
  std::string device = "auto";  // AI Toolkit users write cuda:0; auto = CUDA when present, else CPU
  std::optional<std::string> trigger_word;
  std::optional<std::int64_t> training_seed;
  // The seed a run draws from: training_seed, or gclab's fixed 42 where the config has none (AI Toolkit
  // then leaves torch's and Python's generators unseeded, BaseTrainProcess.py:33-39; gclab's runs repeat).
  std::uint64_t seed() const { return static_cast<std::uint64_t>(training_seed.value_or(42)); }
  ByteSize vram_cap;                     // gclab: emulated VRAM cap; may also stand at the file's top level
  ByteSize host_cap;                     // gclab: emulated host-memory cap (what layer offloading keeps there)
  std::optional<NetworkConfig> network;  // absent: the whole transformer is trained
  SaveConfig save;
  std::vector<DatasetConfig> datasets;
  TrainConfig train;
  ModelConfig model;
  std::optional<SampleConfig> sample;  // absent: no previews, as in AI Toolkit

  SourceMap source;       // not part of the YAML
  std::string meta_yaml;  // the file's `meta` block after substitution, echoed back
  // model.arch came from a legacy switch (is_flux, is_v3, is_lumina2), which names only the family
  // (not part of the YAML).
  bool arch_from_legacy_switch = false;

  template <class V>
  void fields(V& v) {
    v("name", name);
    v("training_folder", training_folder);
    v("device", device);
    v("trigger_word", trigger_word);
    v("training_seed", training_seed);
    v("vram_cap", vram_cap);
    v("host_cap", host_cap);
    v("network", network);
    v("save", save);
    v("datasets", datasets);
    v("train", train);
    v("model", model);
    v("sample", sample);
    v.ignore({"type", "performance_log_every", "logging", "sqlite_db_path"});
  }
};

}  // namespace gclab::config
