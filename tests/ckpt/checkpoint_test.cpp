// The checkpoint function against the same computation without it: gradients compared, in each case
// that bites real users.
#include <ATen/autocast_mode.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "../support/toy_blocks.h"
#include "gclab/ckpt/autocast.h"
#include "gclab/ckpt/checkpoint.h"
#include "gclab/ckpt/policy.h"

namespace gclab::ckpt {
namespace {

using gclab::testing::ToyBlockOptions;
using gclab::testing::ToyStack;

struct StepResult {
  torch::Tensor loss;
  std::vector<torch::Tensor> grads;
};

// One training step of the stack under `policy`, from the same weights, input and RNG seed.
StepResult step(ToyStack& stack, const std::string& policy, const torch::Tensor& x, uint64_t rng_seed = 7) {
  apply_checkpoint_policy(stack.blocks, CheckpointPolicy::parse(policy));
  stack.zero_grad();
  torch::manual_seed(rng_seed);
  torch::Tensor loss = stack.forward(x).pow(2).mean();
  loss.backward();
  return {loss.detach(), stack.grads()};
}

void expect_bitwise_equal(const StepResult& a, const StepResult& b) {
  EXPECT_TRUE(torch::equal(a.loss, b.loss)) << a.loss.item<double>() << " vs " << b.loss.item<double>();
  ASSERT_EQ(a.grads.size(), b.grads.size());
  for (std::size_t i = 0; i < a.grads.size(); ++i) {
    ASSERT_TRUE(a.grads[i].defined() && b.grads[i].defined()) << "parameter " << i << " got no gradient";
    EXPECT_TRUE(torch::equal(a.grads[i], b.grads[i]))
        << "parameter " << i << ": max |diff| " << (a.grads[i] - b.grads[i]).abs().max().item<double>();
  }
}

TEST(Checkpoint, GradientsMatchWithoutCheckpointWhenInputIsFrozen) {
  ToyStack stack(3, ToyBlockOptions{}, 1);
  const torch::Tensor x = torch::randn({2, 16, 64});  // does not require grad: frozen input, LoRA params
  const StepResult off = step(stack, "off", x);
  const StepResult full = step(stack, "full", x);
  ASSERT_EQ(off.grads.size(), 12u);  // 4 adapter tensors per block
  expect_bitwise_equal(off, full);
  for (const auto& g : full.grads) EXPECT_GT(g.abs().sum().item<double>(), 0.0);
}

TEST(Checkpoint, DropoutIsReplayedSoGradientsAreBitwiseEqual) {
  ToyBlockOptions o;
  o.dropout = 0.3;
  ToyStack stack(2, o, 2);
  const torch::Tensor x = torch::randn({2, 16, 64});
  const StepResult off = step(stack, "off", x);
  expect_bitwise_equal(off, step(stack, "full", x));

  // The same without replaying the RNG draws other dropout masks: the test above can fail.
  for (auto& b : stack.blocks) b->options().preserve_rng = false;
  const StepResult unreplayed = step(stack, "full", x);
  bool any_differs = false;
  for (std::size_t i = 0; i < off.grads.size(); ++i) any_differs |= !torch::equal(off.grads[i], unreplayed.grads[i]);
  EXPECT_TRUE(any_differs);
}

TEST(Checkpoint, RecomputeDoesNotShiftTheRandomStreamAfterBackward) {
  ToyStack stack(2, ToyBlockOptions{}, 3);
  const torch::Tensor x = torch::randn({2, 8, 64});
  step(stack, "off", x, 11);
  const torch::Tensor after_off = torch::rand({4});
  step(stack, "full", x, 11);
  const torch::Tensor after_full = torch::rand({4});
  EXPECT_TRUE(torch::equal(after_off, after_full));
}

TEST(Checkpoint, FullTrainingGradientsIncludingInputMatch) {
  ToyBlockOptions o;
  o.frozen_base = false;
  ToyStack stack(2, o, 4);
  const torch::Tensor x0 = torch::randn({2, 8, 64});
  auto run = [&](const std::string& policy) {
    torch::Tensor x = x0.clone().requires_grad_(true);
    StepResult r = step(stack, policy, x);
    r.grads.push_back(x.grad().clone());
    return r;
  };
  expect_bitwise_equal(run("off"), run("full"));
}

TEST(Checkpoint, EveryPolicyGivesTheSameGradients) {
  ToyStack stack(4, ToyBlockOptions{}, 5);
  const torch::Tensor x = torch::randn({2, 16, 64});
  const StepResult off = step(stack, "off", x);
  for (const char* policy :
       {"full", "every:2", "first:1", "blocks:[1,3]", "selective:attn", "selective:mlp", "offload"}) {
    SCOPED_TRACE(policy);
    expect_bitwise_equal(off, step(stack, policy, x));
  }
}

TEST(Checkpoint, AutocastBf16IsReenteredForTheRecompute) {
  ToyStack stack(2, ToyBlockOptions{}, 6);
  const torch::Tensor x = torch::randn({2, 16, 64});
  auto autocast_step = [&](const std::string& policy) {
    at::autocast::set_autocast_enabled(at::kCPU, true);
    at::autocast::set_autocast_dtype(at::kCPU, at::kBFloat16);
    at::autocast::increment_nesting();
    apply_checkpoint_policy(stack.blocks, CheckpointPolicy::parse(policy));
    stack.zero_grad();
    torch::manual_seed(7);
    torch::Tensor out = stack.forward(x);
    torch::Tensor loss = out.to(torch::kFloat32).pow(2).mean();
    at::autocast::decrement_nesting();
    at::autocast::clear_cache();
    at::autocast::set_autocast_enabled(at::kCPU, false);
    loss.backward();  // outside autocast, as a training loop does
    return StepResult{loss.detach(), stack.grads()};
  };
  const StepResult fp32 = step(stack, "off", x);
  const StepResult off = autocast_step("off");
  const StepResult full = autocast_step("full");
  // Autocast really ran: bf16 matmuls move the loss far more than fp32 rounding would.
  EXPECT_GT(std::abs(off.loss.item<double>() - fp32.loss.item<double>()), 1e-5);
  EXPECT_NEAR(off.loss.item<double>(), full.loss.item<double>(), 1e-6);
  // The recompute runs the same bf16 kernels as the forward did: equal to bf16 rounding of the
  // accumulation order at most (a recompute in fp32 would differ by ~1e-2 relative).
  for (std::size_t i = 0; i < off.grads.size(); ++i) {
    const double scale = off.grads[i].abs().max().item<double>();
    EXPECT_LE((off.grads[i] - full.grads[i]).abs().max().item<double>(), 1e-3 * scale) << "parameter " << i;
  }
}

TEST(Checkpoint, SeveralInputsAndOutputsWithNonTensorArgumentsAndAnOutputWithoutGrad) {
  torch::manual_seed(0);
  const torch::Tensor w = torch::randn({8, 8}, torch::requires_grad());
  const double scale = 0.5;  // a non-tensor argument, captured
  BlockFn fn = [&](const std::vector<torch::Tensor>& in) {
    torch::Tensor a = torch::matmul(in[0], w) * scale + in[1];
    torch::Tensor mask = (a > 0).to(torch::kLong);  // integer output: never requires grad
    return std::vector<torch::Tensor>{a.tanh(), mask, a.sum(-1)};
  };
  const torch::Tensor x0 = torch::randn({4, 8}), y0 = torch::randn({4, 8});
  auto grads = [&](bool use_ckpt) {
    torch::Tensor x = x0.clone().requires_grad_(true), y = y0.clone().requires_grad_(true);
    w.mutable_grad() = torch::Tensor();
    auto out = use_ckpt ? checkpoint(fn, {x, y}, {w}) : fn({x, y});
    EXPECT_FALSE(out[1].requires_grad());
    (out[0].sum() + out[2].pow(2).sum()).backward();
    return std::vector<torch::Tensor>{x.grad(), y.grad(), w.grad()};
  };
  const auto plain = grads(false), ckpt = grads(true);
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(torch::equal(plain[i], ckpt[i])) << i;
}

// An output nothing downstream uses (Qwen-Image's last block's text stream): the parameters only it reads
// get no gradient — as without checkpointing, and as torch.utils.checkpoint's non-reentrant mode (which
// diffusers' gradient checkpointing uses) leaves them — so the optimizer makes them no state.
TEST(Checkpoint, AParameterOnlyAnUnusedOutputReadsGetsNoGradient) {
  torch::manual_seed(0);
  const torch::Tensor used = torch::randn({8, 8}, torch::requires_grad());
  const torch::Tensor unused = torch::randn({8, 8}, torch::requires_grad());
  BlockFn fn = [&](const std::vector<torch::Tensor>& in) {
    return std::vector<torch::Tensor>{torch::matmul(in[0], used), torch::matmul(in[0], unused)};
  };
  const torch::Tensor x0 = torch::randn({4, 8});
  for (const bool use_ckpt : {false, true}) {
    used.mutable_grad() = torch::Tensor(), unused.mutable_grad() = torch::Tensor();
    const torch::Tensor x = x0.clone().requires_grad_(true);
    const auto out = use_ckpt ? checkpoint(fn, {x}, {used, unused}) : fn({x});
    out[0].pow(2).sum().backward();
    EXPECT_TRUE(used.grad().defined()) << use_ckpt;
    EXPECT_FALSE(unused.grad().defined()) << use_ckpt;
  }
}

TEST(Checkpoint, GradModeOffIsAPlainCall) {
  const torch::Tensor w = torch::randn({4, 4}, torch::requires_grad());
  int calls = 0;
  BlockFn fn = [&](const std::vector<torch::Tensor>& in) {
    ++calls;
    return std::vector<torch::Tensor>{torch::matmul(in[0], w)};
  };
  torch::NoGradGuard no_grad;
  const auto out = checkpoint(fn, {torch::randn({2, 4})}, {w});
  EXPECT_EQ(calls, 1);
  EXPECT_FALSE(out[0].requires_grad());
  EXPECT_FALSE(out[0].grad_fn());
}

TEST(Checkpoint, NestedCheckpointsGiveTheSameGradients) {
  torch::manual_seed(1);
  const torch::Tensor w1 = torch::randn({8, 8}, torch::requires_grad()),
                      w2 = torch::randn({8, 8}, torch::requires_grad());
  BlockFn inner = [&](const std::vector<torch::Tensor>& in) {
    return std::vector<torch::Tensor>{torch::matmul(in[0], w2).sin()};
  };
  auto outer = [&](bool nested) {
    return BlockFn([&, nested](const std::vector<torch::Tensor>& in) {
      torch::Tensor h = torch::matmul(in[0], w1).relu();
      return nested ? checkpoint(inner, {h}, {w2}) : inner({h});
    });
  };
  const torch::Tensor x = torch::randn({3, 8});
  auto grads = [&](bool use) {
    w1.mutable_grad() = torch::Tensor();
    w2.mutable_grad() = torch::Tensor();
    auto out = use ? checkpoint(outer(true), {x}, {w1, w2}) : outer(false)({x});
    out[0].sum().backward();
    return std::make_pair(w1.grad().clone(), w2.grad().clone());
  };
  const auto plain = grads(false), nested = grads(true);
  EXPECT_TRUE(torch::equal(plain.first, nested.first));
  EXPECT_TRUE(torch::equal(plain.second, nested.second));
}

TEST(Checkpoint, AutogradGradWorksThroughACheckpointedRegion) {
  const torch::Tensor w = torch::randn({6, 6}, torch::requires_grad());
  BlockFn fn = [&](const std::vector<torch::Tensor>& in) {
    return std::vector<torch::Tensor>{torch::matmul(in[0], w).tanh()};
  };
  const torch::Tensor x = torch::randn({2, 6}, torch::requires_grad());
  const auto plain = torch::autograd::grad({fn({x})[0].sum()}, {x, w});
  const auto through = torch::autograd::grad({checkpoint(fn, {x}, {w})[0].sum()}, {x, w});
  EXPECT_TRUE(torch::equal(plain[0], through[0]));
  EXPECT_TRUE(torch::equal(plain[1], through[1]));
  EXPECT_FALSE(w.grad().defined());  // grad() returns gradients, it does not accumulate them
}

TEST(Checkpoint, BackwardWithRetainGraphCanRunTwice) {
  const torch::Tensor w = torch::randn({5, 5}, torch::requires_grad());
  BlockFn fn = [&](const std::vector<torch::Tensor>& in) {
    return std::vector<torch::Tensor>{torch::matmul(in[0], w).exp()};
  };
  const torch::Tensor x = torch::randn({3, 5});
  torch::Tensor loss = fn({x})[0].sum();
  loss.backward();
  const torch::Tensor once = w.grad().clone();
  w.mutable_grad() = torch::Tensor();
  torch::Tensor ck = checkpoint(fn, {x}, {w})[0].sum();
  ck.backward({}, /*retain_graph=*/true);
  ck.backward();
  EXPECT_TRUE(torch::allclose(w.grad(), 2 * once));
}

TEST(Checkpoint, NondeterministicRecomputeRaisesWithTheBlockName) {
  const torch::Tensor w = torch::randn({4, 4}, torch::requires_grad());
  int calls = 0;
  BlockFn fn = [&](const std::vector<torch::Tensor>& in) {
    torch::Tensor y = torch::matmul(in[0], w);
    return std::vector<torch::Tensor>{++calls == 1 ? y : y.narrow(0, 0, 1)};  // shape changes on recompute
  };
  torch::Tensor out = checkpoint(fn, {torch::randn({2, 4})}, {w}, CheckpointOptions().with_name("blocks.7"))[0];
  try {
    out.sum().backward();
    FAIL() << "expected the determinism check to fire";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("blocks.7"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("recompute"), std::string::npos) << e.what();
  }
}

TEST(Checkpoint, DeterminismCheckCanBeSwitchedOff) {
  const torch::Tensor w = torch::randn({4, 4}, torch::requires_grad());
  int calls = 0;
  BlockFn fn = [&](const std::vector<torch::Tensor>& in) {
    ++calls;
    return std::vector<torch::Tensor>{torch::matmul(in[0], w) * (calls == 1 ? 1.0 : 1.0)};
  };
  torch::Tensor out = checkpoint(fn, {torch::randn({2, 4})}, {w}, CheckpointOptions().with_determinism_check(false))[0];
  EXPECT_NO_THROW(out.sum().backward());
  EXPECT_EQ(calls, 2);  // forward + recompute
}

}  // namespace
}  // namespace gclab::ckpt

namespace gclab::ckpt {
namespace {

// An exception inside an autocast scope (out of memory in forward) leaves autocast as it was.
TEST(Autocast, AScopeRestoresTheStateWhenItsRegionThrows) {
  ASSERT_FALSE(at::autocast::is_autocast_enabled(at::kCPU));
  try {
    AutocastScope autocast(AutocastState::enabled_for(c10::DeviceType::CPU, at::kBFloat16));
    ASSERT_TRUE(at::autocast::is_autocast_enabled(at::kCPU));
    throw c10::OutOfMemoryError({__func__, __FILE__, __LINE__}, "emulated");
  } catch (const c10::OutOfMemoryError&) {
  }
  EXPECT_FALSE(at::autocast::is_autocast_enabled(at::kCPU));
}

}  // namespace
}  // namespace gclab::ckpt
