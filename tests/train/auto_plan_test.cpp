// checkpoint_policy: auto (train/predict.h, AutoPlan): the plan the memory model chooses, run under the cap
// it was chosen for on the CPU's exact accounting. The FLOPs it weighs (memory/flops.h) are counted where
// the ops run.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <nlohmann/json.hpp>
#include <random>

#include "../support/step_peak.h"
#include "../support/test_util.h"
#include "../support/tiny_run.h"
#include "gclab/bench/bench.h"
#include "gclab/bench/run_report.h"
#include "gclab/ckpt/checkpoint.h"
#include "gclab/memory/flops.h"
#include "gclab/nn/layers.h"
#include "gclab/nn/meta_kernels.h"
#include "gclab/train/knapsack.h"
#include "gclab/train/predict.h"
#include "gclab/train/session.h"
#include "gclab/train/trainer.h"

namespace gclab::train {
namespace {

namespace fs = std::filesystem;

// The knapsack auto chooses with against every combination (5 positions of 1 to 4 options, 300 random
// cases): the least cost whose savings, floored to the knapsack's units of need / 4096, reach the need — and
// the savings chosen really total the need.
TEST(Knapsack, TheCheapestSavingIsEveryCombinationsCheapest) {
  std::mt19937_64 rng(7);
  for (int trial = 0; trial < 300; ++trial) {
    std::vector<std::vector<SavingCost>> options(5);
    int64_t most = 0;
    for (auto& position : options) {
      position.push_back({0, 0});  // none: saves nothing, costs nothing
      int64_t largest = 0;
      for (int o = 1 + static_cast<int>(rng() % 4); o > 1; --o) {
        position.push_back({static_cast<int64_t>(rng() % 1000000), static_cast<double>(rng() % 1000)});
        largest = std::max(largest, position.back().saving);
      }
      most += largest;
    }
    const int64_t need = static_cast<int64_t>(rng() % static_cast<uint64_t>(most + most / 4 + 1));
    const int64_t unit = std::max<int64_t>(1, need / 4096), target = (need + unit - 1) / unit;
    double best = std::numeric_limits<double>::infinity();
    std::vector<size_t> pick(5, 0);
    for (;;) {  // every combination
      int64_t units = 0;
      double cost = 0;
      for (size_t i = 0; i < 5; ++i) units += options[i][pick[i]].saving / unit, cost += options[i][pick[i]].cost;
      if (units >= target) best = std::min(best, cost);
      size_t i = 0;
      while (i < 5 && ++pick[i] == options[i].size()) pick[i++] = 0;
      if (i == 5) break;
    }
    const std::optional<std::vector<size_t>> chosen = cheapest_saving(options, need);
    SCOPED_TRACE("trial " + std::to_string(trial) + ", need " + std::to_string(need));
    ASSERT_EQ(chosen.has_value(), best < std::numeric_limits<double>::infinity());
    if (!chosen) continue;
    double cost = 0;
    int64_t saving = 0;
    for (size_t i = 0; i < 5; ++i) cost += options[i][(*chosen)[i]].cost, saving += options[i][(*chosen)[i]].saving;
    EXPECT_DOUBLE_EQ(cost, best);
    EXPECT_GE(saving, need);
  }
}

// A Linear's 2·rows·in·out (its LoRA's rank too), attention's 4·B·H·Sq·Skv·D; what a checkpoint's forward ran
// counted as recomputed.
TEST(FlopCount, CountsLinearsAndAttentionAndWhatACheckpointRecomputes) {
  nn::Linear linear(nn::LinearOptions(8, 16));
  const torch::Tensor x = torch::randn({2, 5, 8});
  memory::FlopCount outer;
  {
    memory::FlopCount inner;
    linear->forward(x);
    EXPECT_EQ(inner.total(), 2.0 * 10 * 8 * 16);
    EXPECT_EQ(inner.recomputed(), 0);
  }
  const torch::Tensor q = torch::randn({2, 3, 7, 4}), k = torch::randn({2, 3, 9, 4});
  {
    memory::FlopCount count;
    nn::attention(q, k, k, torch::Tensor(), std::nullopt);
    EXPECT_EQ(count.total(), 4.0 * 2 * 3 * 7 * 9 * 4);
  }
  memory::FlopCount checkpointed;
  const torch::Tensor xg = x.clone().requires_grad_(true);
  ckpt::checkpoint(
      [&](const std::vector<torch::Tensor>& in) { return std::vector<torch::Tensor>{linear->forward(in[0])}; }, {xg},
      {linear->weight})[0]
      .sum()
      .backward();
  EXPECT_EQ(checkpointed.recomputed(), 2.0 * 10 * 8 * 16);  // the forward's, not the backward's recompute
  EXPECT_EQ(checkpointed.total(), 2 * 2.0 * 10 * 8 * 16);   // the forward and the recompute
  EXPECT_EQ(outer.total(), 2.0 * 10 * 8 * 16 * 3 + 4.0 * 2 * 3 * 7 * 9 * 4);  // nested counts see everything
}

// A run at 256² (batch 2) of six 256² images, so that the blocks' activations weigh against the weights.
config::ProcessConfig auto_config(const fs::path& dir, const std::string& preset, std::vector<std::string> extra,
                                  const std::string& name = "auto") {
  if (!fs::exists(dir / "data")) {
    data::SynthOptions o;
    o.count = 6;
    o.sizes = {{256, 256}};
    data::write_synthetic_dataset(dir / "data", o);
  }
  // The DCT stand-in codec: no autoencoder's encode outweighs the steps (Qwen-Image's and Wan's 3D VAEs
  // encoding one 256² image hold several times a tiny transformer's step), so the plans differ.
  extra.insert(extra.begin(),
               {"model.arch=" + preset, "datasets[0].resolution=[256]", "model.vae=dct", "train.steps=2"});
  return testing::tiny_config(dir, name, std::move(extra));
}

// A run's highest phase predicted for a step: step 1's (no optimizer state yet) and step 2's, and the rest.
int64_t highest(const MemoryModel& model, const StepEstimate& s) { return model.run_peak(s); }

config::ProcessConfig capped(config::ProcessConfig c, int64_t cap) {
  c.vram_cap.bytes = cap;
  return c;
}

// Caps 25%, 50% and 75% of the way from full's peak to GC off's, and one with room for GC off: each run's
// two steps (the second with the optimizer's state) stay under the cap the CPU tracker enforces, each plan
// recomputes no more than full (less at 75%) and no more than the tighter cap's plan, and with room auto is
// GC off.
class AutoPlanSweep : public ::testing::TestWithParam<const char*> {};

TEST_P(AutoPlanSweep, EveryCapsStepsFitAndThePlanRecomputesLessThanFull) {
  const fs::path dir = testing::fresh_dir(std::string("auto_sweep_") + GetParam());
  const config::ProcessConfig base = auto_config(dir, GetParam(), {"train.checkpoint_policy=auto:2%"});
  const MemoryModel uncapped(base);
  ASSERT_TRUE(uncapped.estimate().auto_plan);
  EXPECT_EQ(uncapped.estimate().auto_plan->chosen.kind, ckpt::CheckpointPolicy::Kind::Off);  // no cap
  ASSERT_EQ(uncapped.estimate().resolutions.size(), 1u);
  const ResolutionEstimate& cell = uncapped.estimate().resolutions[0];
  const int64_t off = highest(uncapped, cell.gc_off), full = highest(uncapped, cell.gc_full);
  EXPECT_EQ(off, uncapped.estimate().auto_plan->off_peak_bytes);
  ASSERT_GT(off, full + full / 10) << "the activations weigh too little here to choose among plans";
  double tighter = std::numeric_limits<double>::infinity();
  for (const double at : {0.25, 0.5, 0.75, -1.0}) {
    const int64_t cap = at < 0 ? static_cast<int64_t>(static_cast<double>(off) / 0.97)
                               : full + static_cast<int64_t>(at * static_cast<double>(off - full));
    SCOPED_TRACE("cap " + std::to_string(cap) + " (" + std::to_string(at) + " of the way from full to off)");
    const config::ProcessConfig c = capped(base, cap);
    const MemoryModel predicted(c);
    const AutoPlan& plan = *predicted.estimate().auto_plan;
    EXPECT_TRUE(plan.fits) << plan.why;
    EXPECT_EQ(plan.cap_bytes, cap);
    EXPECT_EQ(plan.cap_source, "vram_cap");
    EXPECT_LE(plan.peak_bytes, cap - plan.margin_bytes);
    EXPECT_EQ(predicted.policy().to_string(), plan.chosen.to_string());
    Session session(c);
    EXPECT_EQ(session.applied_policy().to_string(), plan.chosen.to_string());
    int64_t measured = 0;
    ASSERT_NO_THROW(measured = testing::synthetic_step_peak(session, 2, 2, 256)) << plan.chosen.to_string();
    EXPECT_LE(measured, cap) << plan.chosen.to_string();
    if (at < 0) {
      EXPECT_EQ(plan.chosen.kind, ckpt::CheckpointPolicy::Kind::Off);
      EXPECT_EQ(plan.recomputed_flops, 0);
      EXPECT_EQ(plan.recompute_cost, 0);
    } else {
      // The cost auto minimises (FLOPs and the recompute's writes, model::recompute_cost): never above full's,
      // never above a tighter cap's plan.
      EXPECT_NE(plan.chosen.kind, ckpt::CheckpointPolicy::Kind::Off);
      EXPECT_LE(plan.recomputed_flops, plan.full_recomputed_flops) << plan.chosen.to_string();
      EXPECT_LE(plan.recompute_cost, plan.full_recompute_cost * (1 + 1e-12)) << plan.chosen.to_string();
      EXPECT_LE(plan.recompute_cost, tighter * (1 + 1e-12)) << plan.chosen.to_string();
      // Three quarters of the way to GC off, some block keeps its graph (or recomputes a part only).
      if (at > 0.7) {
        EXPECT_LT(plan.recompute_cost, plan.full_recompute_cost) << plan.chosen.to_string();
      }
    }
    tighter = plan.recompute_cost;
  }
  fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(TinyPresets, AutoPlanSweep,
                         ::testing::Values("tiny-flux", "tiny-qwen-image", "tiny-zimage", "tiny-sd3"),
                         [](const auto& info) {
                           std::string name = info.param;
                           std::replace(name.begin(), name.end(), '-', '_');
                           return name;
                         });

// Under a cap that makes auto mix modes, a run trains as GC off does (the same losses, bit for bit), and its
// memory.json says what was asked, what was applied and why.
TEST(AutoPlan, ARunUnderItTrainsAsCheckpointingOffAndSaysItsPlan) {
  const fs::path dir = testing::fresh_dir("auto_parity");
  const config::ProcessConfig base = auto_config(dir, "tiny-flux", {"train.steps=3"}, "off");
  const MemoryModel uncapped(capped(base, 0));
  const ResolutionEstimate& cell = uncapped.estimate().resolutions.at(0);
  const int64_t off = highest(uncapped, cell.gc_off), full = highest(uncapped, cell.gc_full);
  config::ProcessConfig automatic = capped(base, full + (off - full) / 2);
  automatic.name = "auto";
  automatic.train.checkpoint_policy = ckpt::CheckpointPolicy::parse("auto:2%");
  config::ProcessConfig none = base;
  none.train.checkpoint_policy = ckpt::CheckpointPolicy::off();
  const TrainSummary with_auto = train(automatic, {});
  const TrainSummary without = train(none, {});
  testing::expect_same_losses(with_auto.losses, without.losses, 3);
  const nlohmann::json memory = nlohmann::json::parse(std::ifstream(with_auto.output_dir / "memory.json"));
  EXPECT_EQ(memory.at("checkpoint_policy"), "auto:2%");
  const std::string applied = memory.at("applied_policy");
  EXPECT_EQ(applied.rfind("modes:[", 0), 0u) << applied;  // a mix, at half the way
  EXPECT_EQ(memory.at("auto_plan").at("chosen"), applied);
  EXPECT_TRUE(memory.at("auto_plan").at("fits").get<bool>());
  EXPECT_LE(memory.at("peak_bytes").get<int64_t>(), automatic.vram_cap.bytes);
  // report.html says it too: what was applied, and why.
  std::ifstream page(bench::write_run_report(with_auto.output_dir));
  const std::string html((std::istreambuf_iterator<char>(page)), std::istreambuf_iterator<char>());
  EXPECT_NE(html.find("<th>applied</th><td>" + applied + "</td>"), std::string::npos);
  EXPECT_NE(html.find("auto&#39;s plan"), std::string::npos);
  fs::remove_all(dir);
}

// fit on a run whose own policy is auto: off and full run at every batch fit tries (no auto plan to foresee
// them), auto is decided at each, and the run's own plan is applied again afterwards.
TEST(AutoPlan, FitOnARunUnderAutoDecidesAtEachBatch) {
  const fs::path dir = testing::fresh_dir("auto_fit");
  const config::ProcessConfig config =
      capped(auto_config(dir, "tiny-flux", {"train.checkpoint_policy=auto:2%"}), int64_t{30} << 20);
  const MemoryModel predicted(config);
  Session session(config);
  const auto rows = bench::run_fit(
      session,
      {ckpt::CheckpointPolicy::off(), ckpt::CheckpointPolicy::full(), ckpt::CheckpointPolicy::parse("auto:2%")}, {256},
      8);
  ASSERT_EQ(rows.size(), 3u);
  for (const auto& row : rows) EXPECT_GE(row.largest, 1) << row.policy;
  EXPECT_GT(rows[1].largest, rows[0].largest);
  EXPECT_GE(rows[2].largest, rows[0].largest);
  EXPECT_EQ(session.applied_policy().to_string(), predicted.policy().to_string());
  fs::remove_all(dir);
}

// gradient_checkpointing: auto reads as checkpoint_policy auto; no cap is GC off; a cap nothing fits is said
// (the least memory applied), naming the phase no policy changes.
TEST(AutoPlan, GradientCheckpointingAutoAndCapsNothingFits) {
  const fs::path dir = testing::fresh_dir("auto_edges");
  const config::ProcessConfig base = auto_config(dir, "tiny-flux", {"train.gradient_checkpointing=auto"});
  EXPECT_EQ(base.train.policy().kind, ckpt::CheckpointPolicy::Kind::Auto);
  EXPECT_TRUE(base.train.gradient_checkpointing);
  const MemoryModel uncapped(base);
  EXPECT_EQ(uncapped.estimate().auto_plan->why.find("no cap"), 0u) << uncapped.estimate().auto_plan->why;
  const ResolutionEstimate& cell = uncapped.estimate().resolutions.at(0);
  const int64_t full = highest(uncapped, cell.gc_full);
  const MemoryModel tight(capped(base, full * 9 / 10));
  const AutoPlan& plan = *tight.estimate().auto_plan;
  EXPECT_FALSE(plan.fits);
  EXPECT_EQ(plan.why.rfind("no plan fits", 0), 0u) << plan.why;
  EXPECT_LE(plan.peak_bytes, full);  // the least memory: every block's largest saving
  EXPECT_NE(describe_auto_plan(plan).find("does not fit"), std::string::npos);
  const MemoryModel hopeless(capped(base, uncapped.estimate().load.device_peak_bytes / 2));
  EXPECT_NE(hopeless.estimate().auto_plan->why.find("whatever the blocks do"), std::string::npos)
      << hopeless.estimate().auto_plan->why;
  // A step larger than every cell the plan was made for is refused by name.
  Session session(capped(base, full * 2));
  StepResult r;
  r.batch = 2, r.frames = 1, r.width = 256, r.height = 256, r.bucket = "256x256";
  EXPECT_NO_THROW(session.check_foreseen(r));
  r.width = 512, r.bucket = "512x256";
  try {
    session.check_foreseen(r);
    ADD_FAILURE() << "a bucket the plan did not foresee ran";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("512x256"), std::string::npos) << e.what();
  }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace gclab::train
