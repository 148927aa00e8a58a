#include "gclab/train/trainer.h"

#include <chrono>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <ostream>
#include <random>

#include "gclab/config/byte_size.h"
#include "gclab/config/loader.h"
#include "gclab/data/dataset.h"
#include "gclab/log/log.h"
#include "gclab/train/oom_report.h"
#include "gclab/train/session.h"
#include "gclab/train/state_file.h"

namespace gclab::train {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using json = nlohmann::json;

namespace {

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

std::string duration_text(double s) {
  const long long t = static_cast<long long>(s + 0.5);
  char buf[32];
  if (t >= 3600)
    std::snprintf(buf, sizeof buf, "%lldh%02lldm", t / 3600, t / 60 % 60);
  else
    std::snprintf(buf, sizeof buf, "%lldm%02llds", t / 60, t % 60);
  return buf;
}

// metrics.jsonl: one JSON object a line. A resumed run first drops the lines after the step it resumes
// from (steps a killed run logged after its last save), so every step appears once.
class MetricsLog {
 public:
  MetricsLog(const fs::path& file, int64_t resumed_step) {
    std::vector<std::string> kept;
    if (std::ifstream in(file); in) {
      for (std::string line; std::getline(in, line);) {
        const json row = json::parse(line, nullptr, /*allow_exceptions=*/false);
        if (row.is_object() && row.value("step", int64_t{0}) <= resumed_step) kept.push_back(line);
      }
    }
    std::ofstream(file, std::ios::trunc);  // rewritten below with what is kept
    out_.open(file, std::ios::app);
    for (const auto& line : kept) out_ << line << "\n";
    out_.flush();
  }
  void write(const json& row) {
    out_ << row.dump() << "\n";
    out_.flush();
  }

 private:
  std::ofstream out_;
};

// The data the run trains on: every dataset's items, scanned once.
std::vector<data::ImageItem> scan(std::vector<config::DatasetConfig>& datasets, bool cache_text_embeddings) {
  if (datasets.empty()) throw data::DataError("no datasets: add a `datasets` entry with a folder_path");
  std::vector<data::ImageItem> items;
  int skipped = 0;
  for (size_t d = 0; d < datasets.size(); ++d) {
    auto result = data::scan_dataset(datasets[d], static_cast<int>(d));
    for (const auto& w : result.warnings) log::warn(w);
    skipped += result.skipped_images;
    log::info("datasets[" + std::to_string(d) + "]: " + std::to_string(result.items.size()) + " images from " +
              *datasets[d].folder_path);
    items.insert(items.end(), result.items.begin(), result.items.end());
    if (cache_text_embeddings || datasets[d].cache_text_embeddings)
      for (const auto& w : data::disable_caption_randomness(datasets[d]))
        log::warn("datasets[" + std::to_string(d) + "]: " + w);
  }
  if (skipped > 0) log::warn(std::to_string(skipped) + " file(s) skipped in all (see the warnings above)");
  return items;
}

// Every caption the run will ask for, as the loader makes them without dropout (cache_text_embeddings).
std::vector<data::Caption> run_captions(const std::vector<data::ImageItem>& items,
                                        const std::vector<config::DatasetConfig>& datasets,
                                        const std::optional<std::string>& trigger_word) {
  std::vector<data::Caption> out;
  for (const auto& item : items) {
    std::mt19937_64 unused(0);
    auto ds = datasets[static_cast<size_t>(item.dataset)];
    ds.caption_dropout_rate = 0;
    out.push_back({data::process_caption(item.caption, ds, trigger_word, unused), item.controls, {}, item.image});
  }
  return out;
}

void progress_line(const TrainOptions& o, int64_t step, int total, double loss, double per_s, int64_t live_bytes,
                   int64_t peak_bytes, int64_t cap_bytes) {
  char text[256];
  const std::string cap = cap_bytes > 0 ? " / cap " + config::format_bytes(cap_bytes) : "";
  std::snprintf(text, sizeof text, "step %lld/%d  loss %.4f  %.2f it/s  ETA %s  mem %s  peak %s%s",
                static_cast<long long>(step), total, loss, per_s,
                duration_text(static_cast<double>(total - step) / std::max(per_s, 1e-9)).c_str(),
                config::format_bytes(live_bytes).c_str(), config::format_bytes(peak_bytes).c_str(), cap.c_str());
  if (o.progress_in_place)
    *o.progress << "\r" << text << "\033[K" << std::flush;
  else
    *o.progress << text << "\n" << std::flush;
}

}  // namespace

std::string dry_run(const config::ProcessConfig& config) {
  Session session(config, SessionOptions{/*meta=*/true});
  const ResidentBytes r = session.resident();
  return session.spec().preset + " on the meta device: " + std::to_string(r.weights) + " weight bytes, " +
         std::to_string(r.trained) + " trained, " + std::to_string(session.lora_modules()) +
         " LoRA modules; checkpoint policy " + session.applied_policy().to_string() + "; optimizer " +
         std::string(config::name_of(config.train.optimizer)) + "; nothing was trained";
}

TrainSummary train(const config::ProcessConfig& config, const TrainOptions& options) {
  const auto t_start = Clock::now();
  const config::TrainConfig& tc = config.train;
  TrainSummary summary;
  summary.output_dir = fs::path(config.training_folder) / config.name;
  fs::create_directories(summary.output_dir / "samples");
  std::ofstream(summary.output_dir / "config.resolved.yaml") << config::to_yaml(config);
  log::add_file((summary.output_dir / "log.txt").string());
  struct LogFileScope {
    ~LogFileScope() { log::remove_files(); }
  } log_file_scope;

  // ---- the session: device, memory meter and cap, model + policy, optimizer, text, previews ----
  std::vector<config::DatasetConfig> datasets = config.datasets;
  const std::vector<data::ImageItem> items = scan(datasets, tc.cache_text_embeddings);
  Session session = open_session(config, summary.output_dir);
  log::info(session.spec().preset + ": " + std::to_string(model::parameter_count(session.model())) + " parameters, " +
            std::to_string(model::trainable_parameter_count(session.model())) + " trained" +
            (session.lora_modules() ? " (LoRA rank " + std::to_string(session.lora().rank) + " on " +
                                          std::to_string(session.lora_modules()) + " modules)"
                                    : "") +
            "; checkpoint policy " + session.applied_policy().to_string() + "; " + session.device().str() +
            (session.bf16() ? ", bf16 autocast" : ", fp32"));
  session.precompute_text(run_captions(items, datasets, config.trigger_word));

  // ---- resume ----
  RunSaves saves(summary.output_dir, config.name, config.save.max_step_saves_to_keep,
                 !config.network && config.save.save_format == config::SaveFormat::diffusers);
  int64_t step = 0;
  if (options.resume) {
    if (const auto resumed = saves.resume(session))
      step = *resumed;
    else
      log::warn("--resume: no saved state in " + summary.output_dir.string() + "; starting at step 0");
  }
  summary.start_step = summary.end_step = step;
  MetricsLog metrics(summary.output_dir / "metrics.jsonl", step);

  // ---- the loop ----
  data::LoaderOptions lo;
  lo.batch_size = tc.batch_size;
  lo.divisibility = session.spec().divisibility;
  lo.reference_area = session.spec().reference_area;
  lo.seed = config.seed();
  lo.trigger_word = config.trigger_word;
  std::optional<data::BatchLoader> loader;  // started after the budget probe: its thread allocates too
  auto next_batch = [&] {
    data::LoadedBatch b = loader->next();
    for (const auto& w : loader->take_warnings()) log::warn(w);
    return b;
  };
  const fs::path samples_dir = summary.output_dir / "samples";
  auto take_samples = [&](int64_t at) {
    const auto files = session.sample(at, samples_dir);
    summary.samples.insert(summary.samples.end(), files.begin(), files.end());
    if (!files.empty())
      log::info("step " + std::to_string(at) + ": " + std::to_string(files.size()) + " sample(s) in " +
                samples_dir.string());
  };
  const int sample_every = config.sample ? config.sample->sample_every : 0;
  const int64_t report_every = options.progress_in_place ? 1 : std::max<int64_t>(1, tc.steps / 20);
  std::map<std::string, int64_t> run_peaks, last_step_peaks;
  int64_t last_good_step = step;  // the parameters' step: what a save now would hold
  int consecutive_ooms = 0;
  const auto loop_start = Clock::now();

  // Out of memory (real or under the cap): skip the batch (oom_policy: skip), or save, report and stop.
  auto on_oom = [&](const c10::OutOfMemoryError& e) {
    const auto live = session.meter().stats();
    const ResidentBytes held = session.resident();
    session.optimizer().zero_grad();
    const Phase phase = session.current_phase();
    const bool in_step = phase != Phase::sample && phase != Phase::save;
    session.meter().release_cached();  // what the failed step held goes back before anything else runs
    if (tc.oom_policy == config::OomPolicy::skip && in_step && ++consecutive_ooms < 3) {
      ++summary.oom_skips;
      log::warn("out of memory at step " + std::to_string(step + 1) + " in " + phase_name(phase) + " (bucket " +
                session.current_bucket() + "); batch skipped (train.oom_policy: skip, " +
                std::to_string(consecutive_ooms) + " in a row)");
      metrics.write({{"step", step + 1},
                     {"oom_skip", true},
                     {"phase", phase_name(phase)},
                     {"bucket", session.current_bucket()},
                     {"oom_skips", summary.oom_skips}});
      session.phases().clear();
      session.meter().reset_peak();
      return;
    }
    OomContext ctx = oom_context(config, session.device(), e);
    ctx.step = step + 1;
    ctx.phase = phase;
    ctx.activity = session.current_activity();
    ctx.bucket = session.current_bucket();
    ctx.batch = session.current_batch();
    if (phase == Phase::sample)
      ctx.bucket = std::to_string(config.sample->width) + "x" + std::to_string(config.sample->height), ctx.batch = 1;
    ctx.live_bytes = live.live_bytes;
    ctx.peak_bytes = live.peak_bytes;
    ctx.weight_bytes = held.weights;
    ctx.gradient_bytes = held.gradients;
    ctx.optimizer_bytes = held.optimizer;
    ctx.text_encoder_bytes = held.text_encoder;
    ctx.vae_bytes = held.vae;
    ctx.last_step_phase_peaks = last_step_peaks;
    ctx.last_good_step = last_good_step;
    session.lift_cap();  // nothing lost: the save is not part of the experiment
    try {
      ctx.saved_weights = saves.save(session, last_good_step, false).string();
    } catch (const std::exception& save_error) {
      log::error(std::string("could not save after the out-of-memory error: ") + save_error.what());
    }
    const std::string brief = write_oom_report(
        summary.output_dir, ctx,
        recommend_fixes(ctx, config, session.spec(), session.codec_spec(), session.activation_options()));
    if (options.progress && options.progress_in_place) *options.progress << "\n";
    throw OutOfMemoryStop(brief);
  };

  if (tc.budget_probe && tc.policy().kind == ckpt::CheckpointPolicy::Kind::Budget) {
    try {
      const auto [measured, ledger] = session.probe_block_activations();
      log::info("budget probe: the blocks keep " + config::format_bytes(measured) +
                " without checkpointing at the largest batch and resolution; the ledger says " +
                config::format_bytes(ledger));
    } catch (const c10::OutOfMemoryError& e) {
      on_oom(e);
    }
  }
  loader.emplace(items, datasets, session.codec(), lo, step * session.accumulation());
  try {
    session.cache_latents(*loader);
  } catch (const c10::OutOfMemoryError& e) {
    on_oom(e);
  }
  session.phases().clear();
  // AI Toolkit's baseline: unless skip_first_sample, at the start of a fresh run, or at the step a run
  // resumes from under force_first_sample (BaseSDTrainProcess.py:2477-2481).
  if (session.sampling() && !tc.skip_first_sample && (step == 0 || tc.force_first_sample)) {
    try {
      take_samples(step);
    } catch (const c10::OutOfMemoryError& e) {
      on_oom(e);
    }
  }
  for (; step < tc.steps; ++step) {
    if (options.stop_requested && options.stop_requested->load()) {
      summary.interrupted = true;
      break;
    }
    StepResult r;
    try {
      const auto t_step = Clock::now();
      r = session.train_step(step, next_batch);
      last_good_step = step + 1;
      const double step_s = seconds_since(t_step);
      summary.losses.push_back(r.loss);
      summary.data_wait_s += r.data_wait_s;
      summary.step_s += step_s;
      summary.end_step = step + 1;
      // Previews and saves belong to this step: their phase peaks go in its metrics line.
      if (session.sampling() && (step + 1) % sample_every == 0 && step + 1 >= config.sample->sample_start_step)
        take_samples(step + 1);
      if (step + 1 < tc.steps && (step + 1) % config.save.save_every == 0)
        summary.saves.push_back(saves.save(session, step + 1, false));

      auto stats = session.meter().stats();
      for (const auto& [name, bytes] : session.phases().peaks()) stats.peak_bytes = std::max(stats.peak_bytes, bytes);
      summary.peak_bytes = std::max(summary.peak_bytes, stats.peak_bytes);
      const ResidentBytes held = session.resident();
      metrics.write({{"step", step + 1},
                     {"loss", r.loss},
                     {"lr", r.lr},
                     {"grad_norm", r.grad_norm},
                     {"step_time_s", step_s},
                     {"data_wait_s", r.data_wait_s},
                     {"bucket", r.bucket},
                     {"batch", r.batch},
                     {"peak_bytes", stats.peak_bytes},
                     {"phases", session.phases().peaks()},
                     {"weights_bytes", held.weights},
                     {"gradient_bytes", r.gradient_bytes},
                     {"optimizer_bytes", held.optimizer},
                     {"live_bytes", stats.live_bytes},
                     {"host_live_bytes", stats.host_live_bytes},
                     {"reserved_bytes", stats.reserved_bytes},
                     {"cap_bytes", config.vram_cap.bytes},
                     {"cap_counts", session.meter().cap_counts()},
                     {"oom_skips", summary.oom_skips}});
      for (const auto& [name, bytes] : session.phases().peaks()) run_peaks[name] = std::max(run_peaks[name], bytes);
      last_step_peaks = session.phases().peaks();
      session.phases().clear();
      session.meter().reset_peak();
      const int64_t done = step + 1 - summary.start_step;
      if (options.progress && (done % report_every == 0 || step + 1 == tc.steps))
        progress_line(options, step + 1, tc.steps, r.loss,
                      static_cast<double>(done) / std::max(seconds_since(loop_start), 1e-9), stats.live_bytes,
                      summary.peak_bytes, config.vram_cap.bytes);
      consecutive_ooms = 0;
    } catch (const c10::OutOfMemoryError& e) {
      on_oom(e);
      --step;  // skipped: the step is taken again with the next batch
    } catch (const SaveError&) {
      throw;  // the previous save is intact; nothing more can be written
    } catch (const std::exception& e) {
      // Anything else that ends the run (unusable data, a bug): the last good state first.
      log::error(std::string("stopping at step ") + std::to_string(step + 1) + ": " + e.what());
      if (last_good_step > summary.start_step) summary.saves.push_back(saves.save(session, last_good_step, false));
      throw;
    }
  }
  if (options.progress && options.progress_in_place) *options.progress << "\n";
  // The last step's preview, as AI Toolkit ends a run, unless it was just taken.
  if (session.sampling() && !summary.interrupted && step > summary.start_step && step % sample_every != 0)
    take_samples(step);
  if (summary.interrupted) log::info("stopped at step " + std::to_string(step) + " (interrupted); saving");
  summary.saves.push_back(saves.save(session, step, false));  // the state for --resume
  if (!summary.interrupted) summary.saves.push_back(saves.save(session, step, true));
  summary.unusable_images = loader->unusable_files();
  for (const auto& f : summary.unusable_images) log::warn("not used (cannot be decoded): " + f);
  summary.total_s = seconds_since(t_start);

  // memory.json: the run's peaks, for reports and other tools.
  const ResidentBytes held = session.resident();
  std::ofstream(summary.output_dir / "memory.json")
      << json{{"device", session.device().str()},
              {"cap_bytes", config.vram_cap.bytes},
              {"cap_counts", session.meter().cap_counts()},
              {"peak_bytes", summary.peak_bytes},
              {"checkpoint_policy", tc.policy().to_string()},
              {"weights_bytes", held.weights},
              {"optimizer_bytes", held.optimizer},
              {"text_encoder_bytes", held.text_encoder},
              {"vae_bytes", held.vae},
              {"offload_buffer_bytes", held.offload_buffers},
              {"host",
               {{"offloaded_weight_bytes", held.host_weights},
                {"text_encoder_offloaded_bytes", held.text_encoder_host},
                {"text_cache_bytes", held.text_cache_host},
                {"measured_peak_bytes", session.meter().stats().host_peak_bytes},
                {"cap_bytes", config.host_cap.bytes}}},
              {"load",
               {{"quantized_on_host", session.load_memory().quantized_on_host},
                {"measured_peak_bytes", session.load_memory().measured_device_peak_bytes.value_or(0)},
                {"predicted_peak_bytes", session.load_memory().device.peak()},
                {"host_measured_peak_bytes", session.load_memory().measured_host_peak_bytes.value_or(0)},
                {"host_predicted_peak_bytes", session.load_memory().host.peak()}}},
              {"phase_peak_bytes", run_peaks}}
             .dump(2)
      << "\n";
  return summary;
}

}  // namespace gclab::train
