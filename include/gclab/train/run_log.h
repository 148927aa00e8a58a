// What a training run writes as it goes, in one place: metrics.jsonl (a JSON object per optimizer step, and
// one per batch skipped out of memory), the progress line, and memory.json at the end. It keeps the run's
// memory bookkeeping — the peak, each phase's peak over the run and at the last step, measured and, from
// the run's memory model (train/predict.h), predicted for the same step — and starts each step's phase
// peaks afresh once it has written them.
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iosfwd>
#include <map>
#include <string>

#include "gclab/train/phase.h"
#include "gclab/train/predict.h"

namespace gclab::train {

class Session;
struct StepResult;

struct ProgressOptions {
  std::ostream* out = nullptr;  // nullptr: no progress lines
  bool in_place = false;        // a terminal: one line updated with \r
};

class RunLog {
 public:
  // metrics.jsonl in output_dir: a resumed run (start_step > 0) first drops the lines after the step it
  // resumes from (steps a killed run logged after its last save), so every step appears once.
  // `model` (may be null: nothing predicted) outlives the log.
  // `file`: another name for the lines (a data-parallel rank above 0 writes its memory step by step, not the run's
  // metrics: memory_steps.jsonl).
  RunLog(const std::filesystem::path& output_dir, int64_t start_step, int total_steps, ProgressOptions progress,
         const MemoryModel* model = nullptr, const std::string& file = "metrics.jsonl");

  // A finished optimizer step (previews and saves it triggered included): its metrics line, the progress
  // line when due; then the session's phase peaks and the meter's peak start again.
  // `oom_skips` and `nonfinite_steps`: the run's counts so far.
  void step(int64_t step, const StepResult& result, double step_s, Session& session, int oom_skips,
            int nonfinite_steps);
  // The caches filled before the first step (Session::filled): the `cache` phase's peak, measured and
  // predicted for the fills that ran with the run's captions.
  void caches(Session& session, const std::vector<data::Caption>& captions);
  // A batch dropped out of memory (train.oom_policy: skip).
  void oom_skip(int64_t step, Phase phase, const std::string& bucket, int batch, int oom_skips);
  // Ends an in-place progress line.
  void end_progress();
  // memory.json: the run's peaks and what held memory at its end, for reports and other tools.
  void write_memory(Session& session) const;

  int64_t peak_bytes() const { return peak_bytes_; }
  const std::map<Phase, int64_t>& last_step_peaks() const { return last_step_peaks_; }

 private:
  void progress_line(int64_t step, int total, double loss, int64_t live_bytes, int64_t cap_bytes);

  std::filesystem::path dir_;
  std::ofstream metrics_;
  int64_t start_step_ = 0;
  int total_steps_ = 0;
  ProgressOptions progress_;
  int64_t report_every_ = 1;
  std::chrono::steady_clock::time_point loop_start_;
  int64_t peak_bytes_ = 0;
  std::map<Phase, int64_t> run_peaks_, last_step_peaks_;
  const MemoryModel* model_ = nullptr;
  PhaseBytes run_predicted_;  // per phase, the highest prediction of the steps logged
};

}  // namespace gclab::train
