// The OOM report's advice for the shared tiny run (tiny_run.h) as if its step ran out of memory in a phase
// (the backward by default) of a 64x64 batch of 2 with 1 GiB live: the first fix whose title is one of
// `titles`.
#pragma once

#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "gclab/train/oom_report.h"
#include "gclab/train/session.h"
#include "tiny_run.h"

namespace gclab::testing {

// As if the step ran out in `phase` after its first update (the optimizer's state made).
inline std::optional<train::OomFix> oom_fix(const std::filesystem::path& dir, std::vector<std::string> extra,
                                            const std::vector<std::string>& titles, train::Phase phase) {
  const auto config = tiny_config(dir, "a", std::move(extra));
  const model::ModelSpec spec = model::spec_for(config.model);
  train::OomContext ctx;
  ctx.phase = phase, ctx.bucket = "64x64", ctx.batch = 2, ctx.cpu = true, ctx.step = 2, ctx.first_update_step = 1;
  ctx.live_bytes = 1 << 30;
  for (const auto& f : train::recommend_fixes(ctx, config, train::codec_plan(config, spec)))
    for (const auto& t : titles)
      if (f.title == t) return f;
  return std::nullopt;
}

inline std::optional<train::OomFix> backward_oom_fix(const std::filesystem::path& dir, std::vector<std::string> extra,
                                                     const std::vector<std::string>& titles) {
  return oom_fix(dir, std::move(extra), titles, train::Phase::backward);
}

}  // namespace gclab::testing
