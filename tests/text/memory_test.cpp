// The text encoders' predicted encode peaks (text/memory.h) against the tracking allocator: CLIP, T5, the
// Qwen language models and the Qwen2.5-VL vision tower, each at two lengths (or image sizes), masked and
// not, in float32 and bfloat16, with float8 (qfloat8) Linears — within 5% (the autoencoders' walk is held to
// 2%, the issue asks 10%). The encoders run at CPU-test widths large enough that their activations, not the
// kernels' fixed buffers, make the peak (1 thread).
#include "gclab/text/memory.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <string>

#include "gclab/memory/cpu_isa.h"
#include "gclab/memory/live_set.h"
#include "gclab/memory/tracker.h"
#include "gclab/nn/layers.h"
#include "gclab/text/encoder.h"

namespace gclab::text {
namespace {

template <class F>
int64_t measured_peak(memory::CpuMemoryTracker& tracker, F&& fn) {
  fn();  // warms the kernels' lazy state
  const int64_t before = tracker.stats().live_bytes;
  tracker.reset_peak();
  fn();
  return tracker.stats().peak_bytes - before;
}

void expect_close(int64_t predicted, int64_t measured, const std::string& what, double tolerance = 0.05) {
  std::printf("%s: predicted %.3f MiB, measured %.3f MiB (%.3f)\n", what.c_str(), predicted / 1048576.0,
              measured / 1048576.0, static_cast<double>(predicted) / static_cast<double>(measured));
  EXPECT_NEAR(static_cast<double>(predicted) / static_cast<double>(measured), 1.0, tolerance)
      << what << ": predicted " << predicted << ", measured " << measured;
}

torch::TensorOptions dtype_options(int64_t bytes) {
  return torch::TensorOptions().dtype(bytes == 2 ? torch::kBFloat16 : torch::kFloat);
}

// Ids of `tokens` tokens per row and a mask whose second row (when batch > 1) is padded from the middle.
std::pair<torch::Tensor, torch::Tensor> inputs(int64_t batch, int64_t tokens, int64_t vocab) {
  const torch::Tensor ids = torch::randint(1, vocab - 3, {batch, tokens}, torch::kLong);
  torch::Tensor mask = torch::ones({batch, tokens}, torch::kLong);
  if (batch > 1) mask[1].slice(0, tokens / 2).fill_(0);
  return {ids, mask};
}

// One encoder of `config` built in the dtype of `dtype_bytes` (its Linears qfloat8 when `quantized`): its
// forward on `batch` inputs of `tokens` ids (masked or not) measured, against the prediction.
template <class Model, class Config>
void check_encode(memory::CpuMemoryTracker& tracker, const Config& config, int64_t batch, int64_t tokens, bool masked,
                  int64_t dtype_bytes, bool quantized, const std::string& what) {
  Model model(config, dtype_options(dtype_bytes));
  if (quantized)
    for (auto& [name, linear] : nn::named_linears(*model)) linear->set_weight_storage(nn::WeightStorage::QFloat8);
  EncodeMemoryOptions o;
  o.dtype = dtype_bytes == 2 ? torch::kBFloat16 : torch::kFloat, o.quantized_linears = quantized;
  const auto [ids, mask] = inputs(batch, tokens, config.vocab_size);
  const int64_t measured = measured_peak(tracker, [&] { model->forward(ids, masked ? mask : torch::Tensor()); });
  // In bf16 the bound measured on this ISA (memory::cpu_bf16_bound): where the bf16 matmuls are oneDNN's,
  // the Linears' scratch is in the walk (nn::linear, memory::cpu_onednn_matmul_scratch), measured for its
  // native bf16 kernels; float32 within 5% on every ISA.
  const memory::CpuRuleBound b = memory::cpu_bf16_bound(memory::CpuRule::text_encode);
  const double tolerance = dtype_bytes == 2 ? std::max(1.0 - b.low, b.high - 1.0) : 0.05;
  expect_close(predicted_encode_bytes(config, batch, tokens, masked, o), measured,
               what + " e" + std::to_string(dtype_bytes) + " T" + std::to_string(tokens) + (masked ? " masked" : "") +
                   (quantized ? " qfloat8" : ""),
               tolerance);
}

TEST(TextMemory, ClipEncodePeakIsPredicted) {
  memory::CpuMemoryTracker tracker;
  torch::NoGradGuard no_grad;
  ClipTextConfig c = ClipTextConfig::tiny(ClipTextConfig::clip_l());
  c.hidden_size = 256, c.intermediate_size = 1024, c.num_attention_heads = 4, c.max_position_embeddings = 77;
  for (const nn::Activation act : {nn::Activation::quick_gelu, nn::Activation::gelu})
    for (int64_t e : {4, 2})
      for (int64_t tokens : {40, 77})
        for (bool masked : {false, true}) {
          c.hidden_act = act;
          check_encode<ClipTextModel>(tracker, c, 2, tokens, masked, e, false, std::string("CLIP ") + nn::name_of(act));
        }
}

TEST(TextMemory, T5EncodePeakIsPredicted) {
  memory::CpuMemoryTracker tracker;
  torch::NoGradGuard no_grad;
  T5Config small = T5Config::tiny();
  small.d_model = 128, small.d_ff = 384, small.num_heads = 8, small.d_kv = 16;
  T5Config wide = small;  // a feed-forward wide enough to make the peak (the OOM lab's wide T5)
  wide.d_model = 64, wide.d_ff = 16384, wide.num_heads = 4;
  for (const T5Config& c : {small, wide})
    for (int64_t e : {4, 2})
      for (int64_t tokens : {c.d_ff > 1024 ? 32 : 128, 512})
        for (bool masked : {false, true}) check_encode<T5Encoder>(tracker, c, 1, tokens, masked, e, false, "T5");
}

TEST(TextMemory, QwenLanguageModelEncodePeakIsPredicted) {
  memory::CpuMemoryTracker tracker;
  torch::NoGradGuard no_grad;
  for (bool qwen3 : {true, false}) {
    QwenLmConfig c = QwenLmConfig::tiny(qwen3 ? QwenLmConfig::qwen3_4b() : QwenLmConfig::qwen25_vl_7b());
    c.hidden_size = 128, c.intermediate_size = 384, c.num_attention_heads = 8, c.num_key_value_heads = 2;
    c.vision.reset();
    for (int64_t e : {4, 2})
      for (int64_t tokens : {100, 300})
        for (bool quantized : {false, true})
          check_encode<QwenLm>(tracker, c, 1, tokens, true, e, quantized, qwen3 ? "Qwen3" : "Qwen2.5-VL");
  }
}

// (The language model reading control images is walked as the run calls it: PromptEncoder's test.)
TEST(TextMemory, VisionTowerEncodePeakIsPredicted) {
  memory::CpuMemoryTracker tracker;
  torch::NoGradGuard no_grad;
  // The Qwen-Image-Edit encoder's tower at CPU-test size.
  auto loaded = build_text_encoder(config::TextEncoderKind::qwen25_vl, true, {}, {}, true, {128, 0});
  const QwenVisionConfig& v = *loaded.encoder->vision_config();
  for (int64_t side : {392, 784}) {
    const torch::Tensor image = torch::rand({3, side, side});
    const QwenVisionInput in = qwen_vl_image_input(image, v);
    const std::vector<VisionGrid> grids{{side / v.patch_size, side / v.patch_size}};
    QwenVisionTower tower(v);
    const int64_t tower_peak = measured_peak(tracker, [&] { tower->forward(in); });
    expect_close(predicted_vision_bytes(v, grids), tower_peak, "vision tower " + std::to_string(side) + "²");
  }
}

}  // namespace
}  // namespace gclab::text
