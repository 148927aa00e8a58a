// What each block keeps for its backward, walked on the meta device (model/activations.h: the figures the
// budget policy, the estimate and the bench read), against the same probe forward on the CPU under the
// tracking allocator: every tiny preset, full training and LoRA (with dropout), batch 1 and 2, fp32 and
// bf16, Qwen-Image-Edit-2511's per-token modulation — block by block, byte for byte.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "../support/test_util.h"
#include "gclab/memory/meta_count.h"
#include "gclab/memory/tracker.h"
#include "gclab/model/lora.h"
#include "gclab/model/registry.h"
#include "gclab/train/checkpointing.h"

namespace gclab::train {
namespace {

struct Probed {
  ModelCheckpointing::BlockProbe blocks;
  std::vector<std::string> names;
};

// One forward of `spec` on `device` (the CPU measured, or the meta device counted), as a run's probe makes
// it: LoRA adapters in float32 on the frozen base, an edit model's one control image.
Probed probe(const model::ModelSpec& spec, bool lora, int batch, torch::ScalarType dtype, double dropout,
             torch::Device device) {
  torch::manual_seed(0);
  std::optional<memory::CpuMemoryTracker> tracker;
  if (device.is_cpu()) tracker.emplace();
  const auto options = torch::TensorOptions().device(device);
  auto m = model::build_transformer(spec, options);
  m->to(dtype);
  if (lora) model::apply_lora(*m, {4, 4.0, dropout});
  model::ModelInputs in =
      m->example_inputs({batch, 1, 128, 96}, model::step_tokens(spec, {1, 1, 128, 96}).text, options.dtype(dtype));
  if (spec.reference_tokens) {
    const auto [w, h] = model::training_reference_size(spec, 96, 128);
    in.reference_latents.push_back(torch::randn(model::latent_shape(spec, {batch, 1, h, w}), options.dtype(dtype)));
  }
  ModelCheckpointing checkpointing(*m);
  Probed p;
  p.names = m->block_names();
  if (device.is_meta()) {
    memory::MetaCount count;
    p.blocks = checkpointing.probe_blocks(in, [&] { return count.live(); });
  } else {
    memory::MemoryMeter meter(torch::kCPU);
    p.blocks = checkpointing.probe_blocks(in, [&] { return meter.stats().live_bytes; });
  }
  return p;
}

void expect_walk_matches(const model::ModelSpec& spec, bool lora, int batch, torch::ScalarType dtype,
                         double dropout = 0.0) {
  const Probed cpu = probe(spec, lora, batch, dtype, dropout, torch::kCPU);
  const Probed walked = probe(spec, lora, batch, dtype, dropout, torch::kMeta);
  const std::string what = spec.preset + (lora ? " LoRA" : " full") + " batch " + std::to_string(batch) + " " +
                           c10::toString(dtype) + (dropout > 0 ? " dropout" : "");
  ASSERT_EQ(walked.blocks.kept_bytes.size(), cpu.blocks.kept_bytes.size()) << what;
  // Every block keeps something, but under LoRA one without adapters fed by frozen modules only (Z-Image's
  // refiners: AI Toolkit puts adapters on its `layers` alone), which needs no gradient.
  EXPECT_GT(cpu.blocks.kept_bytes.back(), 0) << what;
  for (size_t i = 0; i < cpu.blocks.kept_bytes.size(); ++i) {
    EXPECT_EQ(walked.blocks.kept_bytes[i], cpu.blocks.kept_bytes[i]) << what << " " << cpu.names[i];
    EXPECT_EQ(walked.blocks.input_bytes[i], cpu.blocks.input_bytes[i]) << what << " " << cpu.names[i];
  }
}

class BlockWalk : public ::testing::TestWithParam<std::tuple<std::string, bool, int>> {};

TEST_P(BlockWalk, EachBlockKeepsWhatTheTrackingAllocatorCounts) {
  const auto& [preset, lora, batch] = GetParam();
  expect_walk_matches(model::spec_by_preset(preset), lora, batch, torch::kFloat);
}

// A bf16 model (weights and activations in bf16, as AI Toolkit loads these models, no autocast): the float32
// internals (RMSNorm's copy, statistics, log-sum-exp) and, with LoRA, the float32 adapters' own copies of
// their inputs.
TEST_P(BlockWalk, EachBlockKeepsWhatTheTrackingAllocatorCountsInBf16) {
  const auto& [preset, lora, batch] = GetParam();
  expect_walk_matches(model::spec_by_preset(preset), lora, batch, torch::kBFloat16);
}

// LoRA dropout acts on lora_A's rank-sized output (AI Toolkit's LoRAModule.forward): its mask is kept.
TEST(BlockWalkDropout, TheMaskIsCounted) {
  for (const char* preset : {"tiny-flux", "tiny-qwen-image", "tiny-zimage", "tiny-sd3", "tiny-dit", "tiny-wan21"}) {
    expect_walk_matches(model::spec_by_preset(preset), /*lora=*/true, 2, torch::kFloat, /*dropout=*/0.25);
    expect_walk_matches(model::spec_by_preset(preset), /*lora=*/true, 1, torch::kBFloat16, /*dropout=*/0.25);
  }
}

// Qwen-Image-Edit-2511 (zero_cond_t): the reference tokens are modulated by the embedding of t = 0, so each
// sub-block's image-stream scale and gate are chosen per token and kept for backward.
TEST(BlockWalkZeroCond, PerTokenModulationIsCounted) {
  model::ModelSpec spec = model::spec_by_preset("tiny-qwen-image-edit");
  spec.zero_cond_t = true;
  for (const bool lora : {false, true})
    for (const int batch : {1, 2}) {
      expect_walk_matches(spec, lora, batch, torch::kFloat);
      expect_walk_matches(spec, lora, batch, torch::kBFloat16);
    }
}

INSTANTIATE_TEST_SUITE_P(TinyPresets, BlockWalk,
                         ::testing::Combine(::testing::Values("tiny-flux", "tiny-qwen-image", "tiny-qwen-image-edit",
                                                              "tiny-zimage", "tiny-sd3", "tiny-dit", "tiny-wan21",
                                                              "tiny-flux-kontext", "tiny-chroma", "tiny-flux2-klein"),
                                            ::testing::Bool(), ::testing::Values(1, 2)),
                         [](const auto& info) {
                           return gclab::testing::test_name(std::get<0>(info.param) +
                                                            (std::get<1>(info.param) ? "_lora" : "_full") + "_batch" +
                                                            std::to_string(std::get<2>(info.param)));
                         });

}  // namespace
}  // namespace gclab::train
