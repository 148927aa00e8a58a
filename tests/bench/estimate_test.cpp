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
