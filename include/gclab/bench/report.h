// What the CLI prints, as YAML a tool can parse (tables for people ride along as comments): the model a
// config selects (`gclab check`), its datasets' buckets, the memory estimate (`gclab estimate`), bench's
// and fit's rows. `--json` prints the same content as JSON, converted from that YAML (yaml_to_json).
#pragma once

#include <string>
#include <vector>

#include "gclab/bench/bench.h"
#include "gclab/bench/estimate.h"
#include "gclab/model/summary.h"

namespace gclab::bench {

std::string format_model_summary(const model::ModelSummary& summary);
// Where each dataset's images land, per resolution, from image headers alone (no decoding).
// The autoencoder the config selects (train::codec_plan): its weights, whether it stays on the device, and
// its predicted encode peak per training resolution and decode peak at the preview size.
std::string format_autoencoder(const config::ProcessConfig& config);
// The text encoders the config's family conditions on (model::text_encoders), built on the meta device (the
// shape from name_or_path's text_encoder*/ config.json when local): parameters and weight bytes in the
// training dtype (or float8 Linear weights with quantize_te), and whether they stay on the device.
std::string format_text_encoders(const config::ProcessConfig& config);
std::string format_bucket_histograms(const config::ProcessConfig& config);
// The load (LoadEstimate): where the transformer is quantized and the peaks on each side; `cap_bytes` > 0
// adds the verdict. `check` prints it at the top level, `estimate` inside its document.
std::string format_load(const LoadEstimate& load, int64_t cap_bytes, const std::string& indent = "");
std::string format_estimate(const MemoryEstimate& estimate);
// fit's rows: `fit:` a list of {resolution, policy, largest_batch, peak_bytes}, the table as comments.
std::string format_fit(const std::vector<FitRow>& rows);
// bench's rows: `bench:` a list of every cell's figures, bench_table() as comments.
std::string format_bench(const std::vector<BenchRow>& rows);
// The YAML documents above as JSON (numbers and booleans typed, comments dropped). Throws UserError when
// the text is not YAML.
std::string yaml_to_json(const std::string& yaml);

}  // namespace gclab::bench
