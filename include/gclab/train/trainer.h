// `gclab train`: the run, read top to bottom in trainer.cpp — build the Session, resume, then the loop
// { batch -> train_step -> metrics -> previews / saves when due }, with out-of-memory handling in one place.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <iosfwd>
#include <stdexcept>
#include <string>
#include <vector>

#include "gclab/config/config.h"

namespace gclab::train {

// The run stopped on an out-of-memory error after saving the last good state and writing the report;
// what() is the report's short version.
class OutOfMemoryStop : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct TrainOptions {
  bool resume = false;  // continue from the newest save in the output folder (`gclab train` does unless --from-scratch)
  std::ostream* progress = nullptr;                   // progress lines (nullptr: none)
  bool progress_in_place = false;                     // a terminal: one line updated with \r
  const std::atomic<bool>* stop_requested = nullptr;  // Ctrl-C: save and stop at the next step boundary
  // Records the allocator's history from the load on and writes it here when the run ends, however it ends
  // (memory/history.h: the pickle PyTorch's memory viewer opens); empty: none.
  std::filesystem::path memory_snapshot;
  // Data parallelism (dist::process_world() of more than one process): how long a collective may wait for the
  // other ranks — a rank sampling or saving alone, a rank that is gone — before the run stops with RankLost.
  std::chrono::seconds dist_timeout{1800};
};

struct TrainSummary {
  std::filesystem::path output_dir;
  int64_t start_step = 0, end_step = 0;
  bool interrupted = false;
  std::vector<double> losses;  // per optimizer step run in this process
  std::vector<std::filesystem::path> samples, saves;
  std::vector<std::string> unusable_images;  // could not be decoded; replaced, not used again
  double total_s = 0, data_wait_s = 0, step_s = 0;
  int64_t peak_bytes = 0;
  int oom_skips = 0;        // batches dropped under train.oom_policy: skip
  int nonfinite_steps = 0;  // steps whose every micro-batch's loss was not finite: no update
};

// Runs the config's training. Throws UserError (data::DataError among them) for an unusable setting or
// data, SaveError when a save cannot be written, OutOfMemoryStop when memory (or the emulated cap) ran
// out. Whatever ends a run early saves its last good state first.
TrainSummary train(const config::ProcessConfig& config, const TrainOptions& options);

// train --dry-run: validates and builds the Session on the meta device (no memory, no data, no steps).
// Returns a one-paragraph description of what a run would hold. Throws as train() does.
std::string dry_run(const config::ProcessConfig& config);

}  // namespace gclab::train
