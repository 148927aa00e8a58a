// A full-size autoencoder on this machine's CPU (not a test): the FLUX.1 AutoencoderKL, or with --qwen
// Qwen-Image's AutoencoderKLQwenImage. For each resolution, encode and decode time (the median of a few
// runs after a warm-up) and the peak bytes the tracking allocator saw above the weights, beside the peak
// vae/memory.h predicts; float32, batch 1, no gradients — what a preview's decode and a latent cache's
// encode cost here; and the decode tiled in 256-pixel tiles (diffusers' tiled_decode), what tiling saves.
//
//   build/bin/vae_cpu [--qwen] [SIDE ...] > docs/results/vae-cpu.md      (sides default to 256 512)
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "gclab/config/byte_size.h"
#include "gclab/memory/tracker.h"
#include "gclab/vae/codec.h"
#include "gclab/vae/memory.h"

namespace {

struct Cost {
  double seconds = 0;
  int64_t peak = 0;  // above what was live before
};

template <class F>
Cost measure(gclab::memory::CpuMemoryTracker& tracker, int runs, F&& f) {
  std::vector<double> times;
  int64_t peak = 0;
  for (int i = 0; i <= runs; ++i) {
    const int64_t before = tracker.stats().live_bytes;
    tracker.reset_peak();
    const auto t0 = std::chrono::steady_clock::now();
    f();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (i > 0) times.push_back(s);  // the first run warms up
    peak = std::max(peak, tracker.stats().peak_bytes - before);
  }
  std::sort(times.begin(), times.end());
  return {times[times.size() / 2], peak};
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int64_t> sides;
  bool qwen = false;
  for (int i = 1; i < argc; ++i) {
    if (std::string(argv[i]) == "--qwen")
      qwen = true;
    else
      sides.push_back(std::stoll(argv[i]));
  }
  if (sides.empty()) sides = {256, 512};
  gclab::memory::CpuMemoryTracker tracker;
  torch::NoGradGuard no_grad;
  torch::manual_seed(0);
  const gclab::vae::AutoencoderConfig config =
      qwen ? gclab::vae::AutoencoderConfig(gclab::vae::QwenImageVaeConfig::preset())
           : gclab::vae::AutoencoderConfig(gclab::vae::AutoencoderKLConfig{} /* FLUX.1's */);
  const gclab::vae::LoadedAutoencoder built = gclab::vae::build_autoencoder(config, {});
  gclab::vae::AutoencoderBase& vae = *built.vae;
  vae.eval();
  gclab::vae::CodecSpec spec;  // what gclab estimate predicts from
  spec.autoencoder = config;
  int64_t params = 0, weight_bytes = 0;
  for (const auto& p : vae.parameters()) params += p.numel(), weight_bytes += static_cast<int64_t>(p.nbytes());
  const char* name = qwen ? "Qwen-Image's AutoencoderKLQwenImage" : "The FLUX.1 autoencoder";
  const int runs = qwen ? 1 : 2;
  std::printf("# %s on this CPU\n\n", name);
  std::printf(
      "Produced by `build/bin/vae_cpu%s` (bench/vae_cpu.cpp): diffusers' %s as gclab builds it, %lld parameters\n"
      "(%s in float32), random weights, batch 1, float32, no gradients, %d intra-op threads. Time: the median of\n"
      "%d run(s) after a warm-up. Peak: the tracking allocator's highest live bytes during the call, above the\n"
      "weights and inputs already live; predicted: vae/memory.h's walk (what gclab estimate / check use).\n\n",
      qwen ? " --qwen" : "", gclab::vae::class_name(config), static_cast<long long>(params),
      gclab::config::format_bytes(weight_bytes).c_str(), torch::get_num_threads(), runs);
  std::printf(
      "| image | encode time | encode peak (predicted) | decode time | decode peak (predicted) | tiled decode "
      "(256-px tiles) time | tiled decode peak (predicted) |\n|---|---|---|---|---|---|---|\n");
  auto both = [](int64_t measured, int64_t predicted) {
    return gclab::config::format_bytes(measured) + " (" + gclab::config::format_bytes(predicted) + ")";
  };
  for (int64_t side : sides) {
    const torch::Tensor image = torch::rand({1, 3, side, side}) * 2 - 1;
    torch::Tensor z;
    const Cost enc = measure(tracker, runs, [&] { z = vae.encode(image, gclab::vae::Posterior::mean); });
    const Cost dec = measure(tracker, runs, [&] { vae.decode(z); });
    vae.enable_tiling(256);
    const Cost tiled = measure(tracker, runs, [&] { vae.decode(z); });
    vae.disable_tiling();
    spec.tile_sample_size = 0;
    const int64_t enc_predicted = spec.encode_bytes({1, 1, side, side}, true);
    const int64_t dec_predicted = spec.decode_bytes({1, 1, side, side}, true);
    spec.tile_sample_size = 256;
    const int64_t tiled_predicted = spec.decode_bytes({1, 1, side, side}, true);
    const bool tiles = side > 256;  // no larger than a tile: decoded whole
    std::printf("| %lld² | %.2f s | %s | %.2f s | %s | %s | %s |\n", static_cast<long long>(side), enc.seconds,
                both(enc.peak, enc_predicted).c_str(), dec.seconds, both(dec.peak, dec_predicted).c_str(),
                tiles ? (std::to_string(tiled.seconds).substr(0, 5) + " s").c_str() : "(one tile)",
                tiles ? both(tiled.peak, tiled_predicted).c_str() : "(one tile)");
    std::fflush(stdout);
  }
  return 0;
}
