// A base stored as AI Toolkit's uint2..uint7 (model.quantize with model.qtype uintN): the packed weights
// are what the run holds (the formula's bytes), a LoRA trains on them with the same losses with
// checkpointing on and off, and the activation ledger counts the dequantized weights autograd keeps for
// a block that is not checkpointed — measured against the tracking allocator.
#include <gtest/gtest.h>

#include "../support/test_util.h"
#include "../support/tiny_run.h"
#include "gclab/model/lora.h"
#include "gclab/quant/uintx.h"
#include "gclab/train/oom_report.h"
#include "gclab/train/session.h"
#include "gclab/train/trainer.h"

namespace gclab::train {
namespace {

namespace fs = std::filesystem;
using gclab::testing::tiny_config;

TEST(QuantizedBase, Uint4WeightsAreThePackedBytesAndTheLoraTrainsAlikeWithCheckpointingOnAndOff) {
  const fs::path dir = testing::fresh_dir("quantized_uint4");
  const std::vector<std::string> uint4 = {"model.quantize=true", "model.qtype=uint4", "train.steps=4"};
  int64_t plain = 0, packed = 0, expected_saving = 0, quantized = 0;
  {
    Session s(tiny_config(dir, "plain", {"train.steps=4"}));
    plain = s.resident().weights;
  }
  {
    Session s(tiny_config(dir, "q", uint4));
    packed = s.resident().weights;
    // Every uint4 Linear holds the formula's bytes in place of its float32 weight (the base is float32 here).
    for (auto& [path, linear] : nn::named_linears(s.model()))
      if (nn::uintx_bits(linear->weight_storage()) == 4) {
        ++quantized;
        expected_saving += 4 * linear->out_features() * linear->in_features() -
                           quant::uintx_bytes(linear->out_features(), linear->in_features(), 4, 4);
      }
  }
  EXPECT_GT(quantized, 10);
  EXPECT_EQ(plain - packed, expected_saving);

  const auto on = train(tiny_config(dir, "on", uint4), {});
  const auto off = train(
      tiny_config(dir, "off",
                  {"model.quantize=true", "model.qtype=uint4", "train.steps=4", "train.gradient_checkpointing=false"}),
      {});
  ASSERT_EQ(on.losses.size(), 4u);
  ASSERT_EQ(off.losses.size(), 4u);
  for (size_t i = 0; i < on.losses.size(); ++i) {
    EXPECT_TRUE(std::isfinite(on.losses[i]));
    EXPECT_EQ(on.losses[i], off.losses[i]) << "step " << i + 1;
  }
  fs::remove_all(dir);
}

TEST(QuantizedBase, TheLedgerCountsTheDequantizedWeightsAutogradKeeps) {
  const fs::path dir = testing::fresh_dir("quantized_ledger");
  Session plain(tiny_config(dir, "plain"));
  Session q(tiny_config(dir, "q", {"model.quantize=true", "model.qtype=uint3"}));
  const auto weights = model::dequantized_weight_bytes(q.model(), /*conditioning_grad=*/false);
  ASSERT_EQ(weights.size(), q.model().blocks().size());
  int64_t dequantized = 0;
  for (int64_t w : weights) dequantized += w;
  EXPECT_GT(dequantized, 0);
  const auto [measured_plain, ledger_plain] = plain.probe_block_activations();
  const auto [measured, ledger] = q.probe_block_activations();
  EXPECT_EQ(ledger - ledger_plain, dequantized);
  // Measured with nothing checkpointed: the blocks keep the dequantized weights beside their activations.
  EXPECT_GT(measured - measured_plain, dequantized * 9 / 10);
  EXPECT_NEAR(static_cast<double>(measured) / static_cast<double>(ledger), 1.0, 1e-3) << measured << " " << ledger;
  fs::remove_all(dir);
}

// The OOM report's storage lever, priced from meta builds: an unquantized base gets qfloat8; a fully
// checkpointed qfloat8 run gets uint4, a uint3 one uint2, each saving exactly the stored bytes it drops;
// with checkpointing off no bit step is offered (the dequantized copies would eat it).
TEST(QuantizedBase, TheOomAdviceOffersTheNextStorageStepWithItsExactSaving) {
  const fs::path dir = testing::fresh_dir("quantized_advice");
  auto advice = [&](std::vector<std::string> extra) -> std::optional<OomFix> {
    const auto config = tiny_config(dir, "a", std::move(extra));
    const model::ModelSpec spec = model::spec_for(config.model);
    OomContext ctx;
    ctx.phase = Phase::backward, ctx.bucket = "64x64", ctx.batch = 2, ctx.cpu = true;
    ctx.live_bytes = 1 << 30;
    for (const auto& f :
         recommend_fixes(ctx, config, spec, codec_plan(config, spec), model::activation_options(config, false)))
      if (f.title == "Quantize the base weights" || f.title == "Store the base in fewer bits") return f;
    return std::nullopt;
  };
  const auto config = tiny_config(dir, "a");
  const auto spec = model::spec_for(config.model);
  const int64_t fp32 = base_weight_bytes(config, spec, std::nullopt);
  const int64_t f8 = base_weight_bytes(config, spec, nn::WeightStorage::Float8PerTensor);
  const int64_t u4 = base_weight_bytes(config, spec, nn::WeightStorage::UInt4);
  const int64_t u2 = base_weight_bytes(config, spec, nn::WeightStorage::UInt2);
  const int64_t u3 = base_weight_bytes(config, spec, nn::WeightStorage::UInt3);
  ASSERT_TRUE(fp32 > f8 && f8 > u4 && u3 > u2);
  const auto plain = advice({});
  ASSERT_TRUE(plain);
  EXPECT_EQ(plain->title, "Quantize the base weights");
  EXPECT_EQ(plain->predicted_saving_bytes, fp32 - f8);
  const auto from_f8 = advice({"model.quantize=true"});
  ASSERT_TRUE(from_f8);
  EXPECT_EQ(from_f8->change, "model.qtype: uint4 (from qfloat8)");
  EXPECT_EQ(from_f8->predicted_saving_bytes, f8 - u4);
  const auto from_u3 = advice({"model.quantize=true", "model.qtype=uint3"});
  ASSERT_TRUE(from_u3);
  EXPECT_EQ(from_u3->predicted_saving_bytes, u3 - u2);
  EXPECT_FALSE(advice({"model.quantize=true", "train.gradient_checkpointing=false"}));
  fs::remove_all(dir);
}

}  // namespace
}  // namespace gclab::train
