// The autoencoders' walked memory (vae/memory.h: their own code on the meta device) against the tracking
// allocator: the meta network's weight bytes equal the built one's, and the decode / encode peaks are within
// 2% of what the allocator measures (measured exact), at two resolutions, for the full-size FLUX.1
// autoencoder and a small one, untiled and tiled (float32, 1 thread; bf16); the same for Qwen-Image's
// AutoencoderKLQwenImage, full size and tiny; and the convolution's meta kernel alone, shape by shape.
#include "gclab/vae/memory.h"
#include "gclab/model/registry.h"
#include "gclab/model/spec.h"
#include "gclab/vae/dct_codec.h"

#include <gtest/gtest.h>

#include <cstdio>

#include "gclab/memory/cpu_isa.h"
#include "gclab/memory/live_set.h"
#include "gclab/memory/meta_count.h"
#include "gclab/memory/tracker.h"
#include "gclab/nn/meta_kernels.h"

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
  for (const char* preset : {"flux-dev", "dit-xl2"}) {  // FLUX.1's and the SD VAE
    const model::ModelSpec spec = model::spec_by_preset(preset);
    AutoencoderKL vae(std::get<AutoencoderKLConfig>(model::family_of(spec.family).autoencoder(spec)));
    EXPECT_EQ(autoencoder_weight_bytes(vae->config(), torch::kFloat), weight_bytes(*vae)) << preset;
    EXPECT_EQ(autoencoder_weight_bytes(vae->config(), torch::kBFloat16), weight_bytes(*vae) / 2);
  }
  AutoencoderKL vae(small());
  EXPECT_EQ(autoencoder_weight_bytes(small(), torch::kFloat), weight_bytes(*vae));
}

void expect_close(int64_t predicted, int64_t measured, const std::string& what) {
  std::printf("%s: predicted %.2f MiB, measured %.2f MiB (%.3f)\n", what.c_str(), predicted / 1048576.0,
              measured / 1048576.0, static_cast<double>(predicted) / static_cast<double>(measured));
  EXPECT_NEAR(static_cast<double>(predicted) / static_cast<double>(measured), 1.0, 0.02)
      << what << ": predicted " << predicted << ", measured " << measured;
}

// A bf16 prediction against the allocator, held to the bound measured for `rule` on the ISA oneDNN
// dispatches for here (memory::cpu_bf16_bound: exact on AVX2 and AVX-512 BF16, bounded on AVX-512 without
// BF16 and on AMX).
void expect_bf16(int64_t predicted, int64_t measured, const std::string& what, memory::CpuRule rule) {
  const memory::CpuRuleBound b = memory::cpu_bf16_bound(rule);
  const double ratio = static_cast<double>(predicted) / static_cast<double>(measured);
  std::printf("%s: predicted %.2f MiB, measured %.2f MiB (%.3f; %s)\n", what.c_str(), predicted / 1048576.0,
              measured / 1048576.0, ratio, memory::describe(rule).c_str());
  EXPECT_GE(ratio, b.low) << what << ": predicted " << predicted << ", measured " << measured;
  EXPECT_LE(ratio, b.high) << what << ": predicted " << predicted << ", measured " << measured;
}

AutoencoderMemoryOptions options() { return {}; }

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
  for (const Case& k : {Case{AutoencoderKLConfig{}, {128}}, Case{small(), {128, 256}},
                        Case{AutoencoderKLConfig{}.shrunk(), {64, 256}}}) {
    torch::manual_seed(0);
    AutoencoderKL vae(k.config);
    vae->eval();
    for (int64_t side : k.sides) {
      const std::string what =
          std::to_string(k.config.block_out_channels.back()) + "-channel VAE at " + std::to_string(side) + "²";
      const torch::Tensor z = torch::randn({1, k.config.latent_channels, side / 8, side / 8});
      expect_close(predicted_decode_bytes(k.config, {1, 1, side, side}, options()),
                   measured_peak(tracker, [&] { vae->decode(z); }), what + " decode");
      const torch::Tensor x = torch::rand({1, 3, side, side}) * 2 - 1;
      expect_close(predicted_encode_bytes(k.config, {1, 1, side, side}, options()),
                   measured_peak(tracker, [&] { vae->encode(x); }), what + " encode");
    }
  }
}

// In bf16 on this CPU (a bf16 run's encodes and previews): the tiny and small autoencoders' decode and
// encode, the convolutions on the path the CPU takes for bf16 (oneDNN where the CPU runs bf16 through it,
// else slow_conv2d's im2col columns), held to the bound measured on this ISA.
TEST(AutoencoderMemory, PredictedBf16DecodeAndEncodePeaksMatchTheAllocator) {
  at::set_num_threads(1);
  memory::CpuMemoryTracker tracker;
  torch::NoGradGuard no_grad;
  AutoencoderMemoryOptions o = options();
  o.dtype = torch::kBFloat16;
  for (const AutoencoderKLConfig& c : {AutoencoderKLConfig{}.shrunk(), small()}) {
    torch::manual_seed(0);
    AutoencoderKL vae(c);
    vae->eval();
    vae->to(torch::kBFloat16);
    const std::string what = std::to_string(c.block_out_channels.back()) + "-channel VAE at 64² in bf16";
    const torch::Tensor z = torch::randn({1, c.latent_channels, 8, 8}).to(torch::kBFloat16);
    const auto rule = memory::CpuRule::autoencoder;
    expect_bf16(predicted_decode_bytes(c, {1, 1, 64, 64}, o), measured_peak(tracker, [&] { vae->decode(z); }),
                what + " decode", rule);
    const torch::Tensor x = (torch::rand({1, 3, 64, 64}) * 2 - 1).to(torch::kBFloat16);
    expect_bf16(predicted_encode_bytes(c, {1, 1, 64, 64}, o), measured_peak(tracker, [&] { vae->encode(x); }),
                what + " encode", rule);
  }
}

// On two threads, where the CPU's kernels change: oneDNN takes the 1x1 convolutions (one thread leaves them
// to the slow kernel) and the attention keeps a block per thread. The small AutoencoderKL (64 -> 32 and
// 32 -> 64 shortcuts) and the tiny Qwen-Image one (its attention's 1x1 qkv widens 32 channels to 96) at 128²,
// float32 (exact) and bf16 (the bound measured on this ISA). Checked on AVX-512 CPUs, where the two-thread
// 1x1 rules were measured.
TEST(AutoencoderMemory, PredictedPeaksOnTwoThreadsMatchTheAllocator) {
  if (memory::cpu_channel_block() != 16) GTEST_SKIP() << "the two-thread 1x1 rules were measured on AVX-512";
  at::set_num_threads(2);
  memory::CpuMemoryTracker tracker;
  torch::NoGradGuard no_grad;
  for (auto dtype : {torch::kFloat, torch::kBFloat16}) {
    torch::manual_seed(0);
    AutoencoderKL vae(small());
    vae->eval();
    vae->to(dtype);
    AutoencoderMemoryOptions o = options();
    o.dtype = dtype;
    const std::string how = std::string(" at 128² on 2 threads in ") + (dtype == torch::kFloat ? "float32" : "bf16");
    const std::string what = "64-channel VAE" + how;
    const auto expect = [&](int64_t predicted, int64_t measured, const std::string& which) {
      if (dtype == torch::kFloat) return expect_close(predicted, measured, which);
      expect_bf16(predicted, measured, which, memory::CpuRule::autoencoder);
    };
    const torch::Tensor z = torch::randn({1, 16, 16, 16}).to(dtype);
    expect(predicted_decode_bytes(small(), {1, 1, 128, 128}, o), measured_peak(tracker, [&] { vae->decode(z); }),
           what + " decode");
    const torch::Tensor x = (torch::rand({1, 3, 128, 128}) * 2 - 1).to(dtype);
    expect(predicted_encode_bytes(small(), {1, 1, 128, 128}, o), measured_peak(tracker, [&] { vae->encode(x); }),
           what + " encode");
    QwenImageVae qwen(QwenImageVaeConfig::tiny());  // its attention's 1x1 qkv widens the channels
    qwen->eval();
    qwen->to(dtype);
    expect(predicted_decode_bytes(QwenImageVaeConfig::tiny(), {1, 1, 128, 128}, o),
           measured_peak(tracker, [&] { qwen->decode(z); }), "tiny Qwen-Image VAE" + how + " decode");
    expect(predicted_encode_bytes(QwenImageVaeConfig::tiny(), {1, 1, 128, 128}, o),
           measured_peak(tracker, [&] { qwen->encode(x); }), "tiny Qwen-Image VAE" + how + " encode");
  }
  at::set_num_threads(1);
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
    expect_close(predicted_decode_bytes(small(), {1, 1, side, side}, options(), 128), tiled,
                 "tiled at " + std::to_string(side));
    EXPECT_LT(predicted_decode_bytes(small(), {1, 1, side, side}, options(), 128),
              predicted_decode_bytes(small(), {1, 1, side, side}, options()));
  }
}

// The DCT stand-in's encode and decode are walked too (its own code on meta tensors, its basis beside them):
// what the allocator measures, where a formula stood before 2026-12-05.
TEST(DctCodecMemory, TheWalkedEncodeAndDecodeAreWhatTheAllocatorMeasures) {
  at::set_num_threads(1);
  memory::CpuMemoryTracker tracker;
  torch::NoGradGuard no_grad;
  for (const int64_t channels : {int64_t{16}, int64_t{4}}) {
    DctCodec dct(channels);
    CodecSpec spec;
    spec.latent_channels = channels;
    for (const auto& [batch, side] : {std::pair<int64_t, int64_t>{1, 64}, {2, 128}}) {
      const std::string what =
          std::to_string(channels) + " channels, " + std::to_string(batch) + " x " + std::to_string(side) + "²";
      const torch::Tensor frames = torch::rand({batch, 3, 1, side, side}) * 2 - 1;
      // The encode's scale is a wrapped scalar, a one-value CPU tensor the walk's meta ops do not make (a GPU's
      // kernels take it as an argument): the CPU holds its few bytes at the peak.
      const int64_t encode = measured_peak(tracker, [&] { dct.encode(frames); });
      EXPECT_LE(spec.encode_bytes({batch, 1, side, side}, true), encode) << what;
      EXPECT_GE(spec.encode_bytes({batch, 1, side, side}, true), encode - 16) << what;
      const torch::Tensor z = torch::randn({batch, channels, side / 8, side / 8});
      EXPECT_EQ(spec.decode_bytes({batch, 1, side, side}, true), measured_peak(tracker, [&] { dct.decode(z); }))
          << what;
    }
  }
}

TEST(QwenImageVaeMemory, WeightBytesEqualTheBuiltNetworks) {
  for (const QwenImageVaeConfig& c : {QwenImageVaeConfig::preset(), QwenImageVaeConfig::tiny()}) {
    QwenImageVae vae(c);
    EXPECT_EQ(autoencoder_weight_bytes(c, torch::kFloat), weight_bytes(*vae)) << c.base_dim;
    EXPECT_EQ(autoencoder_weight_bytes(c, torch::kBFloat16) * 2, weight_bytes(*vae));
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
    expect_close(predicted_decode_bytes(k.config, {1, 1, k.side, k.side}, options(), k.tile),
                 measured_peak(tracker, [&] { vae->decode(z); }), what + " decode");
    if (k.tile) {
      EXPECT_LT(predicted_decode_bytes(k.config, {1, 1, k.side, k.side}, options(), k.tile),
                predicted_decode_bytes(k.config, {1, 1, k.side, k.side}, options()) * 6 / 10);
      continue;
    }
    const torch::Tensor x = torch::rand({1, 3, k.side, k.side}) * 2 - 1;
    expect_close(predicted_encode_bytes(k.config, {1, 1, k.side, k.side}, options()),
                 measured_peak(tracker, [&] { vae->encode(x); }), what + " encode");
  }
}

// The convolution's meta kernel (nn::convolution on meta, memory::cpu_convolution_temporaries) against
// the CPU's kernel, one convolution at a time: the peak above the live set within 1%, for the kernels
// PyTorch picks here — oneDNN's blocked copies (whole and partial channel blocks, narrow inputs, strided),
// slow_conv2d (small inputs on one thread), 1x1 kernels on either — in float32, and in bf16 within the bound
// measured on this ISA (memory::cpu_bf16_bound). The two-thread 1x1 rules were measured on an AVX-512 CPU
// and are checked there.
TEST(ConvolutionMemory, TheMetaKernelHoldsWhatTheCpuKernelHolds) {
  memory::CpuMemoryTracker tracker;
  torch::NoGradGuard no_grad;
  struct Case {
    int64_t in, out, side, kernel, stride, batch;
  };
  const std::vector<Case> cases = {{64, 3, 64, 3, 1, 1},  {64, 64, 64, 3, 1, 1},  {16, 64, 8, 3, 1, 1},
                                   {3, 64, 64, 3, 1, 1},  {64, 32, 64, 3, 1, 2},  {24, 40, 32, 3, 1, 1},
                                   {24, 32, 32, 3, 1, 1}, {64, 64, 65, 3, 2, 1},  {64, 64, 64, 1, 1, 1},
                                   {16, 3, 64, 1, 1, 2},  {128, 64, 64, 1, 1, 1}, {32, 256, 64, 1, 1, 1},
                                   {8, 8, 64, 1, 1, 1},   {128, 128, 16, 1, 1, 1}};
  const std::vector<torch::ScalarType> dtypes = {torch::kFloat, torch::kBFloat16};
  const memory::CpuRuleBound bf16 = memory::cpu_bf16_bound(memory::CpuRule::convolution);
  std::printf("%s\n", memory::describe(memory::CpuRule::convolution).c_str());
  const std::vector<int> threads = memory::cpu_channel_block() == 16 ? std::vector<int>{1, 2} : std::vector<int>{1};
  for (int t : threads)
    for (auto dtype : dtypes)
      for (const Case& c : cases) {
        at::set_num_threads(t);
        const int64_t padding = c.stride == 1 ? c.kernel / 2 : 0;
        const torch::Tensor w = torch::randn({c.out, c.in, c.kernel, c.kernel}).to(dtype);
        const torch::Tensor b = torch::randn({c.out}).to(dtype);
        const torch::Tensor x = torch::randn({c.batch, c.in, c.side, c.side}).to(dtype);
        const int64_t measured = measured_peak(tracker, [&] { nn::convolution(x, w, b, {c.stride}, {padding}); });
        auto meta = [](const torch::Tensor& t) { return torch::empty(t.sizes(), t.options().device(torch::kMeta)); };
        const torch::Tensor xm = meta(x), wm = meta(w), bm = meta(b);
        memory::MetaCount count(c10::kCPU);
        nn::convolution(xm, wm, bm, {c.stride}, {padding});
        const std::string what = std::string(dtype == torch::kFloat ? "float32 " : "bf16 ") + std::to_string(c.in) +
                                 "->" + std::to_string(c.out) + " " + std::to_string(c.kernel) + "x" +
                                 std::to_string(c.kernel) + " at " + std::to_string(c.side) + "², batch " +
                                 std::to_string(c.batch) + ", " + std::to_string(t) + " thread(s)";
        const double ratio = static_cast<double>(count.peak()) / static_cast<double>(measured);
        const double low = dtype == torch::kFloat ? 0.99 : bf16.low, high = dtype == torch::kFloat ? 1.01 : bf16.high;
        EXPECT_GE(ratio, low) << what << ": predicted " << count.peak() << ", measured " << measured;
        EXPECT_LE(ratio, high) << what << ": predicted " << count.peak() << ", measured " << measured;
      }
  at::set_num_threads(1);
}

}  // namespace
}  // namespace gclab::vae
