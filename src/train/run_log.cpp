#include "gclab/train/run_log.h"

#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <ostream>
#include <vector>

#include "gclab/config/byte_size.h"
#include "gclab/train/session.h"

namespace gclab::train {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

std::string duration_text(double s) {
  const long long t = static_cast<long long>(s + 0.5);
  char buf[32];
  if (t >= 3600)
    std::snprintf(buf, sizeof buf, "%lldh%02lldm", t / 3600, t / 60 % 60);
  else
    std::snprintf(buf, sizeof buf, "%lldm%02llds", t / 60, t % 60);
  return buf;
}

}  // namespace

RunLog::RunLog(const fs::path& output_dir, int64_t start_step, int total_steps, ProgressOptions progress,
               const MemoryModel* model, const std::string& file_name)
    : dir_(output_dir),
      start_step_(start_step),
      total_steps_(total_steps),
      progress_(progress),
      report_every_(progress.in_place ? 1 : std::max<int64_t>(1, total_steps / 20)),
      loop_start_(std::chrono::steady_clock::now()),
      model_(model) {
  const fs::path file = output_dir / file_name;
  std::vector<std::string> kept;
  if (std::ifstream in(file); in) {
    for (std::string line; std::getline(in, line);) {
      const json row = json::parse(line, nullptr, /*allow_exceptions=*/false);
      if (row.is_object() && row.value("step", int64_t{0}) <= start_step) kept.push_back(line);
    }
  }
  std::ofstream(file, std::ios::trunc);  // rewritten below with what is kept
  metrics_.open(file, std::ios::app);
  for (const auto& line : kept) metrics_ << line << "\n";
  metrics_.flush();
}

void RunLog::step(int64_t step, const StepResult& r, double step_s, Session& session, int oom_skips,
                  int nonfinite_steps) {
  const config::ProcessConfig& config = session.config();
  auto stats = session.meter().stats();
  const std::map<Phase, int64_t> peaks = session.phases().peaks();
  for (const auto& [name, bytes] : peaks) stats.peak_bytes = std::max(stats.peak_bytes, bytes);
  peak_bytes_ = std::max(peak_bytes_, stats.peak_bytes);
  const ResidentBytes held = session.resident();
  // The same step predicted: its cell under the run's policy, and the run's load, preview and save.
  const std::optional<PhaseBytes> predicted = model_ ? std::optional<PhaseBytes>(model_->predict(r)) : std::nullopt;
  if (predicted)
    for (const auto& [phase, bytes] : *predicted) run_predicted_[phase] = std::max(run_predicted_[phase], bytes);
  json line = json{{"step", step},
                   {"loss", r.loss},
                   {"lr", r.lr},
                   {"grad_norm", r.grad_norm},
                   {"step_time_s", step_s},
                   {"data_wait_s", r.data_wait_s},
                   {"bucket", r.bucket},
                   {"batch", r.batch},
                   {"peak_bytes", stats.peak_bytes},
                   {"phases", memory::by_phase_name(peaks)},
                   {"predicted_phases", predicted ? json(memory::by_phase_name(*predicted)) : json(nullptr)},
                   {"weights_bytes", held.weights},
                   {"gradient_bytes", r.gradient_bytes},
                   {"optimizer_bytes", held.optimizer},
                   {"live_bytes", stats.live_bytes},
                   {"host_live_bytes", stats.host_live_bytes},
                   {"reserved_bytes", stats.reserved_bytes},
                   {"cap_bytes", config.vram_cap.bytes},
                   {"cap_counts", session.meter().cap_counts()},
                   {"oom_skips", oom_skips},
                   {"nonfinite_loss", r.nonfinite},
                   {"nonfinite_steps", nonfinite_steps}};
  if (const dist::World& w = session.plan().world; !w.alone())  // this rank's: its buckets, its wait
    line["dist"] = json{{"world_size", w.size},
                        {"rank", w.rank},
                        {"gradient_bucket_bytes", held.gradient_buckets},
                        {"buckets_started_in_backward", r.buckets_started_in_backward},
                        {"reduce_wait_s", r.reduce_wait_s}};
  metrics_ << line.dump() << "\n";
  metrics_.flush();
  for (const auto& [name, bytes] : peaks) run_peaks_[name] = std::max(run_peaks_[name], bytes);
  last_step_peaks_ = peaks;
  session.phases().clear();
  session.meter().reset_peak();
  if (progress_.out && ((step - start_step_) % report_every_ == 0 || step == total_steps_))
    progress_line(step, total_steps_, r.loss, stats.live_bytes, config.vram_cap.bytes);
}

void RunLog::oom_skip(int64_t step, Phase phase, const std::string& bucket, int batch, int oom_skips) {
  metrics_ << json{{"step", step},     {"oom_skip", true}, {"phase", phase_name(phase)},
                   {"bucket", bucket}, {"batch", batch},   {"oom_skips", oom_skips}}
                  .dump()
           << "\n";
  metrics_.flush();
}

void RunLog::caches(Session& session, const std::vector<data::Caption>& captions) {
  if (session.filled().empty()) return;
  const auto& peaks = session.phases().peaks();
  if (const auto it = peaks.find(Phase::cache); it != peaks.end()) run_peaks_[Phase::cache] = it->second;
  if (model_) run_predicted_[Phase::cache] = model_->cache(session.filled(), captions);
  peak_bytes_ = std::max(peak_bytes_, run_peaks_[Phase::cache]);
}

void RunLog::progress_line(int64_t step, int total, double loss, int64_t live_bytes, int64_t cap_bytes) {
  const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - loop_start_).count();
  const double per_s = static_cast<double>(step - start_step_) / std::max(elapsed, 1e-9);
  char text[256];
  const std::string cap = cap_bytes > 0 ? " / cap " + config::format_bytes(cap_bytes) : "";
  std::snprintf(text, sizeof text, "step %lld/%d  loss %.4f  %.2f it/s  ETA %s  mem %s  peak %s%s",
                static_cast<long long>(step), total, loss, per_s,
                duration_text(static_cast<double>(total - step) / std::max(per_s, 1e-9)).c_str(),
                config::format_bytes(live_bytes).c_str(), config::format_bytes(peak_bytes_).c_str(), cap.c_str());
  if (progress_.in_place)
    *progress_.out << "\r" << text << "\033[K" << std::flush;
  else
    *progress_.out << text << "\n" << std::flush;
}

void RunLog::end_progress() {
  if (progress_.out && progress_.in_place) *progress_.out << "\n";
}

void RunLog::write_memory(Session& session) const {
  const config::ProcessConfig& config = session.config();
  const ResidentBytes held = session.resident();
  const LoadMemory& load = session.load_memory();
  // Each phase's peak over the run: the steps', what ran after the last one (the final preview and save),
  // and the load's (setup).
  std::map<Phase, int64_t> measured = run_peaks_;
  for (const auto& [phase, bytes] : session.phases().peaks()) measured[phase] = std::max(measured[phase], bytes);
  if (load.measured_device_peak_bytes) measured[Phase::setup] = *load.measured_device_peak_bytes;
  json out = json{{"device", session.device().str()},
                  {"cap_bytes", config.vram_cap.bytes},
                  {"cap_counts", session.meter().cap_counts()},
                  {"peak_bytes", peak_bytes_},
                  {"checkpoint_policy", config.train.policy().to_string()},
                  {"weights_bytes", held.weights},
                  {"optimizer_bytes", held.optimizer},
                  {"text_encoder_bytes", held.text_encoder},
                  {"vae_bytes", held.vae},
                  {"image_encoder_bytes", held.image_encoder},
                  {"offload_buffer_bytes", held.offload_buffers},
                  {"host",
                   {{"offloaded_weight_bytes", held.host_weights},
                    {"text_encoder_offloaded_bytes", held.text_encoder_host},
                    {"text_cache_bytes", held.text_cache_host},
                    {"measured_peak_bytes", session.meter().stats().host_peak_bytes},
                    {"cap_bytes", config.host_cap.bytes}}},
                  {"load",
                   {{"quantized_on_host", load.quantized_on_host},
                    {"measured_peak_bytes", load.measured_device_peak_bytes.value_or(0)},
                    {"predicted_peak_bytes", load.device.peak()},
                    {"host_measured_peak_bytes", load.measured_host_peak_bytes.value_or(0)},
                    {"host_predicted_peak_bytes", load.host.peak()}}},
                  {"phase_peak_bytes", memory::by_phase_name(measured)},
                  {"predicted_phase_peak_bytes", memory::by_phase_name(run_predicted_)}};
  out["applied_policy"] = session.applied_policy().to_string();   // auto's plan, a budget's blocks
  if (const dist::World& w = session.plan().world; !w.alone()) {  // this process's figures, one of world_size
    out["world_size"] = w.size;
    out["rank"] = w.rank;
    out["gradient_bucket_bytes"] = held.gradient_buckets;
  }
  if (model_ && model_->estimate().auto_plan) out["auto_plan"] = auto_plan_json(*model_->estimate().auto_plan);
  std::ofstream(dir_ / "memory.json") << out.dump(2) << "\n";
}

}  // namespace gclab::train
