// What the CLI prints, as YAML a tool can parse: the model a config selects (`gclab check`), its datasets'
// buckets, the memory estimate (`gclab estimate`), and fit's table.
#pragma once

#include <string>
#include <vector>

#include "gclab/bench/bench.h"
#include "gclab/bench/estimate.h"
#include "gclab/model/summary.h"

namespace gclab::bench {

std::string format_model_summary(const model::ModelSummary& summary);
// Where each dataset's images land, per resolution, from image headers alone (no decoding).
std::string format_bucket_histograms(const config::ProcessConfig& config);
std::string format_estimate(const MemoryEstimate& estimate);
std::string fit_table(const std::vector<FitRow>& rows);

}  // namespace gclab::bench
