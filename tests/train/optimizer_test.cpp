// Each optimizer's update against its reference's rule written out element by element (torch.optim.AdamW,
// torch.optim.Adam, lion-pytorch's Lion, torch.optim.SGD), over three steps; the 8-bit variants against
// their float32 rule within quantization error; state sizes as the header says.
#include "gclab/train/optimizer.h"

#include <gtest/gtest.h>

#include <cmath>

namespace gclab::train {
namespace {

using config::OptimizerKind;

struct Trained {
  torch::Tensor param;
  int64_t state_bytes = 0;
};

// Three steps on a 300-value parameter with fixed gradients.
Trained run(OptimizerKind kind, const OptimizerOptions& o, double lr) {
  torch::manual_seed(11);
  torch::Tensor p = torch::randn({300}).requires_grad_(true);
  const std::vector<torch::Tensor> grads = {torch::randn({300}), torch::randn({300}), torch::randn({300})};
  auto opt = make_optimizer(kind, {{"w", p}}, o);
  for (const auto& g : grads) {
    p.mutable_grad() = g.clone();
    opt->step(lr);
    opt->zero_grad();
  }
  return {p.detach().clone(), opt->state_bytes()};
}

// The reference rules, one element at a time, in double precision.
torch::Tensor reference(OptimizerKind kind, const OptimizerOptions& o, double lr) {
  torch::manual_seed(11);
  const torch::Tensor p0 = torch::randn({300});
  const std::vector<torch::Tensor> grads = {torch::randn({300}), torch::randn({300}), torch::randn({300})};
  std::vector<double> p(300), m(300, 0.0), v(300, 0.0);
  for (int i = 0; i < 300; ++i) p[i] = p0[i].item<double>();
  for (int step = 1; step <= 3; ++step) {
    for (int i = 0; i < 300; ++i) {
      double g = grads[step - 1][i].item<double>();
      switch (kind) {
        case OptimizerKind::adamw:
        case OptimizerKind::adam: {
          if (kind == OptimizerKind::adamw)
            p[i] *= 1 - lr * o.weight_decay;
          else
            g += o.weight_decay * p[i];
          m[i] = o.beta1 * m[i] + (1 - o.beta1) * g;
          v[i] = o.beta2 * v[i] + (1 - o.beta2) * g * g;
          const double mhat = m[i] / (1 - std::pow(o.beta1, step));
          const double denom = std::sqrt(v[i]) / std::sqrt(1 - std::pow(o.beta2, step)) + o.eps;
          p[i] -= lr * mhat / denom;
          break;
        }
        case OptimizerKind::lion: {
          p[i] *= 1 - lr * o.weight_decay;
          const double c = o.beta1 * m[i] + (1 - o.beta1) * g;
          p[i] -= lr * ((c > 0) - (c < 0));
          m[i] = o.beta2 * m[i] + (1 - o.beta2) * g;
          break;
        }
        default:  // sgd
          p[i] -= lr * (g + o.weight_decay * p[i]);
      }
    }
  }
  return torch::tensor(p).to(torch::kFloat);
}

TEST(Optimizers, EachRuleMatchesItsReference) {
  for (auto kind : {OptimizerKind::adamw, OptimizerKind::adam, OptimizerKind::lion, OptimizerKind::sgd}) {
    OptimizerOptions o = default_options(kind);
    o.weight_decay = 0.05;  // exercised by every rule
    const Trained r = run(kind, o, 1e-2);
    const torch::Tensor want = reference(kind, o, 1e-2);
    EXPECT_TRUE(torch::allclose(r.param, want, 1e-5, 1e-6))
        << config::name_of(kind) << ": " << (r.param - want).abs().max().item<double>();
  }
}

TEST(Optimizers, EightBitStateFollowsTheFloat32RuleAndIsAQuarterOfItsSize) {
  const std::pair<OptimizerKind, OptimizerKind> pairs[] = {{OptimizerKind::adamw8bit, OptimizerKind::adamw},
                                                           {OptimizerKind::adam8bit, OptimizerKind::adam},
                                                           {OptimizerKind::lion8bit, OptimizerKind::lion}};
  for (const auto& [q, f] : pairs) {
    const OptimizerOptions o = default_options(f);
    const Trained quantized = run(q, o, 1e-3), full = run(f, o, 1e-3);
    // Three steps of lr 1e-3 move each value by at most ~3e-3; the 8-bit moments stay within a few %.
    EXPECT_LT((quantized.param - full.param).abs().max().item<double>(), 3e-4) << config::name_of(q);
    // 300 values: 2 blocks of 256 a moment, a byte a value and a float32 a block.
    const int64_t moments = f == OptimizerKind::lion ? 1 : 2;
    EXPECT_EQ(full.state_bytes, moments * 300 * 4) << config::name_of(f);
    EXPECT_EQ(quantized.state_bytes, moments * (512 + 2 * 4)) << config::name_of(q);
  }
  EXPECT_EQ(run(OptimizerKind::sgd, default_options(OptimizerKind::sgd), 1e-3).state_bytes, 0);
}

TEST(Optimizers, DefaultsAreEachReferencesOwn) {
  EXPECT_DOUBLE_EQ(default_options(OptimizerKind::adamw).weight_decay, 0.01);
  EXPECT_DOUBLE_EQ(default_options(OptimizerKind::adam).weight_decay, 0.0);
  EXPECT_DOUBLE_EQ(default_options(OptimizerKind::lion).beta2, 0.99);
  EXPECT_DOUBLE_EQ(default_options(OptimizerKind::lion).weight_decay, 0.0);
}

}  // namespace
}  // namespace gclab::train
