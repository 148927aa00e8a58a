// The checkpoint and memory parts on CUDA: the same checks as on the CPU where a GPU is present
// (scripts/gpu/check.sh runs them there); skipped elsewhere, so CI never depends on a GPU.
#include <ATen/autocast_mode.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "../support/toy_blocks.h"
#include "gclab/ckpt/policy.h"
#include "gclab/memory/tracker.h"

namespace {

using gclab::ckpt::CheckpointPolicy;
using gclab::testing::ToyBlockOptions;
using gclab::testing::ToyStack;

#define GCLAB_REQUIRE_CUDA() \
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device"

struct Step {
  torch::Tensor loss;
  std::vector<torch::Tensor> grads;
};

Step cuda_step(ToyStack& stack, const std::string& policy, const torch::Tensor& x, bool autocast = false) {
  gclab::ckpt::apply_checkpoint_policy(stack.blocks, CheckpointPolicy::parse(policy));
  stack.zero_grad();
  torch::manual_seed(5);  // seeds the CUDA generators too
  torch::Tensor loss;
  {
    at::autocast::set_autocast_enabled(at::kCUDA, autocast);
    at::autocast::set_autocast_dtype(at::kCUDA, at::kBFloat16);
    loss = stack.forward(x).to(torch::kFloat).pow(2).mean();
    at::autocast::set_autocast_enabled(at::kCUDA, false);
    at::autocast::clear_cache();
  }
  loss.backward();
  return {loss.detach().cpu(), [&] {
            std::vector<torch::Tensor> g;
            for (const auto& t : stack.grads()) g.push_back(t.cpu());
            return g;
          }()};
}

}  // namespace

TEST(CheckpointCuda, DropoutOnTheGpuIsReplayedSoGradientsAreEqual) {
  GCLAB_REQUIRE_CUDA();
  ToyBlockOptions o;
  o.dropout = 0.3;
  ToyStack stack(3, o, 1);
  stack.to(torch::kCUDA);
  const torch::Tensor x = torch::randn({2, 64, 64}, torch::kCUDA);
  const Step off = cuda_step(stack, "off", x);
  for (const std::string policy : {"full", "every:2", "selective:attn", "selective:mlp", "offload"}) {
    const Step on = cuda_step(stack, policy, x);
    // GPU kernels may reduce in another order on a recompute; the dropout masks must be the same, which
    // the tolerance (far below one masked element's contribution) checks.
    EXPECT_TRUE(torch::allclose(off.loss, on.loss, 1e-6, 1e-7)) << policy;
    ASSERT_EQ(off.grads.size(), on.grads.size());
    for (std::size_t i = 0; i < off.grads.size(); ++i)
      EXPECT_TRUE(torch::allclose(off.grads[i], on.grads[i], 1e-5, 1e-6))
          << policy << " parameter " << i << ": max |diff| " << (off.grads[i] - on.grads[i]).abs().max().item<double>();
  }
}

TEST(CheckpointCuda, AutocastBf16OnTheGpuIsReenteredForTheRecompute) {
  GCLAB_REQUIRE_CUDA();
  ToyBlockOptions o;
  o.dropout = 0.0;
  ToyStack stack(2, o, 3);
  stack.to(torch::kCUDA);
  const torch::Tensor x = torch::randn({2, 64, 64}, torch::kCUDA);
  const Step off = cuda_step(stack, "off", x, /*autocast=*/true);
  const Step full = cuda_step(stack, "full", x, /*autocast=*/true);
  for (std::size_t i = 0; i < off.grads.size(); ++i)
    EXPECT_TRUE(torch::allclose(off.grads[i], full.grads[i], 2e-2, 1e-3)) << "parameter " << i;
}

TEST(MemoryCuda, AllocatorStatisticsSeeATensorAndTheCapRaisesOutOfMemory) {
  GCLAB_REQUIRE_CUDA();
  gclab::memory::MemoryMeter meter(torch::Device(torch::kCUDA, 0));
  meter.reset_peak();
  const auto before = meter.stats();
  torch::Tensor t = torch::empty({256, 1024, 1024}, torch::TensorOptions().device(torch::kCUDA));  // 1 GiB
  EXPECT_GE(meter.stats().live_bytes - before.live_bytes, int64_t{1} << 30);
  EXPECT_GE(meter.stats().peak_bytes, before.live_bytes + (int64_t{1} << 30));
  t = torch::Tensor();
  meter.set_cap(int64_t{2} << 30);  // an emulated 2 GiB card
  EXPECT_THROW(torch::empty({int64_t{3} << 28}, torch::TensorOptions().device(torch::kCUDA)), c10::OutOfMemoryError);
  torch::Tensor fits = torch::empty({int64_t{1} << 28}, torch::TensorOptions().device(torch::kCUDA));  // 1 GiB
  EXPECT_TRUE(fits.defined());
  meter.set_cap(0);
}
