// The peak a session's training steps reach: the meter's peak or any phase's, whichever is higher, over
// `steps` steps of synthetic batches (batch x side x side), the phases cleared after each; `text_tokens`, when
// given, receives the last step's text length (what a run's own prediction is made for).
#pragma once

#include <algorithm>
#include <cstdint>

#include "gclab/train/session.h"

namespace gclab::testing {

// What a run does before training when its text encoders leave (cache_text_embeddings): the synthetic
// batches' caption ("a photo", or the first sample prompt) encoded and the encoders unloaded.
inline void cache_text_as_a_run_does(train::Session& session) {
  if (!session.plan().text_encoder_leaves) return;
  std::vector<std::string> captions = {"a photo"};
  const auto& sample = session.config().sample;
  if (sample && !sample->samples.empty()) captions.push_back(sample->samples.front().prompt);
  session.precompute_text(captions);
}

inline int64_t synthetic_step_peak(train::Session& session, int steps, int batch, int side,
                                   int64_t* text_tokens = nullptr) {
  int64_t peak = 0;
  for (int step = 0; step < steps; ++step) {
    session.meter().reset_peak();
    const train::StepResult r = session.train_step(step, [&] {
      return session.synthetic_batch({batch, 1, side, side});
    });
    if (text_tokens) *text_tokens = r.text_tokens;
    peak = std::max(peak, session.meter().stats().peak_bytes);
    for (const auto& [phase, bytes] : session.phases().peaks()) peak = std::max(peak, bytes);
    session.phases().clear();
  }
  return peak;
}

}  // namespace gclab::testing
