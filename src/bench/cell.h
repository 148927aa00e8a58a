// One measured cell of bench, fit and advise (bench.cpp): training steps of a synthetic batch under the
// session's applied policy, timed and their peak read, an out-of-memory error caught and named.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "gclab/train/session.h"

namespace gclab::bench {

struct CellResult {
  std::vector<double> step_ms;
  int64_t peak_bytes = 0, reserved_peak_bytes = 0;
  std::optional<std::string> oom_phase;
  // The median of the steps after the first (which warms up).
  double median_ms() const;
};

// What `work` takes, ms: on CUDA by events on the stream (what the GPU spent), on the CPU by the clock.
double time_ms(const train::Session& session, const std::function<void()>& work);

// Runs `steps` training steps on synthetic samples of `shape` (and a preview with `preview`) under the
// session's policy; returns the step times (ms) and the peak, or the phase where memory ran out.
CellResult run_cell(train::Session& session, const model::SampleShape& shape, int steps, bool preview);
// The square cell of `batch` x resolution² at the frames the run's datasets train that resolution at (the
// most of them; a resolution no dataset names: the largest cell's).
inline model::SampleShape square_cell(const train::Session& session, int batch, int resolution) {
  int frames = 0;
  for (const train::StepCell& c : session.plan().cells)
    if (c.resolution == resolution) frames = std::max(frames, c.frames);
  return {batch, frames > 0 ? frames : session.plan().largest.frames, resolution, resolution};
}

}  // namespace gclab::bench
