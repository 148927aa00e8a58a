#include "gclab/bench/report.h"

#include <yaml-cpp/yaml.h>

#include <cstdlib>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <tuple>

#include "gclab/config/user_error.h"
#include "gclab/model/quantize.h"
#include "gclab/model/registry.h"

#include "gclab/config/byte_size.h"
#include "gclab/data/dataset.h"
#include "gclab/log/log.h"
#include "gclab/model/family.h"
#include "gclab/model/spec.h"
#include "gclab/text/encoder.h"
#include "gclab/text/prompt.h"
#include "gclab/train/session.h"

namespace gclab::bench {

using train::LoadEstimate;
using train::MemoryEstimate;
using train::StepEstimate;
using train::TextEncodeEstimate;

using config::format_bytes;

namespace {

using ojson = nlohmann::ordered_json;

std::string fits_cap(int64_t bytes, int64_t cap_bytes) {
  if (cap_bytes <= 0) return "";
  return bytes <= cap_bytes ? ", fits the cap" : ", over the cap";
}

}  // namespace

Document model_summary_report(const model::ModelSummary& s) {
  const auto& spec = s.spec;
  Document d;
  d.heading("/model_summary", "the model this config selects, counted on a meta-device build (no memory)");
  ojson m;
  m["preset"] = spec.preset;
  m["family"] = spec.family.name();
  m["blocks"] = spec.total_blocks();
  d.note("/model_summary/blocks", model::family_of(spec.family).describe_blocks(spec) + ", width " +
                                      std::to_string(spec.hidden) + " (" + std::to_string(spec.heads) + " heads x " +
                                      std::to_string(spec.head_dim) + ")");
  m["weights_from"] = s.weights_from;
  m["parameters"] = s.parameters;
  m["trainable_parameters"] = s.trainable_parameters;
  if (s.lora_modules)
    d.note("/model_summary/trainable_parameters", "LoRA on " + std::to_string(s.lora_modules) + " Linear modules");
  m["weight_bytes"] = s.weight_bytes;
  d.note("/model_summary/weight_bytes", format_bytes(s.weight_bytes) + ", " + s.weight_storage);
  m["tokens"] = ojson::array();
  d.note("/model_summary/tokens", "per sample; text for a 77-token prompt");
  for (const auto& t : s.tokens) {
    ojson row = {{"at", t.what + " " + std::to_string(t.width) + "x" + std::to_string(t.height)},
                 {"image", t.image_tokens},
                 {"text", t.text_tokens}};
    if (t.reference_tokens) row["reference"] = t.reference_tokens;
    m["tokens"].push_back(row);
  }
  d.value["model_summary"] = m;
  return d;
}

Document autoencoder_report(const config::ProcessConfig& config) {
  const model::ModelSpec spec = model::spec_for(config);
  const vae::CodecSpec c = train::codec_plan(config, spec);
  const bool cpu = !train::runs_on_cuda(config);
  const bool cached = train::run_caches_latents(config);
  Document d;
  d.heading("/autoencoder",
            std::string("the autoencoder this config selects (model.vae), its memory predicted from its "
                        "shapes (") +
                (cpu ? "CPU" : "CUDA") + " kernels)");
  ojson a;
  a["codec"] = c.describe();
  a["weight_bytes"] = c.weight_bytes();
  d.note("/autoencoder/weight_bytes", format_bytes(c.weight_bytes()));
  a["on_the_device_during_steps"] = c.autoencoder && !cached;
  d.note("/autoencoder/on_the_device_during_steps", !c.autoencoder ? "no weights"
                                                    : cached
                                                        ? "cache_latents: it leaves once they are encoded"
                                                        : "latents are encoded on the fly, in each step's data phase");
  a["encode_peaks"] = ojson::array();
  std::set<std::tuple<int, int, int>> seen;
  for (const train::StepCell& cell : train::step_cells(config)) {
    const int res = cell.resolution, batch = cached ? 1 : cell.batch;  // caching: one at a time
    if (!seen.insert({res, batch, cell.frames}).second) continue;
    const int64_t b = c.encode_bytes({batch, cell.frames, cell.bucket_height(), cell.bucket_width()}, cpu);
    d.note("/autoencoder/encode_peaks/" + std::to_string(a["encode_peaks"].size()), format_bytes(b));
    ojson peak = {{"at", std::to_string(res) + "x" + std::to_string(res)}, {"batch", batch}, {"bytes", b}};
    if (cell.frames > 1) peak["frames"] = cell.frames;
    a["encode_peaks"].push_back(peak);
  }
  if (config.sample && !config.train.disable_sampling) {
    const auto& s = *config.sample;
    const int64_t b = c.decode_bytes({1, s.num_frames, s.height, s.width}, cpu);
    a["decode_peak"] = {{"at", std::to_string(s.width) + "x" + std::to_string(s.height)}, {"bytes", b}};
    d.note("/autoencoder/decode_peak",
           format_bytes(b) +
               (c.tile_sample_size > 0 ? ", in " + std::to_string(c.tile_sample_size) + "-pixel tiles" : ""));
  }
  d.value["autoencoder"] = a;
  return d;
}

Document text_encoders_report(const config::ProcessConfig& config) {
  const model::ModelSpec spec = model::spec_for(config);
  const auto plan =
      train::prompt_plan(config, spec,
                         torch::TensorOptions()
                             .device(torch::kMeta)
                             .dtype(config.train.dtype == config::DType::bf16 ? torch::kBFloat16 : torch::kFloat));
  const text::PromptEncoder prompts(plan);
  Document d;
  d.heading("/text_encoders", "the text encoders " + spec.family.name() +
                                  "'s pipeline conditions on (text/), as the run builds them (on the meta device "
                                  "here): their weights as AI Toolkit holds them (" +
                                  model::describe_text_encoder_storage(config.model, spec) + ")");
  d.value["text_encoders"] = ojson::array();
  int64_t total = 0;
  for (size_t i = 0; i < prompts.slots(); ++i) {
    int64_t params = 0;
    for (const auto& p : prompts.encoder(i).parameters()) params += p.numel();
    const int64_t bytes = prompts.weight_bytes(i);
    total += bytes;
    const std::filesystem::path folder = i < plan.encoders.size() ? plan.encoders[i] : "";
    d.note("/text_encoders/" + std::to_string(i),
           format_bytes(bytes) + (folder.empty() ? "" : ", shape from " + folder.string()));
    d.value["text_encoders"].push_back({{"slot", model::text_encoder_folder(i)},
                                        {"kind", std::string(config::name_of(prompts.encoder(i).kind()))},
                                        {"parameters", params},
                                        {"weight_bytes", bytes}});
  }
  if (prompts.slots() == 0) return d;
  const bool leaves = train::text_encoder_leaves(config);
  d.value["text_encoders_total_bytes"] = total;
  d.note("/text_encoders_total_bytes", format_bytes(total));
  const bool cpu = !train::runs_on_cuda(config);
  const text::EncodePrediction p = train::predict_caption_encode(prompts, spec, cpu);
  d.note("/text_encode_peak", "a " + std::to_string(model::kNominalCaptionTokens) + "-token caption" +
                                  (spec.reference_tokens ? " with a square control image" : "") +
                                  ", walked (its encode on meta encoders, " + (cpu ? "CPU" : "CUDA") + " kernels)");
  ojson peak = {{"encoders", ojson::array()}};
  for (size_t i = 0; i < prompts.slots(); ++i) {
    peak["encoders"].push_back(
        {{"slot", model::text_encoder_folder(i)}, {"tokens", p.tokens[i]}, {"bytes", p.bytes[i]}});
    d.note("/text_encode_peak/encoders/" + std::to_string(i), format_bytes(p.bytes[i]));
  }
  peak["caption_bytes"] = p.peak_bytes;
  d.note("/text_encode_peak/caption_bytes",
         format_bytes(p.peak_bytes) + ": the encoders in turn, each beside what the ones before returned");
  d.value["text_encode_peak"] = peak;
  d.value["text_encoders_on_the_device_during_steps"] = !leaves;
  d.note("/text_encoders_on_the_device_during_steps",
         std::string(leaves ? "cache_text_embeddings / unload_text_encoder: they leave once the captions (or the "
                              "trigger word) and the sample prompts are encoded"
                            : "captions are encoded every step") +
             (config.model.low_vram ? "; low_vram does not move them: AI Toolkit's low_vram quantizes the "
                                      "transformer on the CPU while loading, and its encoders stay on the device"
                                    : ""));
  return d;
}

Document bucket_report(const config::ProcessConfig& config) {
  const model::ModelSpec spec = model::spec_for(config);
  const int divisibility = spec.divisibility;
  const data::BucketRules rules{divisibility, static_cast<int>(spec.latent_temporal)};
  Document d;
  d.heading("/buckets", "buckets, from image headers only (divisibility " + std::to_string(divisibility) + ")");
  d.value["buckets"] = ojson::object();
  for (size_t i = 0; i < config.datasets.size(); ++i) {
    const auto& ds = config.datasets[i];
    const std::string key = "datasets[" + std::to_string(i) + "]";
    ojson per = ojson::object();
    try {
      const auto scan = data::scan_dataset(ds, static_cast<int>(i));
      for (const auto& w : scan.warnings) log::warn(w);
      d.note("/buckets/" + key, *ds.folder_path + ", " + std::to_string(scan.items.size()) +
                                    (data::video_dataset(ds) ? " clips" : " images"));
      for (const auto& [resolution, buckets] : data::bucket_histogram(scan.items, ds, rules)) {
        ojson& counts = per[std::to_string(resolution)] = ojson::object();
        for (const auto& [bucket, count] : buckets) counts[bucket.key()] = count;
      }
    } catch (const data::DataError& e) {
      d.note("/buckets/" + key, e.what());
    }
    d.value["buckets"][key] = per;
  }
  return d;
}

namespace {

// The load's peaks at `at` ("/load", "/estimate/load").
void add_load(Document& d, const LoadEstimate& load, int64_t cap_bytes, const std::string& at) {
  d.note(at, std::string("before training, as the arch's AI Toolkit loader (train/loading.h): the transformer in its "
                         "dtype, quantized ") +
                 (load.quantized_on_host ? "in host memory" : "on the device") +
                 ", the text encoders built and quantized on the device" +
                 (load.at_first_use ? "; under low_vram the transformer stays in host memory until its first forward "
                                      "or preview, as AI Toolkit's loader for the arch leaves it"
                                    : ""));
  d.value[ojson::json_pointer(at)] = {{"device_peak", load.device_peak_bytes}, {"host_peak", load.host_peak_bytes}};
  d.note(at + "/device_peak", format_bytes(load.device_peak_bytes) + fits_cap(load.device_peak_bytes, cap_bytes));
  d.note(at + "/host_peak", format_bytes(load.host_peak_bytes));
}

}  // namespace

Document load_report(const LoadEstimate& load, int64_t cap_bytes) {
  Document d;
  add_load(d, load, cap_bytes, "/load");
  return d;
}

Document phases_report(const train::MemoryModel& model, const config::ProcessConfig& config) {
  Document d;
  const train::StepCell cell = train::largest_cell(config);
  const ckpt::CheckpointPolicy& policy = model.policy();
  ojson j = {
      {"batch", cell.batch}, {"frames", cell.frames}, {"resolution", cell.resolution}, {"policy", policy.to_string()}};
  const train::PhaseBytes phases = model.phases(model.step(cell.shape(), policy));
  j["predicted"] = memory::by_phase_name(phases);
  if (model.estimate().auto_plan) j["auto_plan"] = train::auto_plan_json(*model.estimate().auto_plan);
  d.value["phases"] = j;
  if (model.estimate().auto_plan) d.note("/phases/auto_plan", train::describe_auto_plan(*model.estimate().auto_plan));
  d.heading("/phases",
            "each phase's peak predicted for the largest batch at the largest resolution (a run's "
            "memory.json records the same phases measured beside predicted)");
  for (const auto& [phase, bytes] : phases)
    d.note(std::string("/phases/predicted/") + memory::phase_name(phase),
           format_bytes(bytes) + fits_cap(bytes, config.vram_cap.bytes));
  return d;
}

namespace {

// The estimate's step figures at one cell, checkpointing off or full.
ojson step_json(const StepEstimate& s, bool text_every_step) {
  ojson j = {{"batch_tensors", s.batch_bytes},
             {"activations", s.activation_bytes},
             {"forward_walk", s.forward_bytes},
             {"backward_walk", s.backward_bytes},
             {"vae_encode", s.encode_bytes}};
  if (text_every_step) j["text_encode"] = s.text_bytes;
  if (s.reference_bytes > 0) j["control_latents"] = s.reference_bytes;
  j["phases"] = memory::by_phase_name(s.phases);
  j["total"] = s.total_bytes;
  j["first_step_total"] = s.first_total_bytes;
  return j;
}

// A cell's total, and which step is its peak: the first update makes the optimizer's state, so step 1's
// forward and backward run without it.
std::string step_note(const StepEstimate& s, int64_t cap_bytes) {
  std::string note = format_bytes(s.total_bytes) + fits_cap(s.total_bytes, cap_bytes);
  if (s.first_total_bytes < s.total_bytes)
    note += "; step 1: " + format_bytes(s.first_total_bytes) + fits_cap(s.first_total_bytes, cap_bytes) +
            " (no optimizer state before its update): the peak is step 2's";
  return note;
}

void estimate_text(Document& d, ojson& est, const TextEncodeEstimate& t, int64_t cap_bytes) {
  d.note("/estimate/text_encode",
         "one " + std::to_string(t.caption_tokens) + "-token caption" +
             (t.control_images ? " with a square control image" : "") +
             " through the text encoders (its encode walked), " +
             (t.every_step ? "in every step's text phase (text_encode in per_resolution)"
                           : "once before training (then they leave the device): total is the cache phase's "
                             "text fill under cache_text_embeddings, else beside the weights"));
  ojson te = {{"encoders", ojson::array()}};
  for (size_t i = 0; i < t.encoders.size(); ++i)
    te["encoders"].push_back({{"slot", t.encoders[i]}, {"tokens", t.tokens[i]}, {"peak", t.bytes[i]}});
  te["encode_peak"] = t.encode_bytes;
  d.note("/estimate/text_encode/encode_peak", format_bytes(t.encode_bytes));
  if (!t.every_step) {
    te["total"] = t.total_bytes;
    d.note("/estimate/text_encode/total", format_bytes(t.total_bytes) + fits_cap(t.total_bytes, cap_bytes));
  }
  est["text_encode"] = te;
}

void estimate_cache(Document& d, ojson& est, const train::CacheEstimate& c, int64_t cap_bytes) {
  d.note("/estimate/cache",
         "the caches filled before the first step (the cache phase), as AI Toolkit fills them: the latents one "
         "image at a time with only the autoencoder on the device, then the captions with only the text "
         "encoders; the transformer (not a LoRA) off the device for both");
  ojson j;
  if (c.latents_bytes > 0) {
    j["latents"] = c.latents_bytes;
    j["resolution"] = c.resolution;
    d.note("/estimate/cache/latents", format_bytes(c.latents_bytes) + fits_cap(c.latents_bytes, cap_bytes) +
                                          (c.frames > 1 ? " (a clip of " + std::to_string(c.frames) + " frames at "
                                                        : std::string(" (an image of ")) +
                                          std::to_string(c.resolution) + "²)");
  }
  if (c.text_bytes > 0) {
    j["text"] = c.text_bytes;
    d.note("/estimate/cache/text", format_bytes(c.text_bytes) + fits_cap(c.text_bytes, cap_bytes));
  }
  j["total"] = c.total_bytes;
  est["cache"] = j;
}

void estimate_steps(Document& d, ojson& est, const MemoryEstimate& e) {
  const bool every_step = e.text && e.text->every_step;
  d.note("/estimate/per_resolution",
         "each phase's peak (train/predict.h), the run's meter records the same phases; total = the largest: "
         "data (the encode), text (the captions' encode), forward and backward (resident + the step walked op by "
         "op on the meta model: forward_walk / backward_walk), optimizer (its update's temporaries)");
  est["per_resolution"] = ojson::array();
  for (const auto& r : e.resolutions) {
    const std::string at = "/estimate/per_resolution/" + std::to_string(est["per_resolution"].size());
    est["per_resolution"].push_back({{"resolution", r.resolution},
                                     {"batch", r.batch},
                                     {"frames", r.frames},
                                     {"image_tokens", r.image_tokens},
                                     {"text_tokens", r.text_tokens},
                                     {"gc_off", step_json(r.gc_off, every_step)},
                                     {"gc_full", step_json(r.gc_full, every_step)}});
    d.note(at + "/gc_off", step_note(r.gc_off, e.cap_bytes));
    d.note(at + "/gc_full", step_note(r.gc_full, e.cap_bytes));
    if (r.gc_run) {  // the run's own policy, when it is neither
      ojson run = step_json(*r.gc_run, every_step);
      run["policy"] = e.policy.to_string();
      est["per_resolution"].back()["gc_run"] = run;
      d.note(at + "/gc_run", step_note(*r.gc_run, e.cap_bytes));
    }
  }
  if (!e.preview) return;
  const auto& p = *e.preview;
  d.heading("/estimate/preview",
            "after a step: resident without gradients, the autoencoder on the device, then the largest of "
            "denoising, decoding, (edit models) encoding the ctrl_img and (prompts not cached) encoding the prompts");
  ojson pj = {{"size", std::to_string(p.width) + "x" + std::to_string(p.height)},
              {"frames", p.frames},
              {"image_tokens", p.image_tokens},
              {"denoise", p.denoise_bytes},
              {"vae_decode", p.decode_bytes}};
  if (p.reference_encode_bytes > 0) pj["vae_encode_control"] = p.reference_encode_bytes;
  if (p.text_encode_bytes > 0) pj["text_encode"] = p.text_encode_bytes;
  pj["total"] = p.total_bytes;
  d.note("/estimate/preview", format_bytes(p.total_bytes) + fits_cap(p.total_bytes, e.cap_bytes));
  est["preview"] = pj;
}

}  // namespace

// Each rank's share under a sharding (train/sharding.h): its resident bytes and each cell's totals moved by them.
void estimate_per_rank(Document& d, ojson& est, const MemoryEstimate& e, train::Shard shard) {
  const train::ShardedResident s = train::shard_resident(e, shard);
  ojson pr = {{"world_size", s.world_size},
              {"shard", train::shard_name(shard)},
              {"weights", s.weights},
              {"gradients", s.gradients},
              {"gradient_buckets", s.gradient_buckets},
              {"optimizer_state", s.optimizer},
              {"ema", s.ema},
              {"gathered", s.gathered},
              {"resident", s.resident}};
  pr["per_resolution"] = ojson::array();
  for (const auto& r : e.resolutions)
    pr["per_resolution"].push_back({{"resolution", r.resolution},
                                    {"batch", r.batch},
                                    {"frames", r.frames},
                                    {"gc_off_total", train::sharded_step_total(r.gc_off, s)},
                                    {"gc_full_total", train::sharded_step_total(r.gc_full, s)}});
  est["per_rank"] = pr;
  d.note("/estimate/per_rank", std::string("each of ") + std::to_string(s.world_size) + " ranks under shard " +
                                   train::shard_name(shard) + " (train/sharding.h): resident " +
                                   format_bytes(s.resident) + " of the replica's " + format_bytes(s.unsharded) +
                                   (shard == train::Shard::none ? " (gclab's DDP, as it trains)" : " (on paper)"));
}

Document estimate_report(const MemoryEstimate& e, train::Shard shard) {
  Document d;
  ojson est;
  auto bytes = [&](const char* key, int64_t v) {
    est[key] = v;
    d.note(std::string("/estimate/") + key, format_bytes(v));
  };
  est["preset"] = e.spec.preset;
  bytes("weights", e.weight_bytes);
  est["trained_parameters"] = e.trained;
  bytes("trained_parameter_bytes", e.trained_bytes);
  bytes("gradients", e.gradient_bytes);
  bytes("optimizer_state", e.optimizer_bytes);
  bytes("ema", e.ema_bytes);
  bytes("text_encoder", e.text_encoder_bytes);
  est["vae"] = e.vae;
  bytes("vae_weights", e.vae_weight_bytes);
  bytes("vae_resident", e.vae_bytes);
  if (e.image_encoder_bytes > 0) bytes("image_encoder", e.image_encoder_bytes);  // an image-to-video model's
  if (e.host_weight_bytes > 0) {
    bytes("host_weights", e.host_weight_bytes);        // model.layer_offloading: in host memory
    bytes("offload_buffers", e.offload_buffer_bytes);  // the rings' weights on the device, one being brought
  }
  if (e.world_size > 1) {  // per process, one of world_size replicas
    est["world_size"] = e.world_size;
    bytes("gradient_buckets", e.gradient_bucket_bytes);
  }
  bytes("resident", e.resident_bytes);
  bytes("optimizer_step", e.optimizer_step_bytes);  // the optimizer phase's temporaries
  bytes("save", e.save_bytes);                      // the save phase's peak
  est["activations_dtype"] = e.activation_dtype;
  if (e.cap_bytes > 0) bytes("cap", e.cap_bytes);
  est["policy"] = e.policy.to_string();
  if (e.auto_plan) est["auto_plan"] = train::auto_plan_json(*e.auto_plan);
  d.value["estimate"] = est;
  if (e.auto_plan) d.note("/estimate/auto_plan", train::describe_auto_plan(*e.auto_plan));
  add_load(d, e.load, e.cap_bytes, "/estimate/load");
  ojson& at = d.value["estimate"];
  if (e.text) estimate_text(d, at, *e.text, e.cap_bytes);
  if (e.cache) estimate_cache(d, at, *e.cache, e.cap_bytes);
  estimate_steps(d, at, e);
  if (e.world_size > 1) estimate_per_rank(d, at, e, shard);
  at["not_modelled"] = e.not_modelled;
  return d;
}

namespace {

std::string fit_table(const std::vector<FitRow>& rows) {
  std::ostringstream out;
  const std::string lever = rows.empty() ? "batch" : rows.front().lever;
  out << "| resolution | policy | largest " << lever << " that fits | batch | peak there | predicted largest " << lever
      << " |\n|---|---|---|---|---|---|\n";
  for (const auto& r : rows)
    out << "| " << r.resolution << " | " << r.policy << " | "
        << (r.largest ? std::to_string(r.largest) : "none (the smallest " + r.lever + " runs out)") << " | " << r.batch
        << " | " << (r.largest ? format_bytes(r.peak_bytes) : std::string("-")) << " | "
        << (r.predicted < 0 ? std::string("-") : std::to_string(r.predicted)) << " |\n";
  return out.str();
}

}  // namespace

namespace {

// Data parallelism: the figures are per process.
void label_world(Document& d, int world_size) {
  if (world_size <= 1) return;
  d.value["world_size"] = world_size;
  d.note("/world_size", "per process: one of " + std::to_string(world_size) + " data-parallel ranks (WORLD_SIZE)");
}

}  // namespace

Document fit_report(const std::vector<FitRow>& rows) {
  Document d;
  d.preamble(fit_table(rows));
  label_world(d, rows.empty() ? 1 : rows.front().world_size);
  d.value["fit"] = ojson::array();
  for (const auto& r : rows)
    d.value["fit"].push_back({{"resolution", r.resolution},
                              {"policy", r.policy},
                              {"largest_" + r.lever, r.largest},
                              {"batch", r.batch},
                              {"peak_bytes", r.peak_bytes},
                              {"predicted_" + r.lever, r.predicted < 0 ? ojson() : ojson(r.predicted)}});
  return d;
}

Document bench_report(const std::vector<BenchRow>& rows) {
  Document d;
  d.preamble(bench_table(rows));
  label_world(d, rows.empty() ? 1 : rows.front().world_size);
  d.value["bench"] = ojson::array();
  for (const auto& r : rows) {
    ojson row = {{"resolution", r.resolution}, {"batch", r.batch}, {"policy", r.policy}, {"oom", r.oom}};
    if (!r.cap.empty()) row.update(ojson{{"cap", r.cap}, {"cap_bytes", r.cap_bytes}});
    row["applied"] = r.applied;
    if (r.oom) row["oom_phase"] = r.oom_phase;
    row.update(ojson{{"step_ms", r.step_ms},
                     {"time_ratio", r.time_ratio},
                     {"peak_bytes", r.peak_bytes},
                     {"reserved_peak_bytes", r.reserved_peak_bytes},
                     {"peak_ratio", r.peak_ratio},
                     {"predicted_activation_bytes", r.predicted_activation_bytes},
                     {"model_tflop", r.model_tflop},
                     {"mfu", r.mfu},
                     {"recomputed_share", r.recomputed_share},
                     {"theory_ratio", r.theory_ratio}});
    d.value["bench"].push_back(row);
  }
  return d;
}

Document config_report(const config::ProcessConfig& config) {
  Document d;
  try {
    d.value = yaml_value(YAML::Load(config::to_yaml(config)));
  } catch (const YAML::Exception& e) {
    throw std::logic_error(std::string("the resolved config does not read back as YAML: ") + e.what());
  }
  return d;
}

}  // namespace gclab::bench
