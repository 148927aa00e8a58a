// The HTML pages `gclab bench` and `gclab fit` write beside their CSV / YAML (one self-contained page each,
// charts from bench/svg.h): bench — peak memory against batch per policy with the cap drawn, each policy's
// step time relative to GC off, and the memory / time trade-off of every cell with its Pareto front; fit —
// the largest batch per resolution and policy under the cap, as a table and a chart.
#pragma once

#include <cstdint>
#include <filesystem>
#include <vector>

#include "gclab/bench/bench.h"

namespace gclab::bench {

void write_bench_page(const std::filesystem::path& path, const std::vector<BenchRow>& rows, int64_t cap_bytes);
void write_fit_page(const std::filesystem::path& path, const std::vector<FitRow>& rows, int64_t cap_bytes);

// The cells no other cell beats on both peak memory and step time per sample (those that ran): the
// policies and batches worth choosing between.
std::vector<BenchRow> pareto_front(const std::vector<BenchRow>& rows);

}  // namespace gclab::bench
