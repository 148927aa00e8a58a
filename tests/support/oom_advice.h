// The OOM report's advice for the shared tiny run (tiny_run.h) as if its step ran out of memory in the
// backward of a 64x64 batch of 2 with 1 GiB live: the first fix whose title is one of `titles`.
#pragma once

#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "gclab/model/activations.h"
#include "gclab/train/oom_report.h"
#include "gclab/train/session.h"
#include "tiny_run.h"

namespace gclab::testing {

inline std::optional<train::OomFix> backward_oom_fix(const std::filesystem::path& dir, std::vector<std::string> extra,
                                                     const std::vector<std::string>& titles) {
  const auto config = tiny_config(dir, "a", std::move(extra));
  const model::ModelSpec spec = model::spec_for(config.model);
  train::OomContext ctx;
  ctx.phase = train::Phase::backward, ctx.bucket = "64x64", ctx.batch = 2, ctx.cpu = true;
  ctx.live_bytes = 1 << 30;
  for (const auto& f : train::recommend_fixes(ctx, config, spec, train::codec_plan(config, spec),
                                              model::activation_options(config, false)))
    for (const auto& t : titles)
      if (f.title == t) return f;
  return std::nullopt;
}

}  // namespace gclab::testing
