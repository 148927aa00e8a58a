// The full-size FLUX.1 AutoencoderKL on this machine's CPU (not a test): for each resolution, encode and
// decode time (the median of a few runs after a warm-up) and the peak bytes the tracking allocator saw
// above the weights, float32, batch 1, no gradients — what a preview's decode and a latent cache's encode
// cost here; and the decode tiled in 256-pixel tiles (diffusers' tiled_decode), what tiling saves.
//
//   build/bin/vae_cpu [SIDE ...] > docs/results/vae-cpu.md      (sides default to 256 512)
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "gclab/config/byte_size.h"
#include "gclab/memory/tracker.h"
#include "gclab/vae/autoencoder_kl.h"

using gclab::vae::AutoencoderKL;
using gclab::vae::AutoencoderKLConfig;

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
  for (int i = 1; i < argc; ++i) sides.push_back(std::stoll(argv[i]));
  if (sides.empty()) sides = {256, 512};
  gclab::memory::CpuMemoryTracker tracker;
  torch::NoGradGuard no_grad;
  torch::manual_seed(0);
  AutoencoderKL vae(AutoencoderKLConfig::preset(gclab::config::AutoencoderKind::flux));
  vae->eval();
  int64_t params = 0, weight_bytes = 0;
  for (const auto& p : vae->parameters()) params += p.numel(), weight_bytes += static_cast<int64_t>(p.nbytes());
  std::printf("# The FLUX.1 autoencoder on this CPU\n\n");
  std::printf(
      "Produced by `build/bin/vae_cpu` (bench/vae_cpu.cpp): diffusers' AutoencoderKL as gclab builds it\n"
      "(include/gclab/vae/autoencoder_kl.h), FLUX.1's config, %lld parameters (%s in float32), random\n"
      "weights, batch 1, float32, no gradients, %d intra-op threads. Time: the median of 2 runs after a\n"
      "warm-up. Peak: the tracking allocator's highest live bytes during the call, above the weights and\n"
      "inputs already live.\n\n",
      static_cast<long long>(params), gclab::config::format_bytes(weight_bytes).c_str(), torch::get_num_threads());
  std::printf(
      "| image | latent | encode time | encode peak | decode time | decode peak | tiled decode (256-px tiles) "
      "time | tiled decode peak |\n|---|---|---|---|---|---|---|---|\n");
  for (int64_t side : sides) {
    const torch::Tensor image = torch::rand({1, 3, side, side}) * 2 - 1;
    torch::Tensor z;
    const Cost enc = measure(tracker, 2, [&] { z = vae->encode(image, gclab::vae::Posterior::mean); });
    const Cost dec = measure(tracker, 2, [&] { vae->decode(z); });
    vae->enable_tiling(256);
    const Cost tiled = measure(tracker, 2, [&] { vae->decode(z); });
    vae->disable_tiling();
    const bool tiles = side > 256;  // no larger than a tile: decoded whole
    std::printf("| %lld² | 16 × %lld² | %.2f s | %s | %.2f s | %s | %s | %s |\n", static_cast<long long>(side),
                static_cast<long long>(side / 8), enc.seconds, gclab::config::format_bytes(enc.peak).c_str(),
                dec.seconds, gclab::config::format_bytes(dec.peak).c_str(),
                tiles ? (std::to_string(tiled.seconds).substr(0, 5) + " s").c_str() : "(one tile)",
                tiles ? gclab::config::format_bytes(tiled.peak).c_str() : "(one tile)");
    std::fflush(stdout);
  }
  return 0;
}
