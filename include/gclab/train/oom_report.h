// What happened when memory ran out, and what to change: the report gclab writes on an out-of-memory
// error (oom_report.md for people, oom_report.json for tools, a short version in the log). The fixes
// come in the order practice recommends — checkpointing, batch size, the largest bucket, previews,
// quantization, text-embedding caching — with the failing phase's own fix first, each with the saving
// gclab predicts for it.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include <c10/core/Device.h>
#include <c10/util/Exception.h>

#include "gclab/config/config.h"
#include "gclab/train/phase.h"
#include "gclab/train/session.h"
#include "gclab/vae/codec.h"

namespace gclab::train {

struct OomContext {
  int64_t step = 0;  // the step that failed (1-based: the first step is 1)
  Phase phase = Phase::setup;
  Activity activity = Activity::model;  // the autoencoder's encode / decode, when that is what ran out
  std::string bucket;                   // WxH of the batch (or of the preview)
  int batch = 0;
  std::string checkpoint_policy;
  // Data parallelism: which process ran out ("rank 1 of 2", dist::World::name; empty for one process). The
  // figures are that process's: each rank holds its own replica and slice of the batch.
  std::string rank;
  std::string message;  // the allocator's words: the allocation that failed
  std::string device;
  bool cpu = false;  // the device is the CPU (the kernels' temporaries differ from CUDA's)
  int64_t cap_bytes = 0, live_bytes = 0, peak_bytes = 0;
  std::string cap_counts = "allocated";  // what the cap is held against: CUDA "reserved", CPU "allocated"
  int64_t weight_bytes = 0, gradient_bytes = 0, optimizer_bytes = 0, text_encoder_bytes = 0, vae_bytes = 0;
  int64_t image_encoder_bytes = 0;                 // an image-to-video model's (CLIP's, Wan 2.1 I2V)
  std::map<Phase, int64_t> last_step_phase_peaks;  // of the last step that completed
  // The step whose update made the optimizer's state (0: no update yet): from the step after it on, the
  // state sits beside every step's activations.
  int64_t first_update_step = 0;
  int64_t last_good_step = 0;
  std::string saved_weights;  // what was saved before exiting
  // The batches skipped out of memory before this one (train.oom_policy: skip), oldest first.
  struct Skipped {
    int64_t step = 0;
    Phase phase = Phase::forward;
    std::string bucket;
    int batch = 0;
  };
  std::vector<Skipped> skipped;
};

// What every out-of-memory error's context starts from: the config's checkpoint policy and cap, the device
// (and what its cap is held against), the allocator's words.
OomContext oom_context(const config::ProcessConfig& config, const c10::Device& device,
                       const c10::OutOfMemoryError& error);

struct OomFix {
  std::string title;   // "Turn gradient checkpointing on"
  std::string change;  // "train.gradient_checkpointing: true"
  int64_t predicted_saving_bytes = 0;
  std::string basis;  // how the saving was predicted
};

// Each fix priced by re-planning: the failing phase's peak the memory model (train/predict.h) predicts for
// the config as it is and changed, at the failing cell; a fix that saves nothing there is not offered. The
// load's levers likewise from the load's predicted device peak (train/loading.h). `codec`: the run's
// autoencoder, whose decode picks the preview's tile size under the cap.
std::vector<OomFix> recommend_fixes(const OomContext& ctx, const config::ProcessConfig& config,
                                    const vae::CodecSpec& codec);
// The Session a run (train, bench, fit) works in. Out of memory while it loads the model — nothing trained,
// nothing to save — writes the report (phase setup, the load's levers) into output_dir and throws
// OutOfMemoryStop with its short version.
class Session;
Session open_session(const config::ProcessConfig& config, const std::filesystem::path& output_dir,
                     const SessionOptions& options = {});

// Writes oom_report.md and oom_report.json into dir; returns the short version for the log.
std::string write_oom_report(const std::filesystem::path& dir, const OomContext& ctx, const std::vector<OomFix>& fixes);

}  // namespace gclab::train
