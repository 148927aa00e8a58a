// The autoencoder's predicted memory (vae/memory.h) against the tracking allocator: the weight bytes equal
// the built network's, and the decode / encode peaks are within 2% of what the allocator measures (the issue asks 10%),
// at two resolutions, for the full-size FLUX.1 autoencoder and a small one, untiled and tiled (float32, 1 thread);
// the same for Qwen-Image's AutoencoderKLQwenImage, full size and tiny, its walk exact to the byte where the
// network runs the kernels the walk knows.
#include "gclab/vae/memory.h"

#include <gtest/gtest.h>

#include <cstdio>

#include "gclab/memory/tracker.h"

namespace gclab::vae {
namespace {

int64_t weight_bytes(torch::nn::Module& vae) {
  int64_t n = 0;
  for (const auto& p : vae.parameters()) n += static_cast<int64_t>(p.nbytes());
  return n;
}

AutoencoderKLConfig small() {
  AutoencoderKLConfig c;
  c.block_out_channels = {32, 64, 64, 64};
  c.layers_per_block = 1;
  c.norm_num_groups = 8;
  return c;
}

// Peak bytes above the live set of fn's second run (the first warms the kernels' lazy state).
template <class F>
int64_t measured_peak(memory::CpuMemoryTracker& tracker, F&& fn) {
  fn();
  const int64_t before = tracker.stats().live_bytes;
  tracker.reset_peak();
  fn();
  return tracker.stats().peak_bytes - before;
}

TEST(AutoencoderMemory, WeightBytesEqualTheBuiltNetworks) {
  for (auto kind : {config::AutoencoderKind::flux, config::AutoencoderKind::sd}) {
    AutoencoderKL vae(AutoencoderKLConfig::preset(kind));
    EXPECT_EQ(autoencoder_weight_bytes(vae->config(), 4), weight_bytes(*vae)) << config::name_of(kind);
    EXPECT_EQ(autoencoder_weight_bytes(vae->config(), 2), weight_bytes(*vae) / 2);
  }
  AutoencoderKL vae(small());
  EXPECT_EQ(autoencoder_weight_bytes(small(), 4), weight_bytes(*vae));
}

void expect_close(int64_t predicted, int64_t measured, const std::string& what) {
  std::printf("%s: predicted %.2f MiB, measured %.2f MiB (%.3f)\n", what.c_str(), predicted / 1048576.0,
              measured / 1048576.0, static_cast<double>(predicted) / static_cast<double>(measured));
  EXPECT_NEAR(static_cast<double>(predicted) / static_cast<double>(measured), 1.0, 0.02)
      << what << ": predicted " << predicted << ", measured " << measured;
}

void expect_within(int64_t predicted, int64_t measured, const std::string& what) {
  const double ratio = static_cast<double>(predicted) / static_cast<double>(measured);
  std::printf("%s: predicted %.2f MiB, measured %.2f MiB (%.3f)\n", what.c_str(), predicted / 1048576.0,
              measured / 1048576.0, ratio);
  EXPECT_NEAR(ratio, 1.0, 0.10) << what << ": predicted " << predicted << ", measured " << measured;
}

AutoencoderMemoryOptions options() {
  AutoencoderMemoryOptions o;
  o.channel_block = cpu_channel_block();
  return o;
}

// Full size at 128² (at 256² it measured the same ratio, 1.000 decode and encode, in two thirds of the
// suite's slowest test: its 256² side is the 64- and 16-channel networks' here), the small and tiny ones at
// two sides each.
TEST(AutoencoderMemory, PredictedDecodeAndEncodePeaksMatchTheAllocator) {
  at::set_num_threads(1);
  memory::CpuMemoryTracker tracker;
  torch::NoGradGuard no_grad;
  struct Case {
    AutoencoderKLConfig config;
    std::vector<int64_t> sides;
  };
  for (const Case& k :
       {Case{AutoencoderKLConfig::preset(config::AutoencoderKind::flux), {128}}, Case{small(), {128, 256}},
        Case{AutoencoderKLConfig::tiny(config::AutoencoderKind::flux), {64, 256}}}) {
    torch::manual_seed(0);
    AutoencoderKL vae(k.config);
    vae->eval();
    for (int64_t side : k.sides) {
      const std::string what =
          std::to_string(k.config.block_out_channels.back()) + "-channel VAE at " + std::to_string(side) + "²";
      const torch::Tensor z = torch::randn({1, k.config.latent_channels, side / 8, side / 8});
      expect_close(predicted_decode_bytes(k.config, 1, side, side, options()),
                   measured_peak(tracker, [&] { vae->decode(z); }), what + " decode");
      const torch::Tensor x = torch::rand({1, 3, side, side}) * 2 - 1;
      expect_close(predicted_encode_bytes(k.config, 1, side, side, options()),
                   measured_peak(tracker, [&] { vae->encode(x); }), what + " encode");
    }
  }
}

// In bf16 on this CPU (a bf16 run's encodes and previews): the tiny and small autoencoders' decode and
// encode, the convolutions on the path the CPU takes for bf16 (vae/memory.h: bf16_im2col). Within 10%, not
// 2%: measured 4-8% under (one activation of the widest stage more than the walk holds, not yet found);
// without the im2col columns the walk was 40-50% under.
TEST(AutoencoderMemory, PredictedBf16DecodeAndEncodePeaksAreWithinTenPercent) {
  at::set_num_threads(1);
  memory::CpuMemoryTracker tracker;
  torch::NoGradGuard no_grad;
  AutoencoderMemoryOptions o = options();
  o.dtype_bytes = 2;
  o.bf16_im2col = cpu_bf16_im2col();
  for (const AutoencoderKLConfig& c : {AutoencoderKLConfig::tiny(config::AutoencoderKind::flux), small()}) {
    torch::manual_seed(0);
    AutoencoderKL vae(c);
    vae->eval();
    vae->to(torch::kBFloat16);
    const std::string what = std::to_string(c.block_out_channels.back()) + "-channel VAE at 64² in bf16";
    const torch::Tensor z = torch::randn({1, c.latent_channels, 8, 8}).to(torch::kBFloat16);
    expect_within(predicted_decode_bytes(c, 1, 64, 64, o), measured_peak(tracker, [&] { vae->decode(z); }),
                  what + " decode");
    const torch::Tensor x = (torch::rand({1, 3, 64, 64}) * 2 - 1).to(torch::kBFloat16);
    expect_within(predicted_encode_bytes(c, 1, 64, 64, o), measured_peak(tracker, [&] { vae->encode(x); }),
                  what + " encode");
  }
}

TEST(AutoencoderMemory, PredictedTiledDecodePeakMatchesTheAllocator) {
  at::set_num_threads(1);
  memory::CpuMemoryTracker tracker;
  torch::NoGradGuard no_grad;
  torch::manual_seed(0);
  AutoencoderKL vae(small());
  vae->eval();
  for (int64_t side : {256, 384}) {
    const torch::Tensor z = torch::randn({1, 16, side / 8, side / 8});
    vae->enable_tiling(128);
    const int64_t tiled = measured_peak(tracker, [&] { vae->decode(z); });
    vae->disable_tiling();
    expect_close(predicted_decode_bytes(small(), 1, side, side, options(), 128), tiled,
                 "tiled at " + std::to_string(side));
    EXPECT_LT(predicted_decode_bytes(small(), 1, side, side, options(), 128),
              predicted_decode_bytes(small(), 1, side, side, options()));
  }
}

TEST(QwenImageVaeMemory, WeightBytesEqualTheBuiltNetworks) {
  for (const QwenImageVaeConfig& c : {QwenImageVaeConfig::preset(), QwenImageVaeConfig::tiny()}) {
    QwenImageVae vae(c);
    EXPECT_EQ(autoencoder_weight_bytes(c, 4), weight_bytes(*vae)) << c.base_dim;
    EXPECT_EQ(autoencoder_weight_bytes(c, 2) * 2, weight_bytes(*vae));
  }
}

// Full size at 64² (every 3x3x3 convolution on slow_conv3d's columns) and 128² (the widest ones on oneDNN),
// the tiny one at 128² and tiled at 256² (128-pixel tiles, a 3 x 3 grid).
TEST(QwenImageVaeMemory, PredictedDecodeAndEncodePeaksMatchTheAllocator) {
  at::set_num_threads(1);
  memory::CpuMemoryTracker tracker;
  torch::NoGradGuard no_grad;
  struct Case {
    QwenImageVaeConfig config;
    int64_t side, tile;
  };
  for (const Case& k : {Case{QwenImageVaeConfig::preset(), 64, 0}, Case{QwenImageVaeConfig::preset(), 128, 0},
                        Case{QwenImageVaeConfig::tiny(), 128, 0}, Case{QwenImageVaeConfig::tiny(), 256, 128}}) {
    torch::manual_seed(0);
    QwenImageVae vae(k.config);
    vae->eval();
    if (k.tile) vae->enable_tiling(k.tile);
    const std::string what = "Qwen-Image VAE (base " + std::to_string(k.config.base_dim) + ") at " +
                             std::to_string(k.side) + "²" + (k.tile ? " tiled" : "");
    const torch::Tensor z = torch::randn({1, k.config.z_dim, k.side / 8, k.side / 8});
    expect_close(predicted_decode_bytes(k.config, 1, k.side, k.side, options(), k.tile),
                 measured_peak(tracker, [&] { vae->decode(z); }), what + " decode");
    if (k.tile) {
      EXPECT_LT(predicted_decode_bytes(k.config, 1, k.side, k.side, options(), k.tile),
                predicted_decode_bytes(k.config, 1, k.side, k.side, options()) * 6 / 10);
      continue;
    }
    const torch::Tensor x = torch::rand({1, 3, k.side, k.side}) * 2 - 1;
    expect_close(predicted_encode_bytes(k.config, 1, k.side, k.side, options()),
                 measured_peak(tracker, [&] { vae->encode(x); }), what + " encode");
  }
}

}  // namespace
}  // namespace gclab::vae
