// What the CLI prints, built as data (bench/document.h) and printed as YAML a tool can parse (with comments
// for people) or, with --json, as JSON: the model a config selects and its parts (`gclab check`), its
// datasets' buckets, the memory estimate (`gclab estimate`), bench's and fit's rows.
#pragma once

#include <string>
#include <vector>

#include "gclab/bench/bench.h"
#include "gclab/bench/document.h"
#include "gclab/model/summary.h"
#include "gclab/train/predict.h"
#include "gclab/train/sharding.h"

namespace gclab::bench {

Document model_summary_report(const model::ModelSummary& summary);
// The autoencoder the config selects (train::codec_plan): its weights, whether it stays on the device, and
// its predicted encode peak per training resolution and decode peak at the preview size.
Document autoencoder_report(const config::ProcessConfig& config);
// The text encoders the config's family conditions on (model::text_encoders), built on the meta device (the
// shape from name_or_path's text_encoder*/ config.json when local): parameters and weight bytes in the
// training dtype (or float8 Linear weights with quantize_te), and whether they stay on the device.
Document text_encoders_report(const config::ProcessConfig& config);
// Where each dataset's images land, per resolution, from image headers alone (no decoding).
Document bucket_report(const config::ProcessConfig& config);
// The load (LoadEstimate): where the transformer is quantized and the peaks on each side; `cap_bytes` > 0
// adds the verdict. `check` prints it at the top level, `estimate` inside its document.
Document load_report(const train::LoadEstimate& load, int64_t cap_bytes);
// Every phase of the run predicted (train/predict.h) for its largest cell under its policy, beside the cap:
// the phases a run's memory.json records measured beside predicted. `check` prints it.
Document phases_report(const train::MemoryModel& model, const config::ProcessConfig& config);
// With more than one process (estimate.world_size: `estimate --world-size N`), a per_rank section: each rank's
// resident bytes and cells' totals under `shard` (train/sharding.h).
Document estimate_report(const train::MemoryEstimate& estimate, train::Shard shard = train::Shard::none);
// fit's rows: `fit:` a list of {resolution, policy, largest_batch, peak_bytes}, the table as comments.
Document fit_report(const std::vector<FitRow>& rows);
// bench's rows: `bench:` a list of every cell's figures, bench_table() as comments.
Document bench_report(const std::vector<BenchRow>& rows);
// The resolved config (config::to_yaml) as data, for `check --json`.
Document config_report(const config::ProcessConfig& config);

}  // namespace gclab::bench
