// report.html for a training run: one self-contained page (inline SVG and CSS, the previews as data URIs,
// nothing fetched) drawn from what the run wrote in its folder — metrics.jsonl (loss, step time, each
// phase's measured and predicted peak per step), memory.json (the run's phases, predicted beside measured),
// oom_report.json (where it ran out, the first fix), samples/ and config.resolved.yaml. `gclab train` writes
// it when the run ends, out of memory too; `gclab report RUN_DIR` writes it for any run folder.
#pragma once

#include <filesystem>

namespace gclab::bench {

// Writes RUN_DIR/report.html and returns its path. Throws std::runtime_error when RUN_DIR holds no
// metrics.jsonl (not a run folder); a run that stopped before its first step gets a page without charts.
std::filesystem::path write_run_report(const std::filesystem::path& run_dir);

}  // namespace gclab::bench
