// `gclab train`: the whole run, read top to bottom in trainer.cpp — data, model, checkpoint policy,
// optimizer, the step loop with accumulation, previews, saving and resuming, metrics and progress.
#pragma once

#include <atomic>
#include <filesystem>
#include <iosfwd>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include <c10/core/Device.h>

#include "gclab/config/config.h"

namespace gclab::train {

// The run stopped on an out-of-memory error after saving the last good state and writing the report;
// what() is the report's short version.
class OutOfMemoryStop : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct TrainOptions {
  bool resume = false;                           // continue from the newest checkpoint in the output folder
  std::ostream* progress = nullptr;              // progress lines (nullptr: none)
  bool progress_in_place = false;                // a terminal: one line updated with \r
  const std::atomic<bool>* stop_requested = nullptr;  // Ctrl-C: save and stop at the next step boundary
};

struct TrainSummary {
  std::filesystem::path output_dir;
  int64_t start_step = 0, end_step = 0;
  bool interrupted = false;
  std::vector<double> losses;  // per optimizer step run in this process
  std::vector<std::filesystem::path> samples, saves;
  double total_s = 0, data_wait_s = 0, step_s = 0;
  int64_t peak_bytes = 0;
  int oom_skips = 0;  // batches dropped under train.oom_policy: skip
};

// Runs the config's training. Throws std::invalid_argument for an unusable setting, data::DataError for
// unusable data, OutOfMemoryStop when memory (or the emulated cap) ran out (after saving and reporting).
TrainSummary train(const config::ProcessConfig& config, const TrainOptions& options);

// The config's device: "auto" is CUDA when present, else the CPU. Throws std::invalid_argument for a
// CUDA device on a machine without one, or a name LibTorch does not know.
torch::Device resolve_device(const std::string& name);

// The newest "<name>_<step>.state.safetensors" in dir, if any.
std::optional<std::filesystem::path> newest_state(const std::filesystem::path& dir, const std::string& name);

}  // namespace gclab::train
