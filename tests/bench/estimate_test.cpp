#include "gclab/bench/bench.h"
#include "gclab/bench/estimate.h"

#include <gtest/gtest.h>

#include "gclab/config/loader.h"

namespace gclab::bench {
namespace {

config::ProcessConfig flux_24gb(std::vector<std::string> overrides = {}) {
  config::LoadOptions o;
  o.overrides = std::move(overrides);
  auto r = config::load_config_file(std::string(GCLAB_SHARED_DIR) + "/aitk-configs/train_lora_flux_24gb.yaml", o);
  if (!r.ok()) throw std::runtime_error("config refused");
  return *r.config;
}

// AI Toolkit's FLUX.1-dev 24 GB LoRA config: fits a 24 GB card with checkpointing at every resolution it
// trains, and does not without it — the switch this project exists to explain.
TEST(Estimate, FluxLoraOn24GbFitsWithCheckpointingAndNotWithout) {
  const auto e = estimate_memory(flux_24gb({"vram_cap=24GB"}));
  ASSERT_EQ(e.resolutions.size(), 3u);
  for (const auto& r : e.resolutions) {
    EXPECT_LT(r.total_full, e.cap_bytes) << r.resolution;
    EXPECT_GT(r.activations_off, 10 * r.activations_full) << r.resolution;
    EXPECT_EQ(r.total_off, e.fixed_bytes + r.activations_off);
  }
  EXPECT_GT(e.resolutions.back().total_off, e.cap_bytes);
  EXPECT_EQ(e.fixed_bytes, e.weight_bytes + e.trainable_bytes + e.gradient_bytes + e.optimizer_bytes);
}

TEST(Estimate, EightBitStateIsAQuarterOfAdamWsAndQuantizeHalvesTheWeights) {
  const auto eight = estimate_memory(flux_24gb());
  const auto full = estimate_memory(flux_24gb({"train.optimizer=adamw"}));
  EXPECT_NEAR(static_cast<double>(eight.optimizer_bytes) / static_cast<double>(full.optimizer_bytes), 0.25, 0.01);
  const auto bf16 = estimate_memory(flux_24gb({"model.quantize=false"}));
  EXPECT_NEAR(static_cast<double>(eight.weight_bytes) / static_cast<double>(bf16.weight_bytes), 0.5, 0.01);
}

}  // namespace
}  // namespace gclab::bench

namespace gclab::bench {
namespace {

// gclab bench on a tiny model: every cell measured; GC full keeps less than GC off; under a cap the
// cells that do not fit are reported as OOM, not crashed on.
TEST(Bench, PoliciesSideBySideAndOomCellsUnderACap) {
  config::LoadOptions o;
  o.overrides = {"train.batch_size=2"};
  auto r = config::load_config_file(std::string(GCLAB_SOURCE_DIR) + "/configs/quickstart.yaml", o);
  ASSERT_TRUE(r.ok());
  BenchOptions b;
  b.policies = {"off", "full", "every:2"};
  b.resolutions = {256, 512};
  b.steps = 1;
  const auto rows = run_bench(*r.config, b);
  ASSERT_EQ(rows.size(), 6u);
  for (const auto& row : rows) {
    EXPECT_FALSE(row.oom);
    EXPECT_GT(row.step_ms, 0);
  }
  EXPECT_LT(rows[4].peak_bytes, rows[3].peak_bytes);  // 512: full below off
  EXPECT_LT(rows[4].peak_ratio, 1.0);
  auto capped = *r.config;
  capped.vram_cap.bytes = int64_t{100} << 20;
  b.resolutions = {512};
  b.policies = {"off", "full"};
  const auto under_cap = run_bench(capped, b);
  EXPECT_TRUE(under_cap[0].oom);
  EXPECT_FALSE(under_cap[1].oom);
}

}  // namespace
}  // namespace gclab::bench

namespace gclab::bench {
namespace {

// gclab fit: under the same cap, checkpointing fits a larger batch than no checkpointing.
TEST(Fit, CheckpointingFitsALargerBatchUnderTheSameCap) {
  auto r = config::load_config_file(std::string(GCLAB_SOURCE_DIR) + "/configs/quickstart.yaml");
  ASSERT_TRUE(r.ok());
  auto config = *r.config;
  config.vram_cap.bytes = int64_t{80} << 20;
  const auto rows = run_fit(config, {"off", "full"}, {512}, 4);
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_GE(rows[0].largest_batch, 1);
  EXPECT_GT(rows[1].largest_batch, rows[0].largest_batch);
  EXPECT_LE(rows[1].peak_bytes, config.vram_cap.bytes);
}

}  // namespace
}  // namespace gclab::bench
