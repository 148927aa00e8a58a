#include "gclab/train/plan.h"

#include <algorithm>
#include <set>

#include "gclab/config/user_error.h"
#include "gclab/data/buckets.h"
#include "gclab/data/dataset.h"
#include "gclab/data/image.h"
#include "gclab/memory/device.h"
#include "gclab/model/family.h"
#include "gclab/model/quantize.h"
#include "gclab/vae/autoencoder_kl.h"
#include "gclab/vae/qwen_image_vae.h"

namespace gclab::train {

namespace fs = std::filesystem;

std::vector<StepCell> step_cells(const config::ProcessConfig& config) {
  // A resolution is the buckets' target area: a square image takes the bucket of the arch's divisibility
  // closest to it within it (632 -> 624 x 640 at 16), which is what its steps hold.
  const model::ArchFacts* arch = model::find_arch(config.model.arch);
  const model::ModelSpec spec = arch ? model::spec_by_preset(arch->preset) : model::ModelSpec{};
  const int div = arch ? spec.divisibility : 1;
  std::set<StepCell> cells;
  for (size_t i = 0; i < config.datasets.size(); ++i) {
    const config::DatasetConfig& d = config.datasets[i];
    // auto_frame_count: the longest clip's frames, the step that holds the most (num_frames where the
    // folder cannot be read here: plan_run warns).
    const int frames =
        data::most_frames(d, static_cast<int>(i), static_cast<int>(spec.latent_temporal)).value_or(d.num_frames);
    for (int r : d.resolution) {
      const data::BucketResolution b = data::bucket_for(r, r, r, div);
      cells.insert({d.batch_size.value_or(config.train.batch_size), r, frames, b.width, b.height});
    }
  }
  return {cells.begin(), cells.end()};
}

StepCell largest_cell(const config::ProcessConfig& c) { return largest_cell(step_cells(c), c.train.batch_size); }

StepCell largest_cell(const std::vector<StepCell>& cells, int batch) {
  // A cell a step trains on — not the largest batch, frames and resolution of different datasets put together
  // (images at 1024² beside clips of 81 frames at 480² are no 81-frame 1024² step): the one whose step holds
  // the most pixels, then the most a sample.
  if (cells.empty()) return {batch, 512, 1};
  auto pixels = [](const StepCell& x) {
    const int64_t sample = int64_t{x.frames} * x.bucket_width() * x.bucket_height();
    return std::pair{sample * x.batch, sample};
  };
  return *std::max_element(cells.begin(), cells.end(),
                           [&](const StepCell& a, const StepCell& b) { return pixels(a) < pixels(b); });
}

bool run_caches_latents(const config::ProcessConfig& config) {
  for (const auto& d : config.datasets)
    if (d.cache_latents || d.cache_latents_to_disk) return true;
  return false;
}

bool run_caches_text(const config::ProcessConfig& config) {
  if (config.train.cache_text_embeddings) return true;
  for (const auto& d : config.datasets)
    if (d.cache_text_embeddings) return true;
  return false;
}

torch::ScalarType save_dtype(const config::ProcessConfig& config) {
  switch (config.save.dtype) {
    case config::DType::fp32:
      return torch::kFloat;
    case config::DType::bf16:
      return torch::kBFloat16;
    default:
      return torch::kHalf;
  }
}

torch::ScalarType base_dtype(const config::ProcessConfig& config) {
  return config.train.dtype == config::DType::bf16 ? torch::kBFloat16 : torch::kFloat;
}

text::PromptEncoderOptions prompt_plan(const config::ProcessConfig& config, const model::ModelSpec& spec,
                                       const torch::TensorOptions& options) {
  text::PromptEncoderOptions o;
  o.pipeline = model::family_of(spec.family).text_pipeline(spec);
  o.target = model::text_target(spec);
  o.tiny = spec.tiny;
  if (const auto local = model::local_model(config.model)) {
    o.encoders = local->text_encoders;
    o.tokenizers = local->tokenizers;
  }
  o.options = options;
  o.linear_storage = model::text_encoder_storage(config.model, spec);
  return o;
}

bool text_encoder_leaves(const config::ProcessConfig& config) {
  return config.train.unload_text_encoder || run_caches_text(config);
}

fs::path autoencoder_weights(const config::ProcessConfig& config, const fs::path& weights) {
  if (!weights.empty()) return weights;
  std::error_code ec;
  const auto local = model::local_model(config.model);
  if (local && local->vae_over_vae_path) return local->vae;
  if (config.model.vae_path && fs::exists(*config.model.vae_path, ec)) return *config.model.vae_path;
  if (local) return local->vae;
  return {};
}

namespace {

// An image family's samples are one frame: a dataset's num_frames, the sample block's or a prompt's above 1
// is refused here, where every verb plans its autoencoder (train, check, estimate), not met mid-run.
void check_frames(const config::ProcessConfig& config, const model::ModelSpec& spec) {
  if (model::takes_frames(spec)) return;
  for (size_t d = 0; d < config.datasets.size(); ++d) {
    if (config.datasets[d].num_frames > 1)
      throw UserError("datasets[" + std::to_string(d) + "].num_frames is " +
                      std::to_string(config.datasets[d].num_frames) + ", but " + spec.preset +
                      " is an image model (one frame a sample): set num_frames: 1, or train a video arch");
    if (config.datasets[d].auto_frame_count)
      throw UserError("datasets[" + std::to_string(d) + "].auto_frame_count is set, but " + spec.preset +
                      " is an image model (one frame a sample): remove it, or train a video arch");
  }
  if (config.sample && config.sample->num_frames > 1)
    throw UserError("sample.num_frames is " + std::to_string(config.sample->num_frames) + ", but " + spec.preset +
                    " is an image model: set num_frames: 1");
  for (size_t i = 0; config.sample && i < config.sample->samples.size(); ++i)
    if (config.sample->samples[i].num_frames.value_or(1) > 1)
      throw UserError("sample.samples[" + std::to_string(i) + "] asks for " +
                      std::to_string(*config.sample->samples[i].num_frames) + " frames (--num_frames), but " +
                      spec.preset + " is an image model: drop the flag");
}

}  // namespace

vae::CodecSpec codec_plan(const config::ProcessConfig& config, const model::ModelSpec& spec, const fs::path& weights) {
  vae::CodecSpec s;
  s.latent_channels = spec.latent_channels;
  s.downsampling = spec.latent_spatial;
  s.video = model::takes_frames(spec);
  check_frames(config, spec);
  if (config.model.vae == config::VaeChoice::dct) {
    if (s.video)
      throw UserError("model.vae: dct is an image stand-in; " + spec.preset +
                      "'s latents carry frames: leave model.vae unset for its autoencoder");
    return s;
  }
  s.weights = autoencoder_weights(config, weights);
  const vae::AutoencoderConfig preset = model::family_of(spec.family).autoencoder(spec);
  try {
    s.autoencoder = vae::autoencoder_config(preset, s.weights);
  } catch (const std::runtime_error& e) {
    throw UserError(std::string("the autoencoder: ") + e.what());
  }
  s.dtype_bytes = config.train.dtype == config::DType::fp32 ? 4 : 2;
  if (config.sample && config.sample->vae_tiling)
    s.tile_sample_size = config.sample->vae_tile_size;
  else if (config.model.low_vram && model::low_vram_tiles_previews(spec))
    s.tile_sample_size = vae::kQwenImageDefaultTile;  // AI Toolkit's enable_tiling(), at its default
  return s;
}

torch::Device resolve_device(const std::string& name) {
  if (name == "auto") return torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;
  torch::Device device(torch::kCPU);
  try {
    device = torch::Device(name);
  } catch (const c10::Error&) {
    throw UserError("device '" + name + "' is not a device name (auto, cpu, cuda, cuda:0, ...)");
  }
  if (device.is_cuda() && !torch::cuda::is_available())
    throw UserError(
        "device '" + name +
        "' asks for CUDA, which this machine does not have; use device: cpu (or auto), or --set device=cpu");
  if (device.is_cuda() && device.has_index() && device.index() >= static_cast<int>(torch::cuda::device_count()))
    throw UserError("device '" + name + "': this machine has " + std::to_string(torch::cuda::device_count()) +
                    " CUDA device(s)");
  return device;
}

bool runs_on_cuda(const config::ProcessConfig& config) {
  return config.device.rfind("cuda", 0) == 0 || (config.device == "auto" && torch::cuda::is_available());
}

namespace {

// An edit model's control images, as its model class takes them: as many as it reads (FLUX.1 Kontext one:
// its batch's control_tensor is encoded as one image) and, for a preview where the class requires it, one.
void check_controls(const RunPlan& plan, const std::string& where, size_t count, bool preview) {
  const model::ModelFamily& family = *plan.family;
  const int most = family.max_control_images(plan.spec);
  if (most > 0 && count > static_cast<size_t>(most))
    throw UserError(where + " has " + std::to_string(count) + " control images; " + plan.config.model.arch + " takes " +
                    std::to_string(most) + " (AI Toolkit's model class fails on more). Keep one.");
  if (preview && count == 0 && family.preview_needs_control(plan.spec))
    throw UserError(where + " has no ctrl_img that is a file; " + plan.config.model.arch +
                    " previews an edit of it, and AI Toolkit stops at the first preview without one (\"Control "
                    "image is required\"). Give each sample a ctrl_img, or set train.disable_sampling: true.");
}

// The previews and, per prompt, its control images that are files; a control that is not a file is left
// out, with a warning.
void plan_previews(RunPlan& plan) {
  if (plan.spec.reference_tokens)
    for (size_t i = 0; i < plan.config.datasets.size(); ++i)
      check_controls(plan, "datasets[" + std::to_string(i) + "].control_path",
                     plan.config.datasets[i].control_path.size(), /*preview=*/false);
  const config::ProcessConfig& c = plan.config;
  if (c.sample && !c.train.disable_sampling) plan.previews = c.sample->samples;
  for (const auto& p : plan.previews) {
    std::vector<fs::path> files;
    if (plan.spec.reference_tokens) {
      for (const std::string& f : p.control_images()) {
        std::error_code ec;
        if (fs::is_regular_file(f, ec))
          files.emplace_back(f);
        else
          plan.warnings.push_back("sample: ctrl_img " + f + " is not a file; the prompt '" + p.prompt +
                                  "' is previewed without it");
      }
      check_controls(plan, "sample: the prompt '" + p.prompt + "'", files.size(), /*preview=*/true);
    } else if (p.ctrl_img && plan.family->controls_as_channels(plan.spec)) {
      // Flex.2's generate_single_image reads ctrl_img (flex2.py:231-251), not ctrl_img_1..3.
      std::error_code ec;
      if (fs::is_regular_file(*p.ctrl_img, ec)) {
        plan.family->check_preview_control(plan.spec, *p.ctrl_img, p.ctrl_idx.value_or(0));
        files.emplace_back(*p.ctrl_img);
      } else {
        plan.warnings.push_back("sample: ctrl_img " + *p.ctrl_img + " is not a file; the prompt '" + p.prompt +
                                "' is previewed without it");
      }
    } else if (plan.family->preview_first_frame(plan.spec) != model::PreviewFirstFrame::none) {
      // Wan21I2V.generate_single_image: `if gen_config.ctrl_img is None: raise ValueError("I2V samples must
      // have a control image")` (wan21_i2v.py:415-416) — the run fails at its first preview; gclab refuses it
      // before loading. Wan225bModel's takes one when given (wan22_5b_model.py:175).
      std::error_code ec;
      const bool required = plan.family->preview_first_frame(plan.spec) == model::PreviewFirstFrame::required;
      if (p.ctrl_img && fs::is_regular_file(*p.ctrl_img, ec))
        files.emplace_back(*p.ctrl_img);
      else if (p.ctrl_img)
        throw UserError("sample: the prompt '" + p.prompt + "' names ctrl_img " + *p.ctrl_img +
                        ", which is not a file; AI Toolkit's preview fails opening it. Give an image file.");
      else if (required)
        throw UserError("sample: the prompt '" + p.prompt + "' has no ctrl_img; " + c.model.arch +
                        " previews a video from its first frame, and AI Toolkit stops at the first preview without "
                        "one (\"I2V samples must have a control image\"). Give each sample a ctrl_img (an image "
                        "file), or set train.disable_sampling: true.");
    } else if (!p.control_images().empty()) {  // Qwen-Image's own generate_single_image raises on one
      plan.warnings.push_back("sample: the prompt '" + p.prompt + "' names a ctrl_img; " + c.model.arch +
                              "'s previews in gclab do not read one, and it is left out");
    }
    plan.preview_controls.push_back(std::move(files));
  }
}

// The autoencoder, checked against the transformer: its channels, and its spatial and (a video family's)
// temporal factors.
void plan_codec(RunPlan& plan) {
  const config::ProcessConfig& c = plan.config;
  plan.codec = codec_plan(c, plan.spec);
  if (c.model.vae_path && plan.codec.autoencoder && plan.codec.weights != fs::path(*c.model.vae_path))
    plan.warnings.push_back("model.vae_path '" + *c.model.vae_path +
                            "' is not a local folder or file (gclab downloads nothing): " + plan.codec.describe());
  if (plan.codec.autoencoder && vae::latent_channels(*plan.codec.autoencoder) != plan.spec.latent_channels)
    throw UserError("the autoencoder in " + plan.codec.weights.string() + " has " +
                    std::to_string(vae::latent_channels(*plan.codec.autoencoder)) +
                    " latent channels; the transformer takes " + std::to_string(plan.spec.latent_channels));
  if (plan.codec.autoencoder && vae::downsampling(*plan.codec.autoencoder) != plan.spec.latent_spatial)
    throw UserError("the autoencoder in " + plan.codec.weights.string() + " down-samples " +
                    std::to_string(vae::downsampling(*plan.codec.autoencoder)) + "x; the transformer's latents are " +
                    std::to_string(plan.spec.latent_spatial) + "x");
  if (plan.codec.autoencoder && model::takes_frames(plan.spec) &&
      vae::temporal_downsampling(*plan.codec.autoencoder) != plan.spec.latent_temporal)
    throw UserError("the autoencoder in " + plan.codec.weights.string() + " turns " +
                    std::to_string(vae::temporal_downsampling(*plan.codec.autoencoder)) +
                    " frames into a latent frame; the transformer's latents take " +
                    std::to_string(plan.spec.latent_temporal));
}

// An image-to-video model's first frames: read from the pixels in every step (Wan21I2V.get_noise_prediction
// takes batch.tensor, wan21_i2v.py:489-498), which a batch of cached latents does not carry (DataLoaderBatchDTO
// stacks file_item.tensor only when latents are not cached, toolkit/data_transfer_object/data_loader.py:275-
// 284): AI Toolkit fails at the first step there, gclab refuses up front.
// A family that caches the first frame's latents beside the clip's (Wan 2.2 TI2V 5B with do_i2v: toolkit/
// dataloader_mixins.py:2049-2064) takes them from the latent cache instead (RunPlan::first_frame_latents).
void plan_first_frame(RunPlan& plan) {
  const config::ProcessConfig& c = plan.config;
  const model::ModelFamily& family = *plan.family;
  bool steps = false;
  for (size_t i = 0; i < c.datasets.size(); ++i) {
    const config::DatasetConfig& d = c.datasets[i];
    if (!family.trains_on_first_frame(plan.spec, d)) continue;
    steps = true;
    if (!(d.cache_latents || d.cache_latents_to_disk)) continue;
    if (family.caches_first_frame_latents(plan.spec)) {
      plan.first_frame_latents.insert(static_cast<int>(i));
      continue;
    }
    throw UserError("datasets[" + std::to_string(i) + "]: " + c.model.arch +
                    " conditions every step on each clip's first frame, read from its pixels (AI Toolkit's "
                    "get_noise_prediction takes batch.tensor), and a batch of cached latents has none: AI "
                    "Toolkit fails at the first step unless load_image_when_caching_latents keeps them, which "
                    "gclab does not read. Set cache_latents_to_disk: false and cache_latents: false.");
  }
  if (!steps && family.preview_first_frame(plan.spec) == model::PreviewFirstFrame::none) return;
  plan.first_frame_in_steps = steps;
  model::FrameConditioningSource source;
  source.device = plan.device;
  source.dtype = plan.compute_dtype;  // CLIPVisionModel.from_pretrained(torch_dtype=self.torch_dtype)
  source.seed = plan.seed;
  if (plan.local)
    source.image_encoder = plan.local->image_encoder, source.image_processor = plan.local->image_processor;
  plan.first_frame = source;
}

}  // namespace

namespace {

// The largest image (by area) in the datasets' control folders, from its header; none when there is none.
std::optional<data::ImageSize> largest_control(const config::ProcessConfig& config) {
  std::optional<data::ImageSize> largest;
  for (const auto& d : config.datasets)
    for (const std::string& folder : d.control_path) {
      std::error_code ec;
      for (fs::directory_iterator it(folder, ec), end; !ec && it != end; it.increment(ec)) {
        if (!data::is_image_file(it->path())) continue;
        const std::optional<data::ImageSize> size = data::read_image_size(it->path());
        if (size && (!largest || int64_t{size->width} * size->height > int64_t{largest->width} * largest->height))
          largest = size;
      }
    }
  return largest;
}

// checkpoint_policy auto's cap: vram_cap, else the free memory of the GPU the run is on (or predicts for).
void plan_auto_cap(RunPlan& plan) {
  if (plan.config.vram_cap.bytes > 0) {
    plan.auto_cap_bytes = plan.config.vram_cap.bytes, plan.auto_cap_source = "vram_cap";
    return;
  }
  if (!plan.cuda || !torch::cuda::is_available()) return;
  // The run's GPU: the plan's device, or (a meta plan) the one the config names — a data-parallel rank's own,
  // cuda:LOCAL_RANK (only that one queried: no CUDA context on the other ranks' GPUs).
  const c10::Device named = plan.device.is_cuda() ? plan.device : resolve_device(plan.config.device);
  const int index = !plan.world.alone()                    ? plan.world.local_rank
                    : named.is_cuda() && named.has_index() ? named.index()
                                                           : 0;
  for (const auto& g : memory::describe_devices(index).gpus)
    if (g.index == index) plan.auto_cap_bytes = g.free_bytes, plan.auto_cap_source = "the GPU's free memory";
}

}  // namespace

RunPlan plan_run(const config::ProcessConfig& config, const PlanOptions& options) {
  RunPlan plan;
  plan.config = config;
  plan.arch = model::find_arch(config.model.arch);
  plan.spec = model::spec_for(config);
  plan.family = &model::family_of(plan.spec.family);
  // What the arch's model class changes as it loads (the config loader applied it too; a config changed in
  // code — an OOM report's lever — gets it here).
  plan.family->resolve_model_config(plan.config.model);
  plan.local = model::local_model(config.model);
  plan.world = dist::process_world();
  plan.device = options.meta ? torch::Device(torch::kMeta) : resolve_device(config.device);
  if (plan.device.is_cuda() && !plan.world.alone())  // one GPU per process, as torchrun's LOCAL_RANK says
    plan.device = torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(plan.world.local_rank));
  plan.cuda = options.meta ? runs_on_cuda(config) : plan.device.is_cuda();
  plan.base_dtype = base_dtype(config);
  plan.compute_dtype = config.train.dtype == config::DType::bf16 ? torch::kBFloat16 : torch::kFloat;
  plan.seed = config.seed();

  plan.load.loading = model::transformer_loading(config.model.arch);
  using TL = model::TransformerLoading;
  const bool parked = plan.load.loading == TL::parked_while_text_encoders_load;
  plan.load.after_text_encoders =
      plan.load.loading == TL::per_block || (parked && (config.model.low_vram || config.model.quantize));
  plan.load.quantized_on_host = model::quantizes_in_host_memory(config.model);
  plan.load.at_first_use =
      (plan.load.loading == TL::per_block || plan.load.loading == TL::experts_in_turn) && config.model.low_vram;
  plan.load.blocks_parked = parked && config.model.quantize && !config.model.low_vram;
  plan.load.staged = plan.load.quantized_on_host && !plan.device.is_cpu() && runs_on_cuda(config);
  // Experts that take turns on the device carry adapters only: a full fine-tune's trained weights would move
  // between host and device at every switch, its optimizer state beside them (AI Toolkit's wrapper moves the
  // whole expert; get_model_has_grad is False for it).
  if (plan.load.at_first_use && !plan.spec.expert_boundaries.empty() && !config.network)
    throw UserError("a full fine-tune of " + plan.spec.preset +
                    " under model.low_vram is not modelled: its experts take turns on the device. Train a LoRA "
                    "(network), or set model.low_vram: false");

  if (const auto& assistant = config.model.assistant_lora_path) {
    if (!plan.family->takes_assistant_adapter(config.model.arch))
      throw UserError(
          "model.assistant_lora_path: AI Toolkit loads an assistant adapter for FLUX.1 / Flex.1 and "
          "Z-Image only (toolkit/assistant_lora.py, z_image.py); " +
          config.model.arch + "'s model class would fail on it when it samples. Remove the key.");
    std::error_code ec;
    if (std::filesystem::is_regular_file(*assistant, ec))
      plan.assistant_adapter = *assistant;
    else
      plan.warnings.push_back("model.assistant_lora_path '" + *assistant +
                              "' is not a local file (gclab fetches nothing; AI Toolkit would download it): "
                              "training without it. Download the .safetensors and give its path.");
  }
  plan.prompts = prompt_plan(config, plan.spec, torch::TensorOptions().device(plan.device).dtype(plan.compute_dtype));
  plan_codec(plan);
  plan.caches_latents = run_caches_latents(config);
  plan_first_frame(plan);
  // The autoencoder encodes in the steps: the images when latents are not cached, control images (an edit
  // model's, Flex.2's control folders) every step.
  bool controls = plan.spec.reference_tokens;
  if (plan.family->controls_as_channels(plan.spec))
    for (const auto& d : config.datasets) controls = controls || !d.control_path.empty();
  plan.vae_in_steps = !plan.caches_latents || (controls && plan.codec.autoencoder);
  plan.caches_text = run_caches_text(config);
  plan.text_encoder_leaves = text_encoder_leaves(config);
  plan.policy = config.train.policy();
  plan_auto_cap(plan);  // what auto fits: the run's policy, or bench's, fit's and advise's alternatives
  if (plan.spec.raw_references && plan.spec.reference_tokens) plan.largest_raw_control = largest_control(config);
  plan.cells = step_cells(config);
  plan.largest = largest_cell(plan.cells, config.train.batch_size);
  for (size_t i = 0; i < config.datasets.size(); ++i) {
    std::string why;
    if (config.datasets[i].auto_frame_count &&
        !data::most_frames(config.datasets[i], static_cast<int>(i), static_cast<int>(plan.spec.latent_temporal), &why))
      plan.warnings.push_back("datasets[" + std::to_string(i) + "].auto_frame_count: its clips' lengths are unknown (" +
                              why + "): predicted at num_frames " + std::to_string(config.datasets[i].num_frames));
  }
  plan_previews(plan);
  for (size_t i = 0; i < config.datasets.size(); ++i)  // AI Toolkit loads them and only Flex.2 reads them
    if (config.datasets[i].inpaint_path && !plan.family->controls_as_channels(plan.spec))
      plan.warnings.push_back("datasets[" + std::to_string(i) + "].inpaint_path: " + config.model.arch +
                              " takes no inpainting input (only Flex.2 does); its images are not read");
  return plan;
}

data::BucketResolution preview_reference_size(const model::ModelSpec& spec, data::BucketResolution image, int width,
                                              int height) {
  const auto [w, h] = model::preview_reference_size(spec, image.width, image.height, width, height);
  return {static_cast<int>(w), static_cast<int>(h)};
}

torch::Tensor load_preview_reference(const model::ModelSpec& spec, const std::filesystem::path& file, int width,
                                     int height) {
  torch::Tensor rgb = data::decode_image_rgb(file);                                     // [H, W, 3]
  if (spec.raw_references) return data::raw_reference_image(rgb, spec.reference_area);  // encode_image_refs' limit
  if (model::trains_references_at_image_size(spec)) rgb = data::resize_rgb(rgb, width, height);
  const data::BucketResolution ref =
      preview_reference_size(spec, {static_cast<int>(rgb.size(1)), static_cast<int>(rgb.size(0))}, width, height);
  return data::to_unit_range(data::resize_rgb(rgb, ref.width, ref.height));
}

}  // namespace gclab::train
