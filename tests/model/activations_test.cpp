// The activation ledger (model/activations.cpp), computed from shapes, against the tracking allocator:
// every tiny preset's every block kind, full training and LoRA, batch 1 and 2, byte for byte (fp32).
#include "gclab/model/activations.h"
#include "../support/test_util.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "../support/measure_blocks.h"
#include "gclab/model/lora.h"

namespace gclab::model {
namespace {

void expect_ledger_matches(const ModelSpec& spec, bool lora, int batch, torch::ScalarType dtype, double dropout) {
  const std::string& preset = spec.preset;
  torch::manual_seed(0);
  auto m = build_transformer(spec);
  m->to(dtype);
  if (lora) apply_lora(*m, {4, 4.0, dropout});  // float32 adapters on the base, as a run attaches them
  const int64_t text = spec.family == model::Family("zimage") ? 32 : text_tokens(spec, 16);
  ModelInputs in = m->example_inputs(batch, 128, 96, text, torch::TensorOptions().dtype(dtype));
  // Edit models: one reference latent as the ledger counts it (spec.h reference_tokens): Qwen-Image-Edit's
  // the image's size, the Plus models' a square of the spec's reference_area.
  if (spec.reference_tokens) {
    const auto side = static_cast<int64_t>(std::sqrt(static_cast<double>(spec.reference_area))) / 8;
    const bool at_image = trains_references_at_image_size(spec);
    in.reference_latents.push_back(
        torch::randn({batch, spec.latent_channels, at_image ? 128 / 8 : side, at_image ? 96 / 8 : side}).to(dtype));
  }
  const auto measured = testing::measure_saved_bytes(*m, in, lora);
  ActivationOptions options;
  options.element_bytes = static_cast<int64_t>(c10::elementSize(dtype));
  options.layer_norm_stats_bytes = dtype == torch::kFloat ? 4 : 2;  // CPU LayerNorm keeps bf16 statistics
  options.lora_rank = lora ? 4 : 0;
  options.conditioning_grad = !lora;
  options.lora_dropout_mask_bytes = dropout > 0 ? 4 : 0;  // the CPU's scaled mask, in the adapter's float32
  const ActivationEstimate est = estimate_activations(spec, batch, 128, 96, text, options);
  ASSERT_EQ(est.blocks.size(), measured.size());
  for (const auto& b : est.blocks) {
    ASSERT_TRUE(measured.count(b.kind)) << b.kind;
    EXPECT_EQ(b.saved_bytes, measured.at(b.kind)) << preset << " " << b.kind;
  }
}

void expect_ledger_matches(const std::string& preset, bool lora, int batch, torch::ScalarType dtype,
                           double dropout = 0.0) {
  expect_ledger_matches(spec_by_preset(preset), lora, batch, torch::ScalarType(dtype), dropout);
}

class Ledger : public ::testing::TestWithParam<std::tuple<std::string, bool, int>> {};

TEST_P(Ledger, ComputedBytesPerBlockEqualTheTrackingAllocatorsCount) {
  const auto& [preset, lora, batch] = GetParam();
  expect_ledger_matches(preset, lora, batch, torch::kFloat);
}

// A bf16 model (weights and activations in bf16, as AI Toolkit loads these models, no autocast): the
// float32 internals (RMSNorm's copy, statistics, log-sum-exp) are where the bytes differ from half of fp32;
// with LoRA, the float32 adapters' own copies of their inputs (LoRAModule.forward casts x for each).
TEST_P(Ledger, ComputedBytesPerBlockEqualTheTrackingAllocatorsCountInBf16) {
  const auto& [preset, lora, batch] = GetParam();
  expect_ledger_matches(preset, lora, batch, torch::kBFloat16);
}

// LoRA dropout acts on lora_A's rank-sized output (AI Toolkit's LoRAModule.forward): the mask the ledger
// counts is B x tokens x rank an adapter, and the allocator agrees for every block kind.
TEST(LedgerDropout, TheMaskIsRankSized) {
  for (const char* preset : {"tiny-flux", "tiny-qwen-image", "tiny-zimage", "tiny-sd3", "tiny-dit"}) {
    expect_ledger_matches(preset, /*lora=*/true, 2, torch::kFloat, /*dropout=*/0.25);
    expect_ledger_matches(preset, /*lora=*/true, 1, torch::kBFloat16, /*dropout=*/0.25);
  }
}

// Qwen-Image-Edit-2511 (zero_cond_t): the reference tokens are modulated by the embedding of t = 0, so each
// sub-block's image-stream scale and gate are chosen per token ([B, L, D], not [B, 1, D]) and kept for
// backward, and the t = 0 embedding's SiLU is one more modulation input.
TEST(LedgerZeroCond, PerTokenModulationIsCounted) {
  ModelSpec spec = spec_by_preset("tiny-qwen-image-edit");
  spec.zero_cond_t = true;
  for (const bool lora : {false, true})
    for (const int batch : {1, 2}) {
      expect_ledger_matches(spec, lora, batch, torch::kFloat, 0.0);
      expect_ledger_matches(spec, lora, batch, torch::kBFloat16, 0.0);
    }
}

INSTANTIATE_TEST_SUITE_P(TinyPresets, Ledger,
                         ::testing::Combine(::testing::Values("tiny-flux", "tiny-qwen-image", "tiny-zimage", "tiny-sd3",
                                                              "tiny-dit"),
                                            ::testing::Bool(), ::testing::Values(1, 2)),
                         [](const auto& info) {
                           return gclab::testing::test_name(std::get<0>(info.param) +
                                                            (std::get<1>(info.param) ? "_lora" : "_full") + "_batch" +
                                                            std::to_string(std::get<2>(info.param)));
                         });

}  // namespace
}  // namespace gclab::model
