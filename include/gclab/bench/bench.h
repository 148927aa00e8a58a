// `gclab bench` and `gclab fit` on one Session: the step the config describes (its dtype, optimizer, lr,
// timestep type, accumulation, and everything a run keeps resident), on synthetic batches of each size.
// bench: for each resolution, batch and checkpoint policy, a few real steps — median step time and its
// ratio to GC off, peak memory and its ratio, the walked blocks' activations beside it, OOM where the cap (or the
// device) runs out. fit: the largest batch whose steps (and previews, when sampling is on) fit.
// Policies are switched and sizes changed between cells on the one built model.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "gclab/ckpt/policy.h"
#include "gclab/train/session.h"

namespace gclab::bench {

struct BenchOptions {
  std::vector<ckpt::CheckpointPolicy> policies;  // empty: off, full
  std::vector<int> batches;                      // empty: the config's batch size
  std::vector<int> resolutions;                  // empty: the datasets' resolutions
  int steps = 3;                                 // timed steps per cell (after one warm-up step)
  // Caps auto is timed under, each a row of its own: "25%" is a quarter of the way from full's highest
  // predicted phase to GC off's at the cell, else a size ("20GiB"). Given, the variants take turns: `steps`
  // rounds of one warm-up and one timed step each, the order reversed every other round.
  std::vector<std::string> caps;
  // The bf16 rate MFU is held against, FLOP/s: what a matmul measured on this machine (scripts/gpu/check.sh
  // measures it in the same call); 0: the GPU's data-sheet peak (peak_bf16_flops).
  double peak_flops = 0;
};

struct BenchRow {
  std::string policy;
  std::string cap;        // BenchOptions::caps' entry auto ran under ("" for the run's cap)
  int64_t cap_bytes = 0;  // that cap (0: the run's)
  std::string applied;    // what the policy applied at this cell (auto's plan, a budget's blocks)
  int resolution = 0, batch = 0;
  int frames = 1;  // the run's (its datasets' largest num_frames)
  bool oom = false;
  std::string oom_phase;
  double step_ms = 0;                      // median of the timed steps
  int64_t peak_bytes = 0;                  // the highest live bytes during a step (absolute)
  int64_t reserved_peak_bytes = 0;         // CUDA: the most the caching allocator held (>= peak); CPU: = peak
  int64_t predicted_activation_bytes = 0;  // the walked blocks under this policy (model::activations_under)
  double time_ratio = 0, peak_ratio = 0;   // to GC off at the same resolution and batch (0 when unknown)
  // GC off's cells: the forward alone (its loss, the graph dropped), timed as the step is.
  double forward_ms = 0;
  // The share of full's recomputation the applied policy runs again, in the walked blocks' forward FLOPs
  // (memory/flops.h: selective and auto plans too; 1 for full, 0 for off).
  double recomputed_share = 0;
  // The recomputation's theory: 1 + s · t_fwd / t_step, t_fwd and t_step GC off's at the same cell, s the
  // recomputed share; 0 when GC off did not run here.
  double theory_ratio = 0;
  double model_tflop = 0;  // the step's model FLOPs (step_flops), in TFLOP: recompute not counted
  double mfu = 0;          // model FLOPs / (step time x the bf16 rate: measured, else the data sheet's); CUDA only
  // Data parallelism: the figures are one process's, one of world_size (RunPlan::world) replicas.
  int world_size = 1;
};

// Model FLOPs of one training step whose blocks `est` walked (Session::block_activations): each block's
// forward FLOPs as counted while it ran (BlockBytes::flops, memory/flops.h: every Linear's 2·rows·in·out on
// the rows it was given — a stream's tokens, modulation's one vector a sample — and attention's
// 4·B·H·Sq·Skv·D; adapters left out), forward once, backward once for the inputs and once more for the
// trained weights when every weight is trained (LoRA trains almost nothing). Recomputation is not counted:
// it is the cost MFU should show.
double step_flops(const train::Session& session, const model::ActivationEstimate& est);
// Dense bf16 tensor-core peak of a GPU by name (H100/H200 989 TFLOP/s, A100 312, ...); 0 when unknown.
double peak_bf16_flops(const std::string& gpu_name);

std::vector<BenchRow> run_bench(train::Session& session, const BenchOptions& options);

struct FitRow {
  std::string policy;
  int resolution = 0;
  // What fit grew: "batch" (an image run) or "num_frames" (a run whose family's latents carry frames, at
  // train.batch_size), and the largest value of it whose two training steps (and a preview, when the config
  // samples) ran under the cap; 0: not even the smallest fits.
  std::string lever = "batch";
  int largest = 0;
  int batch = 0;           // the batch at that point
  int64_t peak_bytes = 0;  // at that point
  // The largest the memory model (train/predict.h) predicts under the cap: its steps' peak (the optimizer's
  // state made) and the preview's — for auto, the largest whose plan fits the cap less auto's margin; -1
  // where it does not predict the policy (budget) or there is no cap.
  int predicted = -1;
  int world_size = 1;  // as BenchRow's: one process's figures
};
// For each resolution and policy, the largest batch up to max_batch — or, for a video family, the largest
// num_frames up to max_frames (1 + t·k, the counts its autoencoder takes) at train.batch_size — for which two
// training steps (and a preview, when the config samples) run under the cap: doubling, then bisecting.
std::vector<FitRow> run_fit(train::Session& session, const std::vector<ckpt::CheckpointPolicy>& policies,
                            const std::vector<int>& resolutions, int max_batch, int max_frames = 81);

// The resolutions to use: the given ones, else the datasets', sorted and unique. Throws UserError for one
// that is not a multiple of the model's divisibility.
std::vector<int> resolutions_for(const train::Session& session, std::vector<int> given);

// CSV (one row per cell) and a markdown table.
void write_bench_csv(const std::filesystem::path& path, const std::vector<BenchRow>& rows);
std::string bench_table(const std::vector<BenchRow>& rows);

}  // namespace gclab::bench
