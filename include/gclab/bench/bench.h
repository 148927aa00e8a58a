// `gclab bench`: checkpoint policies side by side in one process, on the config's model and device —
// for each resolution, batch and policy, a few real training steps (forward, backward, optimizer) on
// synthetic inputs of that shape: median step time and its ratio to GC off, peak memory and its ratio,
// the ledger's predicted activations beside it, and OOM where the cap (or the device) runs out.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "gclab/config/config.h"

namespace gclab::bench {

struct BenchOptions {
  std::vector<std::string> policies = {"off", "full"};
  std::vector<int> batches;      // empty: the config's batch size
  std::vector<int> resolutions;  // empty: the datasets' resolutions
  int steps = 3;                 // timed steps per cell (after one warm-up step)
};

struct BenchRow {
  std::string policy;
  int resolution = 0, batch = 0;
  bool oom = false;
  std::string oom_phase;
  double step_ms = 0;             // median of the timed steps
  int64_t peak_bytes = 0;         // the highest live bytes during a step, above nothing (absolute)
  int64_t predicted_activation_bytes = 0;  // the ledger's, for this policy (full: inputs + one block)
  double time_ratio = 0, peak_ratio = 0;   // to GC off at the same resolution and batch (0 when unknown)
};

std::vector<BenchRow> run_bench(const config::ProcessConfig& config, const BenchOptions& options);
// `gclab fit`: for each resolution and policy, the largest batch (up to max_batch) whose training step
// fits the cap (or the device), found by doubling then bisecting real steps.
struct FitRow {
  std::string policy;
  int resolution = 0;
  int largest_batch = 0;  // 0: not even batch 1 fits
  int64_t peak_bytes = 0;  // at that batch
};
std::vector<FitRow> run_fit(const config::ProcessConfig& config, const std::vector<std::string>& policies,
                            const std::vector<int>& resolutions, int max_batch);

// CSV (one row per cell) and a markdown table.
void write_bench_csv(const std::filesystem::path& path, const std::vector<BenchRow>& rows);
std::string bench_table(const std::vector<BenchRow>& rows);

}  // namespace gclab::bench
