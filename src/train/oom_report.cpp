#include "gclab/train/oom_report.h"
#include "gclab/train/session.h"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <tuple>

#include "gclab/ckpt/policy.h"
#include "gclab/config/byte_size.h"
#include "gclab/data/dataset.h"
#include "gclab/log/log.h"
#include "gclab/memory/device.h"
#include "gclab/model/family.h"
#include "gclab/model/quantize.h"
#include "gclab/train/predict.h"
#include "gclab/train/trainer.h"

namespace gclab::train {

namespace {

// A bucket key, "WxH" or a video dataset's "WxHxFf" (data::BucketResolution::key): width, height, frames.
std::tuple<int, int, int> parse_bucket(const std::string& key) {
  int w = 0, h = 0, f = 1;
  char x = 0;
  std::stringstream s(key);
  s >> w >> x >> h;
  if (s.peek() == 'x') s >> x >> f;
  return {w, h, std::max(f, 1)};
}

// The load ran out (phase setup, before the first step): what the arch's loader holds while it quantizes.
// Each saving is the load's predicted device peak (train/loading.h) with and without the change.
std::vector<OomFix> load_fixes(const config::ProcessConfig& config) {
  std::vector<OomFix> fixes;
  const int64_t now = predicted_load_peak(config);
  auto priced = [&](const std::string& title, const std::string& change, const std::string& why,
                    const std::function<void(config::ProcessConfig&)>& apply) {
    config::ProcessConfig changed = config;
    apply(changed);
    const int64_t saving = now - predicted_load_peak(changed);
    if (saving > 0)
      fixes.push_back({title, change, saving,
                       "the load's device peak, predicted with and without the change (train/loading.h): " + why});
  };
  const bool honours_low_vram = model::low_vram_quantizes_in_host_memory(config.model.arch);
  if (config.model.quantize && !config.model.low_vram && honours_low_vram)
    priced("Quantize the transformer in host memory", "model.low_vram: true",
           "the transformer is quantized on the CPU and reaches the device quantized (AI Toolkit: slower to load)",
           [](config::ProcessConfig& c) { c.model.low_vram = true; });
  // parked_while_text_encoders_load unquantized: low_vram sends the transformer to the CPU until the text
  // encoders are loaded and quantized (wan21.py:358-361, 479-482).
  if (!config.model.quantize && !config.model.low_vram &&
      model::transformer_loading(config.model.arch) == model::TransformerLoading::parked_while_text_encoders_load)
    priced("Keep the transformer in host memory while the text encoders load", "model.low_vram: true",
           "the loader moves the transformer to the CPU and back to the device once the text encoders are loaded "
           "and quantized",
           [](config::ProcessConfig& c) { c.model.low_vram = true; });
  if (!config.model.low_vram && !honours_low_vram)  // per_block: low_vram keeps it off the device while loading
    priced("Keep the transformer in host memory until its first use", "model.low_vram: true",
           "the loader leaves the transformer on the CPU and the first forward or preview brings it to the "
           "device, after the text encoders' load (and, with cached embeddings, their unload)",
           [](config::ProcessConfig& c) { c.model.low_vram = true; });
  if (!config.model.quantize && config.network) {  // a full fine-tune trains the base: quantized, it would not
    // Quantized on the device, the transformer would still arrive in its dtype: under the StableDiffusion
    // loader quantizing helps the load only in host memory.
    priced("Quantize the base weights", "model.quantize: true (qtype qfloat8)",
           "the transformer reaches the device as float8 codes",
           [](config::ProcessConfig& c) { c.model.quantize = true, c.model.qtype = config::QType::qfloat8; });
    if (honours_low_vram)
      priced("Quantize the base weights in host memory", "model.quantize: true (qtype qfloat8), model.low_vram: true",
             "the transformer is quantized on the CPU and reaches the device as float8 codes",
             [](config::ProcessConfig& c) {
               c.model.quantize = true, c.model.qtype = config::QType::qfloat8, c.model.low_vram = true;
             });
  }
  if (!config.model.quantize_te.value_or(config.model.quantize))
    priced("Quantize the text encoders", "model.quantize_te: true",
           "each text encoder AI Toolkit quantizes is quantized as soon as it is on the device",
           [](config::ProcessConfig& c) { c.model.quantize_te = true; });
  // All of them are the load's own levers: the largest saving first.
  std::stable_sort(fixes.begin(), fixes.end(), [](const OomFix& a, const OomFix& b) {
    return a.predicted_saving_bytes > b.predicted_saving_bytes;
  });
  return fixes;
}

// What every lever of an out-of-memory error in a step or a preview is priced from: the peak the memory
// model (train/predict.h) predicts for the run as it is and for the config re-planned with the change — the
// step's (its highest phase, the optimizer's state made, at the failing cell) or the preview's. Not the
// failing phase's alone: a change that moves the peak to another phase saves only down to that one.
struct Levers {
  Levers(const OomContext& c, const config::ProcessConfig& cfg, const vae::CodecSpec& co)
      : ctx(c), config(cfg), codec(co) {}
  const OomContext& ctx;
  const config::ProcessConfig& config;
  const vae::CodecSpec& codec;
  int bw = 0, bh = 0;  // the batch's bucket (the preview's size in the sample phase)
  int frames = 1;      // its frames
  int batch = 1;
  bool cpu = false;
  bool fully_checkpointed = false;
  // The training step's own levers (checkpointing, batch, buckets) do not apply to a preview, which runs
  // without gradients at its own size.
  bool in_step = true;
  Phase phase = Phase::forward;
  std::unique_ptr<MemoryModel> current;  // the run as it is, planned once (nullptr: it could not be)
  std::optional<int64_t> now;            // the step's (or the preview's) predicted peak as the run is
  // The failing phase's own fixes (`first`), then the rest in the order practice recommends.
  std::vector<OomFix> first, fixes;

  // The predicted peak under `c` at a cell of samples of `shape`: the policy the run's Session would apply
  // (a selective one priced as off, an upper bound). nullopt, said in a warning, where the changed config
  // cannot be planned: the report is written all the same, without that fix.
  std::optional<int64_t> predicted(const config::ProcessConfig& c, const model::SampleShape& shape) const;
  std::optional<int64_t> predicted(const config::ProcessConfig& c) const { return predicted(c, cell()); }
  model::SampleShape cell() const { return {batch, frames, bh, bw}; }
  // The same read from a model already planned.
  int64_t peak(const MemoryModel& model, const model::SampleShape& shape) const;
  // now - changed, when both were predicted.
  static std::optional<int64_t> saved(const std::optional<int64_t>& from, const std::optional<int64_t>& to) {
    if (!from || !to) return std::nullopt;
    return *from - *to;
  }
  std::string what() const {
    if (phase == Phase::cache) return "the cache fill's peak";
    return phase == Phase::sample ? "the preview's peak"
                                  : "the step's peak at " + ctx.bucket + ", batch " + std::to_string(batch);
  }
  std::string basis(const std::string& change) const {
    return what() + ", the memory model's (train/predict.h) for the run as it is and re-planned " + change;
  }
  // A fix priced by re-planning with `apply`, offered when it saves something; into `to` (fixes by default).
  void priced(const std::string& title, const std::string& change, const std::string& how,
              const std::function<void(config::ProcessConfig&)>& apply, std::vector<OomFix>* to = nullptr) {
    config::ProcessConfig c = config;
    apply(c);
    const std::optional<int64_t> saving = saved(now, predicted(c));
    if (saving && *saving > 0) (to ? *to : fixes).push_back({title, change, *saving, basis(how)});
  }

  void latent_cache_fix();
  bool auto_fix();
  void step_fixes();
  void preview_fixes();
  void weight_fixes();
  void text_fixes();
  void optimizer_fixes();
};

int64_t Levers::peak(const MemoryModel& model, const model::SampleShape& shape) const {
  if (phase == Phase::cache) {  // the fill that ran out, at the largest cell (its figures are the model's)
    const std::optional<CacheEstimate>& c = model.estimate().cache;
    return !c ? 0 : ctx.activity == Activity::text_encode ? c->text_bytes : c->latents_bytes;
  }
  const StepEstimate s = model.step(shape, model.policy());
  if (phase != Phase::sample) return s.total_bytes;
  const PhaseBytes phases = model.phases(s);
  const auto it = phases.find(Phase::sample);
  return it == phases.end() ? 0 : it->second;
}

std::optional<int64_t> Levers::predicted(const config::ProcessConfig& c, const model::SampleShape& shape) const {
  try {
    log::QuietScope quiet;
    return peak(MemoryModel(c), shape);
  } catch (const std::exception& e) {
    log::warn(std::string("the OOM report could not re-plan a fix (left out): ") + e.what());
    return std::nullopt;
  }
}

// 0. The autoencoder's encode ran out: cache the latents before training (it then leaves the device).
void Levers::latent_cache_fix() {
  if (ctx.activity != Activity::vae_encode || !codec.autoencoder || bw <= 0) return;
  std::string which;
  for (size_t d = 0; d < config.datasets.size(); ++d)
    if (!config.datasets[d].cache_latents && !config.datasets[d].cache_latents_to_disk)
      which += (which.empty() ? "" : ", ") + std::string("datasets[") + std::to_string(d) + "].cache_latents: true";
  if (!which.empty())
    priced(
        "Cache the latents before training", which, "with the latents cached (the autoencoder leaves the device)",
        [](config::ProcessConfig& c) {
          for (auto& d : c.datasets) d.cache_latents = true;
        },
        &first);
}

// 1a. checkpoint_policy auto at the failing cell under the cap the run ran out under (vram_cap, else the GPU's
// whole memory), offered in place of full when it fits for fewer recomputed FLOPs: whether it was.
bool Levers::auto_fix() {
  // A run already under auto applied the best plan the memory model found: nothing to offer here.
  if (config.train.policy().kind == ckpt::CheckpointPolicy::Kind::Auto) return false;
  int64_t cap = ctx.cap_bytes;
  if (cap <= 0 && !cpu) {  // the card's whole memory: what a fresh run's auto fits (less the CUDA context)
    const c10::Device device(config.device == "auto" ? std::string("cuda") : config.device);
    for (const auto& g : memory::describe_devices().gpus)
      if (g.index == (device.has_index() ? device.index() : 0)) cap = g.total_bytes;
  }
  if (cap <= 0 || !now) return false;
  try {
    log::QuietScope quiet;
    config::ProcessConfig c = config;
    c.train.checkpoint_policy = ckpt::CheckpointPolicy::parse("auto");
    RunPlan p = plan_run(c, PlanOptions{/*meta=*/true});
    p.auto_cap_bytes = cap, p.auto_cap_source = "the cap";
    const MemoryModel model(std::move(p));
    const AutoPlan a = model.auto_plan(c.train.policy(), cell(), cap, "the cap");
    if (!a.fits || a.full_recompute_cost <= 0 || a.full_recomputed_flops <= 0 ||
        a.recompute_cost >= a.full_recompute_cost)
      return false;
    const int64_t saving = *now - model.step(cell(), a.chosen).total_bytes;
    if (saving <= 0) return false;
    char share[160];
    std::snprintf(share, sizeof share,
                  "; it recomputes %.0f%% of full checkpointing's forward FLOPs: about %.0f%% of full's recompute "
                  "time saved (the recompute's writes counted)",
                  100 * a.recomputed_flops / a.full_recomputed_flops,
                  100 * (1 - a.recompute_cost / a.full_recompute_cost));
    fixes.push_back(
        {"Let gclab choose what to recompute (checkpoint_policy: auto)",
         "train.checkpoint_policy: auto (here " + a.chosen.to_string() + ")", saving,
         basis("with checkpoint_policy auto under " + config::format_bytes(cap) + " (" + a.chosen.to_string() + ")") +
             share});
    return true;
  } catch (const std::exception& e) {
    log::warn(std::string("the OOM report could not plan checkpoint_policy auto (left out): ") + e.what());
    return false;
  }
}

// 1. Checkpointing off (or partial): every block checkpointed. 2. Batch size: half the batch, twice the
// accumulation, the same effective batch. 3. The largest bucket: the dataset's largest resolution dropped.
void Levers::step_fixes() {
  // Filling the latent cache: one image at a time at each bucket, so only the largest bucket is a lever.
  if ((!in_step && phase != Phase::cache) || bw <= 0) return;
  if (in_step && !fully_checkpointed && !auto_fix())
    priced("Turn gradient checkpointing on", "train.gradient_checkpointing: true (train.checkpoint_policy: full)",
           "with checkpointing full", [](config::ProcessConfig& c) {
             c.train.gradient_checkpointing = true, c.train.checkpoint_policy = ckpt::CheckpointPolicy::full();
           });
  // A video run's first lever once checkpointing is on: fewer frames a sample (half the latent frames).
  if (in_step && frames > 1 && current) {
    const int fewer = static_cast<int>(model::fewer_frames(current->estimate().spec, frames));
    config::ProcessConfig c = config;
    bool per_clip = false;  // auto_frame_count: each clip at its own length, the longest `frames`
    const int temporal = static_cast<int>(current->estimate().spec.latent_temporal);
    for (size_t i = 0; i < c.datasets.size(); ++i) {
      config::DatasetConfig& d = c.datasets[i];
      // auto_frame_count: a dataset whose longest clip is that long (a shorter one keeps its own lengths).
      const bool longest =
          d.auto_frame_count && data::most_frames(d, static_cast<int>(i), temporal).value_or(0) >= frames;
      if (d.num_frames == frames || longest) {
        per_clip = per_clip || longest;
        d.num_frames = fewer, d.auto_frame_count = false;
      }
    }
    const std::optional<int64_t> saving = saved(now, predicted(c, {batch, fewer, bh, bw}));
    if (fewer < frames && saving && *saving > 0)
      fixes.push_back({"Train on fewer frames",
                       "datasets[*].num_frames: " + std::to_string(fewer) + " (from " + std::to_string(frames) + ")" +
                           (per_clip ? " with auto_frame_count: false (or a lower fps)" : ""),
                       *saving, basis("at " + std::to_string(fewer) + " frames")});
  }
  if (in_step && batch > 1) {
    config::ProcessConfig c = config;
    const int accumulation = config.train.accumulation();
    c.train.batch_size = batch / 2, c.train.gradient_accumulation = accumulation * 2;
    for (auto& d : c.datasets) d.batch_size.reset();
    const std::optional<int64_t> saving = saved(now, predicted(c, {batch / 2, frames, bh, bw}));
    if (saving && *saving > 0)
      fixes.push_back({"Lower the batch size and accumulate",
                       "train.batch_size: " + std::to_string(batch / 2) + " with train.gradient_accumulation: " +
                           std::to_string(accumulation * 2) + " (same effective batch)",
                       *saving, basis("at batch " + std::to_string(batch / 2))});
  }
  for (size_t d = 0; d < config.datasets.size(); ++d) {
    auto res = config.datasets[d].resolution;
    std::sort(res.begin(), res.end());
    if (res.size() < 2) continue;
    const int largest = res.back(), next = res[res.size() - 2];
    config::ProcessConfig c = config;
    auto& kept = c.datasets[d].resolution;
    kept.erase(std::find(kept.begin(), kept.end(), largest));
    const std::optional<int64_t> saving =
        saved(current ? std::optional<int64_t>(peak(*current, {batch, frames, largest, largest})) : std::nullopt,
              predicted(c, {batch, frames, next, next}));
    if (saving && *saving > 0)
      fixes.push_back({"Drop the largest bucket",
                       "datasets[" + std::to_string(d) + "].resolution without " + std::to_string(largest) +
                           " (largest left: " + std::to_string(next) + ")",
                       *saving,
                       "the step's peak the memory model (train/predict.h) predicts at " + std::to_string(largest) +
                           "², and re-planned without it at " + std::to_string(next) + "², batch " +
                           std::to_string(batch)});
    break;
  }
}

// 4. Previews, when one ran out: the decode tiled, a smaller preview (half the side), previews less often
// or none.
void Levers::preview_fixes() {
  if (!config.sample || config.train.disable_sampling || phase != Phase::sample) return;
  const auto& s = *config.sample;
  const bool in_decode = ctx.activity == Activity::vae_decode;
  int64_t train_peak = 0;
  for (const Phase p : {Phase::forward, Phase::backward})
    if (const auto it = ctx.last_step_phase_peaks.find(p); it != ctx.last_step_phase_peaks.end())
      train_peak = std::max(train_peak, it->second);
  const int64_t preview_above_training = std::max<int64_t>(0, ctx.peak_bytes - train_peak);
  // Tiling helps only the decode: first when the decode ran out, after the other preview fixes otherwise.
  std::vector<OomFix> previews, tiling;
  if (codec.autoencoder && codec.tile_sample_size == 0) {  // not tiled already (vae_tiling, or Qwen-Image's low_vram)
    // The largest tile (512, 256, 128 or 64 pixels, smaller than the preview) whose decode fits under the
    // cap on top of what was live, the autoencoder's weights included; the smallest when none does.
    vae::CodecSpec tiled = codec;
    for (int tile : {512, 256, 128, 64}) {
      if (tile >= std::max(s.width, s.height) && tile > 64) continue;
      tiled.tile_sample_size = tile;
      if (ctx.cap_bytes <= 0 ||
          ctx.live_bytes + codec.weight_bytes() + tiled.decode_bytes({1, s.num_frames, s.height, s.width}, cpu) <=
              ctx.cap_bytes)
        break;
    }
    const int tile = static_cast<int>(tiled.tile_sample_size);
    priced(
        "Decode previews in tiles",
        "sample.vae_tiling: true" +
            (tile == s.vae_tile_size ? std::string() : ", sample.vae_tile_size: " + std::to_string(tile)),
        "with the decode in " + std::to_string(tile) + "-pixel tiles",
        [tile](config::ProcessConfig& c) { c.sample->vae_tiling = true, c.sample->vae_tile_size = tile; }, &tiling);
  }
  priced(
      "Make previews cheaper",
      "sample.width/height " + std::to_string(s.width / 2) + "x" + std::to_string(s.height / 2) + " (from " +
          std::to_string(s.width) + "x" + std::to_string(s.height) + "), fewer sample_steps",
      "at half the preview's side",
      [](config::ProcessConfig& c) {
        // Each preview item took the sample's size when the config was loaded (its own --w / --h aside).
        c.sample->width /= 2, c.sample->height /= 2;
        for (config::SampleItem& item : c.sample->samples) {
          if (item.width) *item.width /= 2;
          if (item.height) *item.height /= 2;
        }
      },
      &previews);
  // A video preview: half the latent frames (its denoising and its decode both grow with them).
  if (s.num_frames > 1 && current) {
    const int fewer = static_cast<int>(model::fewer_frames(current->estimate().spec, s.num_frames));
    if (fewer < s.num_frames)
      priced(
          "Preview fewer frames",
          "sample.num_frames: " + std::to_string(fewer) + " (from " + std::to_string(s.num_frames) + ")",
          "at " + std::to_string(fewer) + " preview frames",
          [fewer](config::ProcessConfig& c) {
            c.sample->num_frames = fewer;
            for (config::SampleItem& item : c.sample->samples) item.num_frames.reset();
          },
          &previews);
  }
  if (preview_above_training > 0)
    previews.push_back(
        {"Preview less often, or not at all",
         "train.disable_sampling: true (or a larger sample.sample_every, which only makes the peak rarer)",
         preview_above_training, "the preview's peak above the training step's, measured"});
  previews.insert(in_decode ? previews.begin() : previews.end(), tiling.begin(), tiling.end());
  first.insert(first.end(), previews.begin(), previews.end());
}

// 5. A LoRA's base weights' storage: quantized (qfloat8), or, for a fully checkpointed run, a step down in bits
// (where blocks keep their graph a uint base keeps dequantized copies, which re-planning prices). 5b.
// Layer offloading (a LoRA base): the transformer's Linears in host memory, brought per call.
void Levers::weight_fixes() {
  if (!config.network) return;  // a full fine-tune trains the base: quantized or offloaded, it would not
  const auto stored = config.model.quantize ? model::quantized_storage(config.model.qtype) : std::nullopt;
  const int bits = stored ? nn::uintx_bits(*stored) : 0;
  std::optional<config::QType> next;
  if (!config.model.quantize)
    next = config::QType::qfloat8;
  else if (config.model.accuracy_recovery_adapter)
    ;  // its adapter was trained on this qtype's rounding: a step down in bits would void it
  else if (fully_checkpointed && stored && !bits)
    next = config::QType::uint4;
  else if (fully_checkpointed && bits > 2)
    next = config::parse_qtype("uint" + std::to_string(bits - 1));
  if (next) {
    const std::string to(config::name_of(*next)), from(config::name_of(config.model.qtype));
    const config::QType q = *next;
    priced(config.model.quantize ? "Store the base in fewer bits" : "Quantize the base weights",
           config.model.quantize ? "model.qtype: " + to + " (from " + from + ")"
                                 : "model.quantize: true (qtype qfloat8: float8 Linear weights)",
           "with the transformer's weights stored as " + to,
           [q](config::ProcessConfig& c) { c.model.quantize = true, c.model.qtype = q; });
  }
  if (!(config.model.layer_offloading && config.model.layer_offloading_transformer_percent >= 1.0))
    priced("Offload the base's layers to host memory",
           "model.layer_offloading: true (layer_offloading_transformer_percent: 1.0)",
           "with the transformer's frozen Linears in host RAM, brought to the device per call (steps get slower, "
           "host memory grows by as much)",
           [](config::ProcessConfig& c) {
             c.model.layer_offloading = true, c.model.layer_offloading_transformer_percent = 1.0;
             config::offloading_qtypes(c.model);
           });
}

// 3b. The optimizer's state, from the step after the first update on beside every step's activations: the
// 8-bit twin, and Adafactor for a full fine-tune.
void Levers::optimizer_fixes() {
  std::vector<config::OptimizerKind> alternatives;
  if (const auto twin = eight_bit_twin(config.train.optimizer)) alternatives.push_back(*twin);
  if (!config.network && config.train.optimizer != config::OptimizerKind::adafactor)
    alternatives.push_back(config::OptimizerKind::adafactor);
  for (const config::OptimizerKind kind : alternatives) {
    const std::string name(config::name_of(kind));
    priced(kind == config::OptimizerKind::adafactor ? "Use Adafactor (factored second moments)"
                                                    : "Keep the optimizer's state in 8 bits",
           "train.optimizer: " + name, "with " + name + "'s state (train/optimizer.h)",
           [kind](config::ProcessConfig& c) { c.train.optimizer = kind; });
  }
}

// 6. The text encoders: cached embeddings or unloaded encoders (they then leave the device), or float8
// weights. First when the encode ran out, or when they hold a quarter or more of what was live: then they
// are what crowds the step out.
void Levers::text_fixes() {
  const bool caching_text = phase == Phase::cache && ctx.activity == Activity::text_encode;
  if ((text_encoder_leaves(config) && !caching_text) || ctx.text_encoder_bytes <= 0) return;
  std::vector<OomFix> text;
  priced(
      "Cache text embeddings (the text encoders then leave the device)", "train.cache_text_embeddings: true",
      "with the captions encoded once before training, the encoders then off the device",
      [](config::ProcessConfig& c) { c.train.cache_text_embeddings = true; }, &text);
  priced(
      "Unload the text encoders",
      "train.unload_text_encoder: true (without cache_text_embeddings every step then trains on the trigger "
      "word, or the empty prompt, not the captions — as in AI Toolkit)",
      "with the text encoders gone after the first encodes",
      [](config::ProcessConfig& c) { c.train.unload_text_encoder = true; }, &text);
  // On the encoders AI Toolkit quantizes (none for SD3, whose loader reads model.quantize instead).
  if (!config.model.quantize_te.value_or(config.model.quantize))
    priced(
        "Quantize the text encoders", "model.quantize_te: true",
        "with the text encoders' quantized Linears (" +
            model::describe_text_encoder_storage(
                [&] {
                  config::ModelConfig m = config.model;
                  m.quantize_te = true;
                  return m;
                }(),
                model::spec_for(config.model)) +
            ")",
        [](config::ProcessConfig& c) { c.model.quantize_te = true; }, &text);
  const bool in_encode = ctx.phase == Phase::text || ctx.activity == Activity::text_encode;
  const bool text_crowds = in_encode || (ctx.live_bytes > 0 && ctx.text_encoder_bytes * 4 >= ctx.live_bytes);
  auto& to = text_crowds ? first : fixes;
  to.insert(text_crowds ? to.begin() : to.end(), text.begin(), text.end());
}

}  // namespace

OomContext oom_context(const config::ProcessConfig& config, const c10::Device& device,
                       const c10::OutOfMemoryError& error) {
  OomContext ctx;
  ctx.checkpoint_policy = config.train.policy().to_string();
  ctx.rank = dist::process_world().name();
  ctx.message = error.what_without_backtrace();
  ctx.device = device.str();
  ctx.cpu = device.is_cpu();
  ctx.cap_bytes = config.vram_cap.bytes;
  ctx.cap_counts = memory::MemoryMeter::cap_counts(device);
  return ctx;
}

std::vector<OomFix> recommend_fixes(const OomContext& ctx, const config::ProcessConfig& config,
                                    const vae::CodecSpec& codec) {
  if (ctx.phase == Phase::setup) return load_fixes(config);
  Levers l(ctx, config, codec);
  std::tie(l.bw, l.bh, l.frames) = parse_bucket(ctx.bucket);
  const ckpt::CheckpointPolicy::Kind kind = config.train.policy().kind;
  l.fully_checkpointed = kind == ckpt::CheckpointPolicy::Kind::Full || kind == ckpt::CheckpointPolicy::Kind::Offload;
  l.batch = std::max(ctx.batch, 1);
  l.cpu = ctx.cpu;
  l.in_step = ctx.phase != Phase::sample && ctx.phase != Phase::cache;
  l.phase = ctx.phase;
  if (l.bw <= 0) {
    const StepCell cell = largest_cell(config);
    l.bw = cell.bucket_width(), l.bh = cell.bucket_height(), l.frames = cell.frames;
  }
  try {
    log::QuietScope quiet;
    l.current = std::make_unique<MemoryModel>(config);
    l.now = l.peak(*l.current, l.cell());
    // auto: what its plan applied (full there: checkpointing on is no fix).
    const ckpt::CheckpointPolicy::Kind applied = l.current->policy().kind;
    l.fully_checkpointed = l.fully_checkpointed || applied == ckpt::CheckpointPolicy::Kind::Full ||
                           applied == ckpt::CheckpointPolicy::Kind::Offload;
  } catch (const std::exception& e) {
    log::warn(std::string("the OOM report could not plan the run as it is (its re-planned fixes left out): ") +
              e.what());
  }
  l.latent_cache_fix();
  l.step_fixes();
  l.optimizer_fixes();
  l.preview_fixes();
  l.weight_fixes();
  l.text_fixes();
  l.first.insert(l.first.end(), l.fixes.begin(), l.fixes.end());
  return l.first;
}

Session open_session(const config::ProcessConfig& config, const std::filesystem::path& output_dir,
                     const SessionOptions& options) {
  try {
    return Session(config, options);
  } catch (const c10::OutOfMemoryError& e) {
    OomContext ctx = oom_context(config, resolve_device(config.device), e);
    ctx.phase = Phase::setup;
    ctx.bucket = "-";
    ctx.peak_bytes = predicted_load_peak(config);
    const model::ModelSpec spec = model::spec_for(config.model);
    std::filesystem::create_directories(output_dir);
    const std::string brief = write_oom_report(output_dir, ctx, recommend_fixes(ctx, config, codec_plan(config, spec)));
    throw OutOfMemoryStop(brief);
  }
}

namespace {

// Where the step right after the first update ran out in its forward or backward: the optimizer's state,
// made by that update, is what that step holds and the one before did not.
std::string why_this_step(const OomContext& c) {
  if (!(c.first_update_step > 0 && c.step == c.first_update_step + 1 && c.optimizer_bytes > 0 &&
        c.phase != Phase::optimizer && c.phase != Phase::sample && c.phase != Phase::save))
    return "";
  std::ostringstream md;
  md << "## Why step " << c.step << " and not step " << c.first_update_step << "\n\nStep " << c.first_update_step
     << " ran its forward and backward before the optimizer had any state: its update made it ("
     << config::format_bytes(c.optimizer_bytes) << "). From step " << c.step
     << " on that state sits beside every step's activations, so this step needed that much more than step "
     << c.first_update_step << " did in the same phase. `gclab estimate` predicts both (each cell's "
     << "`first_step_total` beside its `total`).\n\n";
  return md.str();
}

// oom_report.json: the report's facts for tools.
void write_oom_json(const std::filesystem::path& file, const OomContext& c, const std::vector<OomFix>& fixes,
                    int64_t other) {
  nlohmann::ordered_json j;
  j["step"] = c.step;
  if (!c.rank.empty()) j["rank"] = c.rank;
  j["phase"] = phase_name(c.phase);
  j["activity"] = activity_name(c.activity);
  j["bucket"] = c.bucket;
  j["batch"] = c.batch;
  j["checkpoint_policy"] = c.checkpoint_policy;
  j["device"] = c.device;
  j["cap_bytes"] = c.cap_bytes;
  j["cap_counts"] = c.cap_counts;
  j["message"] = c.message;
  j["skipped"] = nlohmann::ordered_json::array();
  for (const auto& s : c.skipped)
    j["skipped"].push_back(
        {{"step", s.step}, {"phase", phase_name(s.phase)}, {"bucket", s.bucket}, {"batch", s.batch}});
  j["live_bytes"] = {{"weights", c.weight_bytes},
                     {"gradients", c.gradient_bytes},
                     {"optimizer", c.optimizer_bytes},
                     {"text_encoder", c.text_encoder_bytes},
                     {"vae", c.vae_bytes},
                     {"image_encoder", c.image_encoder_bytes},
                     {"activations_and_other", other},
                     {"total", c.live_bytes}};
  j["peak_bytes"] = c.peak_bytes;
  j["last_step_phase_peaks"] = memory::by_phase_name(c.last_step_phase_peaks);
  j["last_good_step"] = c.last_good_step;
  j["first_update_step"] = c.first_update_step;
  j["saved"] = c.saved_weights;
  j["fixes"] = nlohmann::ordered_json::array();
  for (const auto& f : fixes)
    j["fixes"].push_back({{"title", f.title},
                          {"change", f.change},
                          {"predicted_saving_bytes", f.predicted_saving_bytes},
                          {"basis", f.basis}});
  std::ofstream(file) << j.dump(2) << "\n";
}

}  // namespace

std::string write_oom_report(const std::filesystem::path& dir, const OomContext& c, const std::vector<OomFix>& fixes) {
  using config::format_bytes;
  const int64_t categorized = c.weight_bytes + c.gradient_bytes + c.optimizer_bytes + c.text_encoder_bytes +
                              c.vae_bytes + c.image_encoder_bytes;
  const int64_t other = std::max<int64_t>(0, c.live_bytes - categorized);
  std::ostringstream md;
  const std::string where = std::string(phase_name(c.phase)) +
                            (c.activity == Activity::model ? "" : std::string(", ") + activity_name(c.activity));
  const bool loading = c.phase == Phase::setup;  // before the first step: the model was being loaded
  if (loading)
    md << "# Out of memory loading the model, phase `" << where << "`\n\n";
  else
    md << "# Out of memory at step " << c.step << ", phase `" << where << "`\n\n";
  md << "| | |\n|---|---|\n";
  if (!c.rank.empty())
    md << "| rank | " << c.rank << " (this process's memory: its replica and its slice of the batch) |\n";
  md << "| phase | " << where << " |\n| step | " << c.step << " (last good: " << c.last_good_step << ") |\n";
  md << "| bucket | " << c.bucket << " |\n| batch | " << c.batch << " |\n";
  md << "| checkpoint policy | " << c.checkpoint_policy << " |\n| device | " << c.device << " |\n";
  md << "| cap | "
     << (c.cap_bytes > 0 ? format_bytes(c.cap_bytes) + " of " + c.cap_counts + " bytes"
                         : "none (the device's own memory)")
     << " |\n";
  md << "| failed allocation | " << c.message << " |\n\n";
  if (loading) {
    md << "## The load\n\nThe model was being loaded, before any step: the transformer built and quantized as "
          "the arch's AI Toolkit loader does it, then the text encoders (train/loading.h). The load's device peak "
          "for this config is predicted at "
       << format_bytes(c.peak_bytes) << ".\n\n";
  } else {
    md << "## What was live\n\n| category | bytes |\n|---|---|\n";
    md << "| weights | " << format_bytes(c.weight_bytes) << " |\n| gradients | " << format_bytes(c.gradient_bytes)
       << " |\n";
    md << "| optimizer state | " << format_bytes(c.optimizer_bytes) << " |\n";
    md << "| text encoder | " << format_bytes(c.text_encoder_bytes) << " |\n";
    md << "| autoencoder | " << format_bytes(c.vae_bytes) << " |\n";
    if (c.image_encoder_bytes > 0) md << "| image encoder | " << format_bytes(c.image_encoder_bytes) << " |\n";
    md << "| activations and the rest | " << format_bytes(other) << " |\n";
    md << "| live once the failed step was unwound | " << format_bytes(c.live_bytes) << " |\n| peak this step | "
       << format_bytes(c.peak_bytes) << " |\n\n";
    if (!c.last_step_phase_peaks.empty()) {
      md << "Peaks of the last step that completed: ";
      bool first = true;
      for (const auto& [p, b] : c.last_step_phase_peaks)
        md << (first ? "" : ", ") << phase_name(p) << " " << format_bytes(b), first = false;
      md << ".\n\n";
    }
    if (c.phase == Phase::cache)
      md << "## The cache fill\n\nThe caches were being filled before the first step, as AI Toolkit fills them: "
         << (c.activity == Activity::text_encode
                 ? "the captions through the text encoders, the transformer and the autoencoder off the device "
                   "(its 'cache_text_encoder' device state)"
                 : "the latents, one image at a time through the autoencoder, the transformer and the text "
                   "encoders off the device (its 'cache_latents' device state)")
         << ". `gclab check` prints this phase's predicted peak (`cache`).\n\n";
    else
      md << why_this_step(c);
  }
  if (!c.skipped.empty()) {
    md << "## Skipped before it\n\nOut of memory earlier too; each of these steps was skipped (no update), as AI "
          "Toolkit skips them, until the 4th in a row:\n\n| step | phase | bucket | batch |\n|---|---|---|---|\n";
    for (const auto& s : c.skipped)
      md << "| " << s.step << " | " << phase_name(s.phase) << " | " << s.bucket << " | " << s.batch << " |\n";
    md << "\n";
  }
  md << "On CUDA the cap is the caching allocator's memory fraction; the CUDA context itself (a few hundred MiB) "
        "is outside it.\n\n";
  md << "## What to change, first things first\n\n";
  for (size_t i = 0; i < fixes.size(); ++i)
    md << i + 1 << ". **" << fixes[i].title << "**: `" << fixes[i].change << "` — predicted saving "
       << format_bytes(fixes[i].predicted_saving_bytes) << " (" << fixes[i].basis << ")\n";
  if (loading)
    md << "\nNothing was lost: nothing was trained yet.\n";
  else
    md << "\nNothing was lost: " << (c.saved_weights.empty() ? "nothing to save yet" : "saved " + c.saved_weights)
       << " (a rerun of `gclab train` resumes from it).\n";
  std::ofstream(dir / "oom_report.md") << md.str();

  write_oom_json(dir / "oom_report.json", c, fixes, other);

  std::ostringstream brief;
  if (!c.rank.empty()) brief << c.rank << ": ";
  if (loading)
    brief << "out of memory loading the model (`" << where << "`, predicted load peak " << format_bytes(c.peak_bytes)
          << (c.cap_bytes ? ", cap " + format_bytes(c.cap_bytes) : "") << ")";
  else
    brief << "out of memory at step " << c.step << " in `" << where << "` (bucket " << c.bucket << ", batch " << c.batch
          << ", policy " << c.checkpoint_policy << (c.cap_bytes ? ", cap " + format_bytes(c.cap_bytes) : "") << ")";
  if (!fixes.empty())
    brief << "; first fix: " << fixes.front().change << " (saves ~"
          << format_bytes(fixes.front().predicted_saving_bytes) << ")";
  brief << "; report: " << (dir / "oom_report.md").string();
  return brief.str();
}

}  // namespace gclab::train
