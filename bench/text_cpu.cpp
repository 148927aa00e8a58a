// The text encoders on this machine's CPU (not a test): for each encoder kind at its CPU-test size, and
// CLIP-L / bigG at full size, one encode of a batch of one caption at the pipeline's length — time (the
// median of 3 runs after a warm-up) and the peak bytes the tracking allocator saw above the weights
// (float32, no gradients), beside the peak text/memory.h predicts. T5-XXL and the Qwen models at full size
// do not fit this machine in float32.
//
//   build/bin/text_cpu >> docs/results/text-encoders.md
//
// `text_cpu --tiny`: the CPU-test sizes alone (the GPU check's rehearsal).
// `text_cpu --cuda` (scripts/gpu/check.sh): every encoder at full size on the GPU in bf16 — T5-XXL, the
// Qwen models and the vision tower included — its encode peak from the CUDA allocator beside the prediction
// for CUDA's kernels.
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "gclab/config/byte_size.h"
#include "gclab/memory/tracker.h"
#include "gclab/text/encoder.h"
#include "gclab/text/memory.h"
#include "gclab/text/qwen_vision.h"

namespace {

// The full-size encoders on the GPU in bf16: one encode at the pipeline's length (after a warm-up), the
// allocator's peak above what was live, and text/memory.h's prediction for CUDA's kernels.
int run_cuda() {
  using Kind = gclab::config::TextEncoderKind;
  if (!torch::cuda::is_available()) {
    std::fprintf(stderr, "text_cpu --cuda: no CUDA device\n");
    return 2;
  }
  torch::NoGradGuard no_grad;
  const torch::Device cuda(torch::kCUDA, 0);
  gclab::memory::MemoryMeter meter(cuda);
  const auto options = torch::TensorOptions().device(cuda).dtype(torch::kBFloat16);
  gclab::text::EncodeMemoryOptions predict;
  predict.cpu = false, predict.dtype = torch::kBFloat16;
  std::printf("| encoder | tokens | encode peak (CUDA, bf16) | predicted | ratio |\n|---|---:|---:|---:|---:|\n");
  auto row = [&](const std::string& name, int64_t tokens, int64_t measured, int64_t predicted) {
    std::printf("| %s | %lld | %s | %s | %.3f |\n", name.c_str(), static_cast<long long>(tokens),
                gclab::config::format_bytes(measured).c_str(), gclab::config::format_bytes(predicted).c_str(),
                static_cast<double>(predicted) / static_cast<double>(std::max<int64_t>(measured, 1)));
    std::fflush(stdout);
  };
  auto peak_of = [&](const std::function<void()>& fn) {
    fn();
    torch::cuda::synchronize();
    const int64_t before = meter.stats().live_bytes;
    meter.reset_peak();
    fn();
    torch::cuda::synchronize();
    return meter.stats().peak_bytes - before;
  };
  for (Kind kind : {Kind::clip_l, Kind::clip_g_projected, Kind::t5_xxl, Kind::qwen25_vl, Kind::qwen3}) {
    torch::manual_seed(0);
    auto e = gclab::text::build_text_encoder(kind, false, {}, options).encoder;
    const int64_t length =
        kind == Kind::t5_xxl || kind == Kind::qwen3 ? 512 : std::min<int64_t>(e->max_positions(), 77);
    const torch::Tensor ids =
        torch::randint(0, 1000, {1, length}, torch::TensorOptions().device(cuda).dtype(torch::kLong));
    const torch::Tensor mask = torch::ones_like(ids);
    const bool masked = kind == Kind::qwen25_vl || kind == Kind::qwen3;
    const int64_t measured = peak_of([&] { e->encode(ids, masked ? mask : torch::Tensor()); });
    row(std::string(gclab::config::name_of(kind)), length, measured,
        gclab::text::predicted_encode_bytes(*e, 1, length, masked, predict));
    if (kind == Kind::qwen25_vl) {  // the vision tower on Qwen-Image-Edit's 1024² condition image
      gclab::text::QwenVisionTower tower(*e->vision_config(), options);
      gclab::text::QwenVisionInput in = gclab::text::qwen_vl_image_input(torch::rand({3, 1024, 1024}), tower->config());
      const auto grid = in.grid_thw[0];
      in.pixel_values = in.pixel_values.to(cuda, torch::kBFloat16);
      const int64_t tower_peak = peak_of([&] { tower->forward(in); });
      row("qwen25_vl vision tower, 1024²", in.pixel_values.size(0), tower_peak,
          gclab::text::predicted_vision_bytes(tower->config(), {{grid[1].item<int64_t>(), grid[2].item<int64_t>()}},
                                              predict));
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1 && std::string(argv[1]) == "--cuda") return run_cuda();
  const bool tiny_only = argc > 1 && std::string(argv[1]) == "--tiny";  // the GPU check's CPU rehearsal
  using Kind = gclab::config::TextEncoderKind;
  gclab::memory::CpuMemoryTracker tracker;
  torch::NoGradGuard no_grad;
  struct Case {
    Kind kind;
    bool tiny;
    int64_t length;  // the pipeline's: CLIP all its positions (0), T5 512 (FLUX.1-dev), Qwen-Image up to 1024 + 34,
                     // Z-Image 512
  };
  const std::vector<Case> cases = {{Kind::clip_l, true, 0},           {Kind::clip_g_projected, true, 0},
                                   {Kind::t5_xxl, true, 512},         {Kind::qwen25_vl, true, 512},
                                   {Kind::qwen3, true, 512},          {Kind::clip_l, false, 0},
                                   {Kind::clip_g_projected, false, 0}};
  std::printf("\n## Encode time and peak on this CPU\n\n");
  std::printf(
      "Produced by `build/bin/text_cpu` (bench/text_cpu.cpp): one caption (random ids) at the pipeline's length,\n"
      "float32, no gradients, %d intra-op threads; time: the median of 3 runs after a warm-up; peak: the tracking\n"
      "allocator's highest live bytes during the encode, above the weights.\n\n",
      torch::get_num_threads());
  gclab::text::EncodeMemoryOptions predict;
  std::printf(
      "| encoder | size | parameters | tokens | encode time | encode peak | predicted |\n"
      "|---|---|---:|---:|---:|---:|---:|\n");
  for (const Case& c : cases) {
    if (tiny_only && !c.tiny) continue;
    torch::manual_seed(0);
    auto e = gclab::text::build_text_encoder(c.kind, c.tiny).encoder;
    e->eval();
    int64_t params = 0;
    for (const auto& p : e->parameters()) params += p.numel();
    const int64_t length = c.length > 0 ? c.length : e->max_positions();
    const torch::Tensor ids = torch::randint(0, std::min<int64_t>(e->vocab_size(), 1000), {1, length});
    std::vector<double> times;
    int64_t peak = 0;
    for (int run = 0; run < 4; ++run) {
      const int64_t before = tracker.stats().live_bytes;
      tracker.reset_peak();
      const auto t0 = std::chrono::steady_clock::now();
      e->encode(ids);
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (run == 0) continue;  // the warm-up: the kernels' lazy state
      times.push_back(s);
      peak = std::max(peak, tracker.stats().peak_bytes - before);
    }
    std::sort(times.begin(), times.end());
    std::printf(
        "| %s | %s | %lld | %lld | %.1f ms | %s | %s |\n", std::string(gclab::config::name_of(c.kind)).c_str(),
        c.tiny ? "tiny" : "full", static_cast<long long>(params), static_cast<long long>(length),
        1000.0 * times[times.size() / 2], gclab::config::format_bytes(peak).c_str(),
        gclab::config::format_bytes(gclab::text::predicted_encode_bytes(*e, 1, length, false, predict)).c_str());
    std::fflush(stdout);
  }

  // The Qwen2.5-VL vision tower on an edit model's control image: the condition image AI Toolkit makes (the
  // Plus models' 384², Qwen-Image-Edit's 1024² area), the processor's patches, one forward.
  std::printf("\n### The Qwen2.5-VL vision tower on a control image\n\n");
  std::printf(
      "The same measurement for `text::QwenVisionTower` alone (its 7B shape: 676,550,144 parameters; tiny: the\n"
      "CPU-test tower), a square control image resized to the condition area and through gclab's Qwen2VL\n"
      "processor; full size at 1024² is one timed run (no warm-up).\n\n");
  std::printf(
      "| tower | condition area | patches | tokens | forward time | forward peak | predicted |\n"
      "|---|---|---:|---:|---:|---:|---:|\n");
  struct TowerCase {
    bool tiny;
    int64_t side;  // the condition image's side (AI Toolkit: 384 for the Plus models, 1024 for Qwen-Image-Edit)
    int runs;
  };
  for (const TowerCase& c :
       {TowerCase{true, 384, 4}, TowerCase{true, 1024, 4}, TowerCase{false, 384, 4}, TowerCase{false, 1024, 1}}) {
    if (tiny_only && !c.tiny) continue;
    torch::manual_seed(0);
    const auto config =
        c.tiny ? gclab::text::QwenVisionConfig::tiny(64) : gclab::text::QwenVisionConfig::qwen25_vl_7b();
    gclab::text::QwenVisionTower tower(config);
    const auto [h, w] = gclab::text::qwen_edit_condition_size(c.side, c.side, c.side * c.side, false);
    const gclab::text::QwenVisionInput in = gclab::text::qwen_vl_image_input(torch::rand({3, h, w}), config);
    std::vector<double> times;
    int64_t peak = 0, tokens = 0;
    for (int run = 0; run < c.runs; ++run) {
      const int64_t before = tracker.stats().live_bytes;
      tracker.reset_peak();
      const auto t0 = std::chrono::steady_clock::now();
      tokens = tower->forward(in).size(0);
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (run == 0 && c.runs > 1) continue;  // the warm-up
      times.push_back(s);
      peak = std::max(peak, tracker.stats().peak_bytes - before);
    }
    std::sort(times.begin(), times.end());
    const auto grid = in.grid_thw[0];
    const int64_t predicted =
        gclab::text::predicted_vision_bytes(config, {{grid[1].item<int64_t>(), grid[2].item<int64_t>()}}, predict);
    std::printf("| %s | %lld² | %lld | %lld | %.1f ms | %s | %s |\n", c.tiny ? "tiny" : "full",
                static_cast<long long>(c.side), static_cast<long long>(in.pixel_values.size(0)),
                static_cast<long long>(tokens), 1000.0 * times[times.size() / 2],
                gclab::config::format_bytes(peak).c_str(), gclab::config::format_bytes(predicted).c_str());
    std::fflush(stdout);
  }
  return 0;
}
