// `gclab advise`: "I want speed — is turning checkpointing off the right first move?" answered on the user's
// own config by measuring the alternatives the seed guide recommends before it: cheaper previews (smaller,
// fewer steps, less often, none), partial checkpoint policies (every:2, selective), a smaller batch with
// gradient accumulation, dropping the top resolution — and GC off itself. Each is timed on real steps of
// synthetic batches at every resolution of the datasets (and the previews as the run would take them), its
// peak read under the cap; the previews are amortised over the run's steps. Ranked by the time a step saves.
#pragma once

#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "gclab/train/session.h"

namespace gclab::bench {

struct AdviseOptions {
  int64_t steps = 0;    // the run's length the previews are amortised over (0: train.steps)
  int timed_steps = 3;  // per cell, after one warm-up step
};

struct Advice {
  std::string change;             // what is tried, in words ("checkpoint policy every:2")
  std::string set;                // the --set overrides that make it ("" for the config as it is)
  double step_ms = 0;             // one optimizer step (accumulation's micro-steps together), averaged over resolutions
  double preview_ms = 0;          // the previews' time per training step (their run total / steps)
  double total_ms = 0;            // step_ms + preview_ms
  double saved_ms = 0;            // the config's total_ms less this one's (> 0: faster)
  int64_t peak_bytes = 0;         // the highest measured, steps and previews
  bool fits = true;               // no out-of-memory error under the cap
  std::string oom_phase;          // where it ran out
  bool changes_training = false;  // trains on something else (a resolution dropped)
  std::string note;               // what it gives up, in words
};

struct AdviseResult {
  std::vector<Advice> rows;  // the config as it is first, then the alternatives ranked by saved_ms
  int64_t cap_bytes = 0;
  int64_t run_steps = 0, previews_per_run = 0;
  std::string first;  // the first thing to try: the fastest alternative that fits and saves time
};

AdviseResult run_advise(train::Session& session, const AdviseOptions& options);
// The result as a Markdown table and the first thing to try.
std::string advise_table(const AdviseResult& result);
// advise.json and advise.html in `dir`; report.html shows advise.json when it is there.
void write_advice(const std::filesystem::path& dir, const AdviseResult& result);
// The advice as an HTML section (a chart of each alternative's step and preview time, the table), from
// advise.json's content.
std::string advice_html(const nlohmann::json& advise);

}  // namespace gclab::bench
