// Checkpointing applied to the real model families from outside: the loss with every policy is bitwise
// the loss without, and the gradients agree to float32 rounding. Not to the bit: a tensor read in several
// places (the conditioning vector every block reads, a normalised input that feeds a checkpointed and a
// plain sub-block) collects its gradient in another grouping when part of the graph is one node —
// ((g1 + g2) + (g3 + g4)) instead of (((g1 + g2) + g3) + g4). Measured differences are ~1e-7 relative;
// a real fault (a wrong RNG replay, a missed parameter) is orders of magnitude larger.
#include "gclab/train/checkpointing.h"
#include "../support/test_util.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "gclab/memory/meta_count.h"
#include "gclab/memory/tracker.h"
#include "gclab/model/activations.h"
#include "gclab/model/lora.h"
#include "gclab/nn/layers.h"

namespace gclab::train {
namespace {

struct Step {
  torch::Tensor loss;
  std::vector<torch::Tensor> grads;
};

Step step(model::DiffusionTransformer& m, const model::ModelInputs& in) {
  for (auto& p : m.parameters()) p.mutable_grad() = torch::Tensor();
  const torch::Tensor loss = m.forward(in).pow(2).mean();
  loss.backward();
  Step s{loss.detach(), {}};
  for (const auto& p : m.parameters())
    if (p.requires_grad()) s.grads.push_back(p.grad().defined() ? p.grad().clone() : torch::zeros_like(p));
  return s;
}

class CheckpointedFamily : public ::testing::TestWithParam<std::tuple<std::string, bool>> {};

TEST_P(CheckpointedFamily, EveryPolicyGivesTheGradientsOfNoCheckpointing) {
  const auto& [preset, lora] = GetParam();
  torch::manual_seed(1);
  auto m = model::build_transformer(model::spec_by_preset(preset));
  if (lora) {
    model::apply_lora(*m, {4, 4.0, 0.0});
    // lora_B starts at zero; give it values so lora_A's gradient is non-zero too.
    torch::NoGradGuard no_grad;
    for (auto& p : m->named_parameters())
      if (p.key().find("lora_B") != std::string::npos) p.value().normal_(0, 0.02);
  }
  const model::ModelInputs in = m->example_inputs({1, 1, 128, 128});
  ModelCheckpointing ckpt(*m);
  ckpt.apply(ckpt::CheckpointPolicy::parse("off"));
  const Step off = step(*m, in);
  ASSERT_FALSE(off.grads.empty());
  for (const std::string policy : {"full", "every:2", "selective:attn", "selective:mlp", "first:1", "selective:ops"}) {
    ckpt.apply(ckpt::CheckpointPolicy::parse(policy));
    const Step on = step(*m, in);
    EXPECT_TRUE(torch::equal(off.loss, on.loss)) << policy;
    ASSERT_EQ(on.grads.size(), off.grads.size());
    int bitwise = 0;
    for (size_t i = 0; i < on.grads.size(); ++i) {
      const double scale = std::max(off.grads[i].abs().max().item<double>(), 1e-30);
      const double diff = (off.grads[i] - on.grads[i]).abs().max().item<double>();
      EXPECT_LE(diff / scale, 1e-5) << policy << " parameter " << i;
      bitwise += diff == 0.0;
    }
    RecordProperty(policy + "_bitwise_of_" + std::to_string(on.grads.size()), bitwise);
  }
}

INSTANTIATE_TEST_SUITE_P(TinyPresets, CheckpointedFamily,
                         ::testing::Combine(::testing::Values("tiny-flux", "tiny-qwen-image", "tiny-zimage", "tiny-sd3",
                                                              "tiny-dit", "tiny-wan21", "tiny-flux-kontext",
                                                              "tiny-chroma", "tiny-flux2-klein"),
                                            ::testing::Bool()),
                         [](const auto& info) {
                           return gclab::testing::test_name(std::get<0>(info.param) +
                                                            (std::get<1>(info.param) ? "_lora" : "_full"));
                         });

// What each block keeps, probed on the CPU (the tracking allocator) and walked on the meta device (a
// MetaCount) — the walk budget:BYTES is resolved from — is the same to the byte, block by block; the fewest
// blocks that bring the total under the budget are then checkpointed.
TEST(ModelCheckpointing, TheBlocksProbedOnTheCpuAreTheWalksAndABudgetTakesTheFewest) {
  torch::manual_seed(0);
  const model::ModelSpec spec = model::spec_by_preset("tiny-dit");
  memory::CpuMemoryTracker tracker;
  memory::MemoryMeter meter(torch::kCPU);
  auto m = model::build_transformer(spec);
  ModelCheckpointing ckpt(*m);
  ckpt.apply(ckpt::CheckpointPolicy::full());
  const auto everything =
      ckpt.probe_blocks(m->example_inputs({2, 1, 64, 64}), [&] { return meter.stats().live_bytes; });
  EXPECT_EQ(ckpt.wrappers()[0]->mode(), ckpt::BlockMode::Full);  // the modes applied before, again
  const auto meta = torch::TensorOptions().device(torch::kMeta);
  auto walked_model = model::build_transformer(spec, meta);
  ModelCheckpointing walked_ckpt(*walked_model);
  memory::MetaCount count;
  const auto walked =
      walked_ckpt.probe_blocks(walked_model->example_inputs({2, 1, 64, 64}, 0, meta), [&] { return count.live(); });
  EXPECT_EQ(walked.kept_bytes, everything.kept_bytes);
  EXPECT_EQ(walked.input_bytes, everything.input_bytes);
  int64_t total = 0;
  for (auto b : everything.kept_bytes) {
    EXPECT_GT(b, 0);
    total += b;
  }
  const auto pick = [&](int64_t budget) {
    return ckpt::CheckpointPolicy::only_blocks(
        ckpt::select_blocks_for_budget(everything.kept_bytes, everything.input_bytes, budget));
  };
  EXPECT_EQ(pick(0).to_string(), "blocks:[0,1]");
  EXPECT_EQ(pick(total).to_string(), "off");
  const auto one = pick(total - everything.kept_bytes[0] + everything.input_bytes[0]);
  EXPECT_EQ(one.kind, ckpt::CheckpointPolicy::Kind::Blocks);
  EXPECT_EQ(one.blocks.size(), 1u);
}

// selective:ops keeps each block's matmul and attention outputs: less than the block keeps without
// checkpointing, more than full's inputs; its backward runs none of their FLOPs again, only the adapters' (and
// the element-wise ops between them, which write less than full's recompute). What it keeps is measured on the
// CPU and walked on the meta device to the byte.
TEST(ModelCheckpointing, SelectiveOpsKeepsTheMatmulsAndAttentionAndRunsNoneOfThemAgain) {
  // The base's Linears in qfloat8 under the LoRA (AI Toolkit's quantize: true): their outputs kept too.
  const auto quantize = [](model::DiffusionTransformer& model) {
    for (auto& module : model.modules())
      if (auto* linear = dynamic_cast<nn::LinearImpl*>(module.get()))
        linear->set_weight_storage(nn::WeightStorage::QFloat8);
  };
  for (const std::string name : {"tiny-flux", "tiny-qwen-image", "tiny-wan21", "tiny-sd3", "tiny-flux qfloat8"}) {
    SCOPED_TRACE(name);
    const std::string preset = name.substr(0, name.find(' '));
    const bool quantized = name != preset;
    torch::manual_seed(0);
    const model::ModelSpec spec = model::spec_by_preset(preset);
    memory::CpuMemoryTracker tracker;
    memory::MemoryMeter meter(torch::kCPU);
    auto m = model::build_transformer(spec);
    if (quantized) quantize(*m);
    model::apply_lora(*m, {4, 4.0, 0.0});
    ModelCheckpointing ckpt(*m);
    const model::ModelInputs in = m->example_inputs({2, 1, 64, 64});
    const auto live = [&] { return meter.stats().live_bytes; };
    const auto none = ckpt.probe_blocks(in, live, ckpt::BlockMode::None);
    const auto ops = ckpt.probe_blocks(in, live, ckpt::BlockMode::SelectiveOps);
    const auto full = ckpt.probe_blocks(in, live, ckpt::BlockMode::Full);

    const auto meta = torch::TensorOptions().device(torch::kMeta);
    auto walked_model = model::build_transformer(spec, meta);
    if (quantized) quantize(*walked_model);
    model::apply_lora(*walked_model, {4, 4.0, 0.0});
    ModelCheckpointing walked_ckpt(*walked_model);
    memory::MetaCount count;
    const auto walked = walked_ckpt.probe_blocks(
        walked_model->example_inputs({2, 1, 64, 64}, 0, meta), [&] { return count.live(); },
        ckpt::BlockMode::SelectiveOps);
    const auto walked_full = walked_ckpt.probe_blocks(
        walked_model->example_inputs({2, 1, 64, 64}, 0, meta), [&] { return count.live(); }, ckpt::BlockMode::Full);
    int checked = 0;
    for (size_t i = 0; i < ops.kept_bytes.size(); ++i) {
      if (none.kept_bytes[i] == 0) continue;  // a block nothing in which needs a gradient
      ++checked;
      EXPECT_LT(ops.kept_bytes[i], none.kept_bytes[i]) << "block " << i;
      EXPECT_GT(ops.kept_bytes[i], full.kept_bytes[i]) << "block " << i;
      EXPECT_GT(ops.adapter_flops[i], 0) << "block " << i;
      EXPECT_EQ(ops.recomputed_flops[i], ops.adapter_flops[i]) << "block " << i;
      EXPECT_EQ(full.recomputed_flops[i], full.forward_flops[i]) << "block " << i;
      EXPECT_EQ(walked.kept_bytes[i], ops.kept_bytes[i]) << "block " << i;
      EXPECT_EQ(walked.recomputed_flops[i], ops.recomputed_flops[i]) << "block " << i;
      // The walk's measure of the element-wise work run again: some, less than full's.
      EXPECT_GT(walked.recomputed_bytes[i], 0) << "block " << i;
      EXPECT_LT(walked.recomputed_bytes[i], walked_full.recomputed_bytes[i]) << "block " << i;
    }
    EXPECT_GT(checked, 0);
  }
}

TEST(ModelCheckpointing, BudgetPolicyMustBeResolvedFirstAndTheModelIsPlainAfterwards) {
  auto m = model::build_transformer(model::spec_by_preset("tiny-dit"));
  const model::ModelInputs in = m->example_inputs({1, 1, 64, 64});
  const torch::Tensor before = m->forward(in).detach();
  {
    ModelCheckpointing ckpt(*m);
    EXPECT_THROW(ckpt.apply(ckpt::CheckpointPolicy::parse("budget:1GiB")), std::invalid_argument);
    ckpt.apply(ckpt::CheckpointPolicy::parse("full"));
    EXPECT_TRUE(torch::equal(m->forward(in).detach(), before));
  }
  EXPECT_TRUE(torch::equal(m->forward(in).detach(), before));
}

}  // namespace
}  // namespace gclab::train
