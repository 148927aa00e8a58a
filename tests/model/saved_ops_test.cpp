// selective:ops at the level of one op: a Linear's matmul and attention kept by a checkpoint's forward and
// replayed by its recompute give the gradients the ops' own autograd gives, and their FLOPs are not run again.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "gclab/ckpt/checkpoint.h"
#include "gclab/memory/flops.h"
#include "gclab/nn/layers.h"
#include "gclab/nn/meta_kernels.h"

namespace gclab::nn {
namespace {

struct Grads {
  std::vector<torch::Tensor> values;
  double backward_flops = 0;  // what the backward ran (a recompute's matmuls, attention)
};

// loss = Σ fn(inputs) · weights, backward; the gradients of `leaves` in order. `mode`: plain, full or ops.
Grads run(const ckpt::BlockFn& fn, const std::vector<torch::Tensor>& inputs, const std::vector<torch::Tensor>& leaves,
          const std::string& mode) {
  for (const auto& t : leaves) t.mutable_grad() = torch::Tensor();
  std::vector<torch::Tensor> params;
  for (const auto& t : leaves)
    if (std::none_of(inputs.begin(), inputs.end(), [&](const auto& x) { return x.is_same(t); })) params.push_back(t);
  const std::vector<torch::Tensor> out =
      mode == "plain" ? fn(inputs)
                      : ckpt::checkpoint(fn, inputs, params, ckpt::CheckpointOptions().with_save_ops(mode == "ops"));
  torch::manual_seed(3);
  const torch::Tensor loss = (out[0] * torch::randn(out[0].sizes())).sum();
  Grads g;
  {
    memory::FlopCount flops;
    loss.backward();
    g.backward_flops = flops.total();
  }
  for (const auto& t : leaves) g.values.push_back(t.grad().clone());
  return g;
}

void expect_equal(const Grads& a, const Grads& b, const std::string& what) {
  ASSERT_EQ(a.values.size(), b.values.size());
  for (size_t i = 0; i < a.values.size(); ++i)
    EXPECT_TRUE(torch::equal(a.values[i], b.values[i]))
        << what << " gradient " << i << ": max |diff| " << (a.values[i] - b.values[i]).abs().max().item<double>();
}

TEST(SavedOps, ALinearReplayedGivesAtLinearsGradientsAndRunsNoMatmulAgain) {
  // frozen: 0 everything trained, 1 the weight frozen (the bias trained), 2 both frozen (LoRA's base).
  for (const bool bias : {true, false})
    for (const int frozen : {0, 1, 2})
      for (const std::vector<int64_t>& shape :
           {std::vector<int64_t>{6, 16}, std::vector<int64_t>{2, 5, 16}, std::vector<int64_t>{5, 2, 16}}) {
        const bool strided = shape[0] == 5;  // transposed to [2, 5, 16] inside the block: not contiguous
        const std::string what = std::string(bias ? "bias" : "no bias") + ", frozen " + std::to_string(frozen) +
                                 ", input of " + std::to_string(shape.size()) + " axes" +
                                 (strided ? ", not contiguous" : "");
        torch::manual_seed(0);
        Linear linear(LinearOptions(16, 24).bias(bias));
        std::vector<torch::Tensor> leaves;
        torch::Tensor x = torch::randn(shape).requires_grad_(true);
        leaves.push_back(x);
        linear->weight.requires_grad_(frozen == 0);
        if (frozen == 0) leaves.push_back(linear->weight);
        if (bias) {
          linear->bias.requires_grad_(frozen < 2);
          if (frozen < 2) leaves.push_back(linear->bias);
        }
        const ckpt::BlockFn fn = [&](const std::vector<torch::Tensor>& in) {
          const torch::Tensor h = strided ? in[0].transpose(0, 1) * 2 : torch::layer_norm(in[0], {16});
          return std::vector<torch::Tensor>{torch::gelu(linear(h))};
        };
        const Grads plain = run(fn, {x}, leaves, "plain"), full = run(fn, {x}, leaves, "full"),
                    ops = run(fn, {x}, leaves, "ops");
        expect_equal(plain, ops, what);
        EXPECT_GT(full.backward_flops, 0) << what;  // full runs the matmul again
        EXPECT_EQ(ops.backward_flops, 0) << what;   // selective:ops does not
      }
}

// A quantized frozen weight (LoRA on a quantized base, AI Toolkit's 24 GB recipes): the qfloat8 Linear's
// output replayed through its own autograd function's backward, a uint4 / float8 one's through at::linear's
// with the weight dequantized again in the recompute.
TEST(SavedOps, AQuantizedLinearReplayedGivesItsGradients) {
  for (const WeightStorage storage : {WeightStorage::QFloat8, WeightStorage::UInt4, WeightStorage::Float8}) {
    torch::manual_seed(5);
    Linear linear(LinearOptions(32, 48));
    linear->set_weight_storage(storage);
    torch::Tensor x = torch::randn({3, 4, 32}).requires_grad_(true);
    const ckpt::BlockFn fn = [&](const std::vector<torch::Tensor>& in) {
      return std::vector<torch::Tensor>{torch::gelu(linear(torch::layer_norm(in[0], {32})))};
    };
    const Grads plain = run(fn, {x}, {x}, "plain"), ops = run(fn, {x}, {x}, "ops");
    expect_equal(plain, ops, "storage " + std::to_string(static_cast<int>(storage)));
    EXPECT_EQ(ops.backward_flops, 0);
  }
}

TEST(SavedOps, AttentionReplayedOnTheCpuGivesTheKernelsGradients) {
  for (const bool masked : {false, true}) {
    torch::manual_seed(1);
    const int64_t B = 2, H = 2, L = 7, D = 8;
    Linear qkv(LinearOptions(H * D, 3 * H * D));
    torch::Tensor x = torch::randn({B, L, H * D}).requires_grad_(true);
    const torch::Tensor mask = masked ? torch::randn({B, 1, L, L}) : torch::Tensor();
    const ckpt::BlockFn fn = [&](const std::vector<torch::Tensor>& in) {
      const auto parts = qkv(in[0]).view({B, L, 3, H, D}).permute({2, 0, 3, 1, 4});
      const torch::Tensor q = torch::rms_norm(parts[0], {D}), k = torch::rms_norm(parts[1], {D});
      return std::vector<torch::Tensor>{attention(q, k, parts[2], mask).transpose(1, 2).reshape({B, L, H * D})};
    };
    std::vector<torch::Tensor> leaves = {x};
    for (auto& p : qkv->parameters()) leaves.push_back(p);
    const Grads plain = run(fn, {x}, leaves, "plain"), ops = run(fn, {x}, leaves, "ops");
    expect_equal(plain, ops, masked ? "masked" : "unmasked");
    EXPECT_EQ(ops.backward_flops, 0);
  }
}

// An output changed in place after its op (here by the block itself) has lost the value the backward needs: it
// is not kept, and the op runs again.
TEST(SavedOps, AnOutputChangedInPlaceIsRunAgain) {
  torch::manual_seed(2);
  Linear linear(LinearOptions(16, 16));
  torch::Tensor x = torch::randn({4, 16}).requires_grad_(true);
  const ckpt::BlockFn fn = [&](const std::vector<torch::Tensor>& in) {
    torch::Tensor y = linear(in[0]);
    y.mul_(2);
    return std::vector<torch::Tensor>{torch::tanh(y)};
  };
  std::vector<torch::Tensor> leaves = {x};
  for (auto& p : linear->parameters()) leaves.push_back(p);
  const Grads plain = run(fn, {x}, leaves, "plain"), ops = run(fn, {x}, leaves, "ops");
  expect_equal(plain, ops, "in place");
  EXPECT_GT(ops.backward_flops, 0);
}

}  // namespace
}  // namespace gclab::nn
