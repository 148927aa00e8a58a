// The tracking allocator's numbers against tensors of known size, the emulated cap, and what
// checkpointing does to the activations kept between forward and backward.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "../support/toy_blocks.h"
#include "gclab/ckpt/policy.h"
#include "gclab/memory/tracker.h"

namespace gclab::memory {
namespace {

constexpr std::int64_t kMiB = 1 << 20;

TEST(MemoryTracker, CountsTensorsOfKnownSizeExactly) {
  CpuMemoryTracker tracker;
  const std::int64_t before = tracker.stats().live_bytes;
  {
    torch::Tensor a = torch::empty({1024, 256}, torch::kFloat32);  // 1 MiB
    EXPECT_EQ(tracker.stats().live_bytes - before, kMiB);
    torch::Tensor b = torch::empty({512, 512}, torch::kBFloat16);  // 0.5 MiB
    EXPECT_EQ(tracker.stats().live_bytes - before, kMiB + kMiB / 2);
    EXPECT_GE(tracker.stats().peak_bytes - before, kMiB + kMiB / 2);
  }
  EXPECT_EQ(tracker.stats().live_bytes, before);
  tracker.reset_peak();
  EXPECT_EQ(tracker.stats().peak_bytes, before);
}

TEST(MemoryTracker, PhasePeaksSeeTemporaries) {
  CpuMemoryTracker tracker;
  PhaseMeter phases{MemoryMeter(c10::Device(c10::kCPU))};
  const std::int64_t base = tracker.stats().live_bytes;
  {
    auto scope = phases.phase(Phase::forward);
    torch::Tensor t = torch::empty({4 * kMiB / 4}, torch::kFloat32);  // 4 MiB, freed inside the phase
  }
  {
    auto scope = phases.phase(Phase::optimizer);
    torch::Tensor t = torch::empty({kMiB / 4}, torch::kFloat32);  // 1 MiB
  }
  EXPECT_EQ(phases.peaks().at(Phase::forward) - base, 4 * kMiB);
  EXPECT_EQ(phases.peaks().at(Phase::optimizer) - base, kMiB);
}

TEST(MemoryTracker, CapRaisesTheGpuOutOfMemoryErrorAndTheProcessGoesOn) {
  CpuMemoryTracker tracker;
  const std::int64_t base = tracker.stats().live_bytes;
  tracker.set_cap(base + 10 * kMiB);
  torch::Tensor kept = torch::empty({6 * kMiB / 4}, torch::kFloat32);  // 6 MiB: fits
  try {
    torch::Tensor too_much = torch::empty({5 * kMiB / 4}, torch::kFloat32);  // 6 + 5 > 10
    FAIL() << "the cap did not fire";
  } catch (const c10::OutOfMemoryError& e) {
    EXPECT_NE(std::string(e.what()).find("emulated cap"), std::string::npos);
  }
  EXPECT_EQ(tracker.stats().live_bytes - base, 6 * kMiB);                 // the refused block was not counted
  torch::Tensor smaller = torch::empty({3 * kMiB / 4}, torch::kFloat32);  // 6 + 3 <= 10: fine
  EXPECT_EQ(tracker.stats().live_bytes - base, 9 * kMiB);
}

TEST(MemoryTracker, CapFiresInsideBackwardAndRecompute) {
  using gclab::testing::ToyStack;
  CpuMemoryTracker tracker;
  ToyStack stack(2, gclab::testing::ToyBlockOptions{}, 1);
  gclab::ckpt::apply_checkpoint_policy(stack.blocks, gclab::ckpt::CheckpointPolicy::parse("full"));
  const torch::Tensor x = torch::randn({8, 256, 64});
  torch::Tensor loss = stack.forward(x).pow(2).mean();
  tracker.set_cap(tracker.stats().live_bytes + 64 * 1024);  // no room for a recompute
  EXPECT_THROW(loss.backward(), c10::OutOfMemoryError);
  tracker.set_cap(0);
}

// Bytes kept alive between forward and backward by the stack, under `policy`.
std::int64_t activation_bytes_kept(const std::string& policy, int blocks, const torch::Tensor& x) {
  using gclab::testing::ToyStack;
  ToyStack stack(blocks, gclab::testing::ToyBlockOptions{}, 2);
  gclab::ckpt::apply_checkpoint_policy(stack.blocks, gclab::ckpt::CheckpointPolicy::parse(policy));
  MemoryMeter meter(c10::Device(c10::kCPU));
  const std::int64_t before = meter.stats().live_bytes;
  torch::Tensor out = stack.forward(x);
  const std::int64_t kept = meter.stats().live_bytes - before - out.nbytes();
  out.pow(2).mean().backward();
  return kept;
}

TEST(MemoryTracker, FullCheckpointingKeepsOnlyBlockInputs) {
  CpuMemoryTracker tracker;
  const int L = 4;
  const torch::Tensor x = torch::randn({4, 128, 64});
  const std::int64_t off = activation_bytes_kept("off", L, x);
  const std::int64_t full = activation_bytes_kept("full", L, x);
  const std::int64_t every2 = activation_bytes_kept("every:2", L, x);
  // With every block checkpointed, what stays is each block's input (the first is x itself, which
  // already existed), plus the dropout RNG state per block (a few KiB).
  const std::int64_t input_bytes = x.nbytes();
  EXPECT_LE(full, (L - 1) * input_bytes + L * 64 * 1024);
  EXPECT_GE(full, (L - 1) * input_bytes);
  EXPECT_GT(off, 4 * full);
  EXPECT_GT(every2, full);
  EXPECT_LT(every2, off);
}

}  // namespace
}  // namespace gclab::memory
