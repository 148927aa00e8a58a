// Each optimizer's update against its reference's rule written out element by element (torch.optim.AdamW,
// torch.optim.Adam, lion-pytorch's Lion, torch.optim.SGD), over three steps; the 8-bit variants against
// their float32 rule within quantization error; state sizes as the header says.
#include "gclab/train/optimizer.h"

#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <map>

#include "gclab/io/safetensors.h"
#include "gclab/memory/meta_count.h"
#include "gclab/memory/tracker.h"

namespace gclab::train {
namespace {

using config::OptimizerKind;

struct Trained {
  torch::Tensor param;
  int64_t state_bytes = 0;
};

// Three steps on a parameter of n values (300 unless said) with fixed gradients.
Trained run(OptimizerKind kind, const OptimizerOptions& o, double lr, int64_t n = 300) {
  torch::manual_seed(11);
  torch::Tensor p = torch::randn({n}).requires_grad_(true);
  const std::vector<torch::Tensor> grads = {torch::randn({n}), torch::randn({n}), torch::randn({n})};
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

// torch's optimizers skip a parameter whose .grad is None and keep its step count as its own (state["step"]):
// a model of several experts trains one expert's adapters at a time, and an expert's first update is the
// first of its bias correction whatever the run's step. A parameter without a gradient at the first step
// then trained for two equals the same parameter trained alone for those two — also across a saved and
// reloaded state.
TEST(Optimizers, AParameterWithoutAGradientKeepsItsOwnStepCount) {
  for (auto kind : {OptimizerKind::adamw, OptimizerKind::adafactor, OptimizerKind::adamw8bit}) {
    const OptimizerOptions o = default_options(kind);
    torch::manual_seed(3);
    const torch::Tensor w0 = torch::randn({4096}), u0 = torch::randn({4096});
    std::vector<torch::Tensor> gw, gu;
    for (int i = 0; i < 3; ++i) gw.push_back(torch::randn({4096})), gu.push_back(torch::randn({4096}));
    torch::Tensor w = w0.clone().requires_grad_(true), u = u0.clone().requires_grad_(true);
    auto opt = make_optimizer(kind, {{"w", w}, {"u", u}}, o);
    w.mutable_grad() = gw[0].clone();
    opt->step(1e-2), opt->zero_grad();
    w.mutable_grad() = gw[1].clone(), u.mutable_grad() = gu[1].clone();
    opt->step(1e-2), opt->zero_grad();
    std::map<std::string, torch::Tensor> state;
    for (const auto& [name, t] : opt->state()) state[name] = t.clone();
    auto reloaded = make_optimizer(kind, {{"w", w}, {"u", u}}, o);
    reloaded->load_state(state);
    w.mutable_grad() = gw[2].clone(), u.mutable_grad() = gu[2].clone();
    reloaded->step(1e-2);
    auto alone = [&](const torch::Tensor& start, const std::vector<torch::Tensor>& grads) {
      torch::Tensor p = start.clone().requires_grad_(true);
      auto one = make_optimizer(kind, {{"p", p}}, o);
      for (const auto& g : grads) {
        p.mutable_grad() = g.clone();
        one->step(1e-2), one->zero_grad();
      }
      return p.detach();
    };
    EXPECT_TRUE(torch::equal(w.detach(), alone(w0, gw))) << config::name_of(kind);
    EXPECT_TRUE(torch::equal(u.detach(), alone(u0, {gu[1], gu[2]}))) << config::name_of(kind);
  }
}

TEST(Optimizers, EightBitStateFollowsTheFloat32RuleAndIsAQuarterOfItsSize) {
  const std::pair<OptimizerKind, OptimizerKind> pairs[] = {{OptimizerKind::adamw8bit, OptimizerKind::adamw},
                                                           {OptimizerKind::adam8bit, OptimizerKind::adam},
                                                           {OptimizerKind::lion8bit, OptimizerKind::lion}};
  for (const auto& [q, f] : pairs) {
    const OptimizerOptions o = default_options(f);
    const Trained quantized = run(q, o, 1e-3, 5000), full = run(f, o, 1e-3, 5000);
    // Three steps of lr 1e-3 move each value by at most ~3e-3; the 8-bit moments stay within a few %.
    // Lion's update is a sign: where quantization flips one, that value is 2 lr off, and rarely.
    const torch::Tensor diff = (quantized.param - full.param).abs();
    if (f == OptimizerKind::lion) {
      EXPECT_LE(diff.max().item<double>(), 6e-3 + 1e-6) << config::name_of(q);
      EXPECT_LT(diff.mean().item<double>(), 3e-5) << config::name_of(q);
    } else {
      EXPECT_LT(diff.max().item<double>(), 3e-4) << config::name_of(q);
    }
    // 5000 values: 20 blocks of 256 a moment, a byte a value and a float32 a block.
    const int64_t moments = f == OptimizerKind::lion ? 1 : 2;
    EXPECT_EQ(full.state_bytes, moments * 5000 * 4) << config::name_of(f);
    EXPECT_EQ(quantized.state_bytes, moments * (5000 + 20 * 4)) << config::name_of(q);
    // Under bitsandbytes' min_8bit_size (4096 values) the moments stay float32.
    EXPECT_EQ(run(q, o, 1e-3).state_bytes, moments * 300 * 4) << config::name_of(q);
  }
  EXPECT_EQ(run(OptimizerKind::sgd, default_options(OptimizerKind::sgd), 1e-3).state_bytes, 0);
}

TEST(Optimizers, DefaultsAreEachReferencesOwn) {
  EXPECT_DOUBLE_EQ(default_options(OptimizerKind::adamw).weight_decay, 0.01);
  EXPECT_DOUBLE_EQ(default_options(OptimizerKind::adam).weight_decay, 0.0);
  EXPECT_DOUBLE_EQ(default_options(OptimizerKind::lion).beta2, 0.99);
  EXPECT_DOUBLE_EQ(default_options(OptimizerKind::lion).weight_decay, 0.0);
  // AI Toolkit constructs Adam / AdamW (torch and bitsandbytes) with eps=1e-6 (toolkit/optimizer.py).
  for (auto kind : {OptimizerKind::adamw, OptimizerKind::adam, OptimizerKind::adamw8bit, OptimizerKind::adam8bit})
    EXPECT_DOUBLE_EQ(default_options(kind).eps, 1e-6) << config::name_of(kind);
}

// Adafactor and Prodigy against their reference implementations themselves (transformers' Adafactor, the
// rule AI Toolkit's copy applies to float32 parameters, and prodigyopt's Prodigy) in float32: a matrix
// (Adafactor factors its second moment) and a vector, six steps.
struct ReferenceCase {
  OptimizerKind kind;
  OptimizerOptions options;
  double lr;
  std::string reference_options;  // the same options as the reference's keyword arguments (JSON)
};

// Each case against its reference, every reference run in one Python process.
void expect_matches_python_reference(const std::vector<ReferenceCase>& cases) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("gclab_opt_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  torch::manual_seed(5);
  std::map<std::string, torch::Tensor> params = {{"matrix", torch::randn({24, 40})}, {"vector", torch::randn({40})}};
  std::vector<std::pair<std::string, torch::Tensor>> file;
  std::map<std::string, torch::Tensor> params_at_start;
  for (const auto& [n, p] : params) file.emplace_back("param." + n, p.clone()), params_at_start[n] = p.clone();
  // Gradients with a common direction (so Prodigy's distance estimate grows) and noise.
  std::map<std::string, torch::Tensor> direction;
  for (const auto& [n, p] : params) direction[n] = torch::randn_like(p);
  std::vector<std::map<std::string, torch::Tensor>> grads(6);
  for (size_t s = 0; s < grads.size(); ++s)
    for (const auto& [n, p] : params) {
      grads[s][n] = direction[n] + 0.3 * torch::randn_like(p);
      file.emplace_back("grad." + std::to_string(s) + "." + n, grads[s][n]);
    }
  io::save_safetensors(dir / "in.safetensors", file);
  auto out = [&](size_t i) { return dir / ("out" + std::to_string(i) + ".safetensors"); };
  std::string command =
      std::string("\"") + GCLAB_PYTHON + "\" \"" + GCLAB_SOURCE_DIR + "/tests/reference/optimizers.py\"";
  for (size_t i = 0; i < cases.size(); ++i)
    command += " " + std::string(config::name_of(cases[i].kind)) + " \"" + (dir / "in.safetensors").string() + "\" \"" +
               out(i).string() + "\" '" + cases[i].reference_options + "'";
  ASSERT_EQ(std::system(command.c_str()), 0) << command;

  for (size_t i = 0; i < cases.size(); ++i) {
    const ReferenceCase& c = cases[i];
    std::vector<std::pair<std::string, torch::Tensor>> trained;
    for (auto& [n, p] : params) trained.emplace_back(n, p.clone().requires_grad_(true));
    auto opt = make_optimizer(c.kind, trained, c.options);
    for (const auto& step : grads) {
      for (auto& [n, p] : trained) p.mutable_grad() = step.at(n).clone();
      opt->step(c.lr);
      opt->zero_grad();
    }
    // The displacement from the start, compared relative to the reference's (Prodigy's first steps are tiny
    // by design: d starts at d0 = 1e-6).
    const auto want = io::SafetensorsFile::open(out(i));
    for (const auto& [n, p] : trained) {
      const torch::Tensor start = params_at_start.at(n);
      const torch::Tensor ours = p.detach() - start, ref = want.tensor("param." + n) - start;
      const double scale = ref.abs().max().item<double>();
      ASSERT_GT(scale, 0.0) << config::name_of(c.kind) << " " << n << ": the reference did not move";
      EXPECT_LT((ours - ref).abs().max().item<double>() / scale, 1e-4)
          << config::name_of(c.kind) << " " << n << ": moved " << ours.abs().max().item<double>() << ", reference "
          << scale;
    }
  }
  fs::remove_all(dir);
}

// AI Toolkit's adamw8bit / adam8bit / lion8bit are bitsandbytes' optimizers. Six steps on a 8000-value
// matrix (32 blocks of 256, the last one short) and a 960-value one (under min_8bit_size: float32
// moments), against (1) their algorithm as bitsandbytes' paper and CUDA kernel define it, written out in
// tests/reference/optimizers.py (`<kind>:algorithm`): the same dynamic maps, codes, block maxima and
// weights to float32 rounding; and (2) bitsandbytes itself (skipped where it cannot be imported), whose CPU
// build looks codes up in a table instead of searching for the nearest: the same maps and memory, weights
// within 5% (3% measured).
struct EightBitReference {
  std::map<std::string, torch::Tensor> params;  // the starting weights
  std::vector<std::map<std::string, torch::Tensor>> grads;
};

EightBitReference eight_bit_inputs(const std::filesystem::path& file) {
  torch::manual_seed(9);
  EightBitReference r;
  r.params = {{"big", torch::randn({80, 100})}, {"small", torch::randn({24, 40})}};
  std::vector<std::pair<std::string, torch::Tensor>> tensors;
  for (const auto& [n, p] : r.params) tensors.emplace_back("param." + n, p.clone());
  r.grads.resize(6);
  for (size_t step = 0; step < r.grads.size(); ++step)
    for (const auto& [n, p] : r.params) {
      r.grads[step][n] = torch::randn_like(p) * (1 + static_cast<double>(step));
      tensors.emplace_back("grad." + std::to_string(step) + "." + n, r.grads[step][n]);
    }
  io::save_safetensors(file, tensors);
  return r;
}

TEST(Optimizers, EightBitMatchesBitsandbytes) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("gclab_bnb_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const EightBitReference in = eight_bit_inputs(dir / "in.safetensors");
  const std::vector<OptimizerKind> kinds = {OptimizerKind::adamw8bit, OptimizerKind::adam8bit, OptimizerKind::lion8bit};
  auto reference_out = [&](OptimizerKind kind, bool algorithm) {
    return dir / (std::string(config::name_of(kind)) + (algorithm ? "_algorithm" : "_bnb") + ".safetensors");
  };
  // Every reference run in one Python process (it exits 77, after the others, where bitsandbytes is not
  // importable).
  std::string command =
      std::string("\"") + GCLAB_PYTHON + "\" \"" + GCLAB_SOURCE_DIR + "/tests/reference/optimizers.py\"";
  for (auto kind : kinds)
    for (const bool algorithm : {true, false}) {
      const std::string options = kind == OptimizerKind::lion8bit
                                      ? R"({"lr": 0.001, "weight_decay": 0.05})"
                                      : R"({"lr": 0.001, "weight_decay": 0.05, "eps": 1e-6})";
      command += " \"" + std::string(config::name_of(kind)) + (algorithm ? ":algorithm" : "") + "\" \"" +
                 (dir / "in.safetensors").string() + "\" \"" + reference_out(kind, algorithm).string() + "\" '" +
                 options + "'";
    }
  command += " 2>/dev/null";
  const int rc = std::system(command.c_str());
  ASSERT_TRUE(WIFEXITED(rc) && (WEXITSTATUS(rc) == 0 || WEXITSTATUS(rc) == 77)) << command;
  const bool bnb_ran = WEXITSTATUS(rc) == 0;
  for (auto kind : kinds) {
    const std::string name(config::name_of(kind));
    OptimizerOptions o = default_options(kind);
    o.weight_decay = 0.05;
    std::vector<std::pair<std::string, torch::Tensor>> trained;
    for (const auto& [n, p] : in.params) trained.emplace_back(n, p.clone().requires_grad_(true));
    auto opt = make_optimizer(kind, trained, o);
    for (const auto& step : in.grads) {
      for (auto& [n, p] : trained) p.mutable_grad() = step.at(n).clone();
      opt->step(1e-3);
      opt->zero_grad();
    }
    std::map<std::string, torch::Tensor> state;
    for (const auto& [k, v] : opt->state()) state[k] = v;
    const std::vector<std::pair<std::string, std::string>> moments =
        kind == OptimizerKind::lion8bit
            ? std::vector<std::pair<std::string, std::string>>{{"exp_avg", "1"}}
            : std::vector<std::pair<std::string, std::string>>{{"exp_avg", "1"}, {"exp_avg_sq", "2"}};
    for (const bool algorithm : {true, false}) {
      if (!algorithm && !bnb_ran) continue;  // no bitsandbytes here
      const std::string reference = algorithm ? name + ":algorithm" : name;
      const auto want = io::SafetensorsFile::open(reference_out(kind, algorithm));
      EXPECT_TRUE(torch::equal(dynamic_quantization_map(true), want.tensor("qmap.signed"))) << reference;
      EXPECT_TRUE(torch::equal(dynamic_quantization_map(false), want.tensor("qmap.unsigned"))) << reference;
      for (const auto& [n, p] : trained) {
        const torch::Tensor moved = p.detach() - in.params.at(n), ref = want.tensor("param." + n) - in.params.at(n);
        const double err = (moved - ref).abs().max().item<double>() / ref.abs().max().item<double>();
        EXPECT_LT(err, algorithm ? 1e-4 : 5e-2) << reference << " " << n;
      }
      for (const auto& [ours, i] : moments) {
        const torch::Tensor codes = state.at("big." + ours + ".codes"), ref_codes = want.tensor("state.big.state" + i);
        ASSERT_EQ(codes.sizes(), ref_codes.sizes()) << reference;
        ASSERT_EQ(codes.scalar_type(), ref_codes.scalar_type()) << reference;
        const double same = codes.eq(ref_codes).to(torch::kFloat).mean().item<double>();
        const torch::Tensor absmax = state.at("big." + ours + ".absmax"),
                            ref_absmax = want.tensor("state.big.absmax" + i);
        ASSERT_EQ(absmax.sizes(), ref_absmax.sizes()) << reference;
        if (algorithm) {
          EXPECT_GT(same, 0.9999) << reference << " " << ours;
          EXPECT_TRUE(torch::allclose(absmax, ref_absmax, 1e-5, 0)) << reference << " " << ours;
          EXPECT_TRUE(torch::allclose(state.at("small." + ours), want.tensor("state.small.state" + i), 1e-5, 1e-8))
              << reference << " " << ours;
        } else {
          EXPECT_GT(same, 0.95) << reference << " " << ours;
        }
      }
    }
  }
  fs::remove_all(dir);
  if (!bnb_ran) GTEST_SKIP() << "checked against the written-out algorithm only: bitsandbytes is not importable";
}

TEST(Optimizers, AdafactorMatchesItsReference) {
  const OptimizerOptions plain = default_options(OptimizerKind::adafactor);
  // scale_parameter, a first moment, weight decay, a tighter clip.
  OptimizerOptions o = plain;
  o.scale_parameter = true, o.adafactor_beta1 = 0.9, o.weight_decay = 0.1, o.clip_threshold = 0.5;
  expect_matches_python_reference(
      {{OptimizerKind::adafactor, plain, 1e-2, R"({"lr": 0.01, "scale_parameter": false})"},
       {OptimizerKind::adafactor, o, 1e-2,
        R"({"lr": 0.01, "scale_parameter": true, "beta1": 0.9, "weight_decay": 0.1, "clip_threshold": 0.5})"}});
}

TEST(Optimizers, ProdigyMatchesItsReference) {
  const OptimizerOptions plain = default_options(OptimizerKind::prodigy);
  OptimizerOptions o = plain;
  o.weight_decay = 0.01, o.use_bias_correction = true, o.safeguard_warmup = true, o.d_coef = 2.0;
  expect_matches_python_reference({{OptimizerKind::prodigy, plain, 1.0, R"({"lr": 1.0, "eps": 1e-6})"},
                                   {OptimizerKind::prodigy, o, 1.0,
                                    R"({"lr": 1.0, "eps": 1e-6, "weight_decay": 0.01, "use_bias_correction": true,
                                       "safeguard_warmup": true, "d_coef": 2.0})"}});
}

// copy_stochastic (AI Toolkit's copy_stochastic_bf16): a float32 value a quarter of the way from one
// bfloat16 to the next rounds up a quarter of the time, down otherwise, never elsewhere; negatives by
// magnitude; a value bfloat16 holds stays.
TEST(Optimizers, StochasticRoundingToBfloat16IsUnbiased) {
  torch::manual_seed(3);
  const double ulp = std::ldexp(1.0, -7);  // bfloat16's spacing in [1, 2)
  for (const double sign : {1.0, -1.0}) {
    const torch::Tensor source = torch::full({40000}, sign * (1.0 + ulp / 4), torch::kFloat);
    torch::Tensor target = torch::empty({40000}, torch::kBFloat16);
    copy_stochastic(target, source);
    const torch::Tensor up = target.to(torch::kFloat).abs().eq(1.0 + ulp),
                        down = target.to(torch::kFloat).abs().eq(1.0);
    EXPECT_TRUE(up.logical_or(down).all().item<bool>());
    EXPECT_NEAR(up.to(torch::kFloat).mean().item<double>(), 0.25, 0.01) << sign;
  }
  const torch::Tensor exact = torch::tensor({1.0f, -3.5f, 0.0f});
  torch::Tensor target = torch::empty({3}, torch::kBFloat16);
  copy_stochastic(target, exact);
  EXPECT_TRUE(torch::equal(target.to(torch::kFloat), exact));
}

// A bfloat16 full fine-tune under Adafactor, as AI Toolkit runs it (adafactor.py): float32 moments, the
// update computed on a float32 copy and rounded back stochastically. An update far below bfloat16's
// spacing still moves the weights on average (round to nearest would leave every one where it was), each
// weight lands on a bfloat16 neighbour of the float32 result, and the moments are the float32 rule's.
TEST(Optimizers, AdafactorUpdatesBfloat16WeightsInFloat32AndRoundsStochastically) {
  torch::manual_seed(5);
  const torch::Tensor start = torch::ones({400, 500});
  const torch::Tensor grad = torch::randn({400, 500}).abs() + 0.5;  // every update downwards
  torch::Tensor low = start.to(torch::kBFloat16).requires_grad_(true), high = start.clone().requires_grad_(true);
  auto opt_low = make_optimizer(OptimizerKind::adafactor, {{"w", low}}, default_options(OptimizerKind::adafactor));
  auto opt_high = make_optimizer(OptimizerKind::adafactor, {{"w", high}}, default_options(OptimizerKind::adafactor));
  low.mutable_grad() = grad.to(torch::kBFloat16), high.mutable_grad() = grad.to(torch::kBFloat16).to(torch::kFloat);
  opt_low->step(1e-4), opt_high->step(1e-4);
  const torch::Tensor moved = low.detach().to(torch::kFloat) - start, want = high.detach() - start;
  ASSERT_GT(want.abs().max().item<double>(), 0.0);
  EXPECT_LT(want.abs().max().item<double>(), std::ldexp(1.0, -9));  // under half bfloat16's spacing below 1
  EXPECT_GT(moved.ne(0).to(torch::kFloat).mean().item<double>(), 0.005);
  EXPECT_NEAR(moved.mean().item<double>(), want.mean().item<double>(), 0.1 * want.abs().mean().item<double>());
  EXPECT_LE((moved - want).abs().max().item<double>(), std::ldexp(1.0, -8));
  std::map<std::string, torch::Tensor> low_state, high_state;
  for (const auto& [k, v] : opt_low->state()) low_state[k] = v;
  for (const auto& [k, v] : opt_high->state()) high_state[k] = v;
  ASSERT_EQ(low_state.size(), high_state.size());
  for (const auto& [k, v] : high_state) {
    if (k != "step") {
      EXPECT_EQ(low_state.at(k).scalar_type(), torch::kFloat) << k;
    }
    EXPECT_TRUE(torch::equal(low_state.at(k), v)) << k;
  }
  EXPECT_EQ(opt_low->walk(opt_low->names()).state_bytes, (400 + 500) * 4);
}

// AI Toolkit's stochastic_grad_accummulation: with Adafactor, a bfloat16 weight's micro-batch gradients are
// added in float32 and the sum rounded stochastically; other optimizers (and float32 weights) accumulate as
// autograd does.
TEST(Optimizers, AdafactorAccumulatesBfloat16GradientsStochastically) {
  torch::manual_seed(6);
  torch::Tensor w = torch::ones({20000}, torch::kBFloat16).requires_grad_(true);
  auto opt = make_optimizer(OptimizerKind::adafactor, {{"w", w}}, default_options(OptimizerKind::adafactor));
  ASSERT_TRUE(opt->accumulates_stochastically());
  EXPECT_FALSE(make_optimizer(OptimizerKind::adamw, {{"w", w}}, default_options(OptimizerKind::adamw))
                   ->accumulates_stochastically());
  const double small = std::ldexp(1.0, -10);  // an eighth of bfloat16's spacing at 1
  w.mutable_grad() = torch::ones({20000}, torch::kBFloat16);
  std::vector<torch::Tensor> aside = opt->set_gradients_aside();
  EXPECT_FALSE(w.grad().defined());
  w.mutable_grad() = torch::full({20000}, small, torch::kBFloat16);  // what the next backward leaves
  opt->accumulate(std::move(aside));
  const torch::Tensor sum = w.grad().to(torch::kFloat);
  const double spacing = std::ldexp(1.0, -7);
  EXPECT_TRUE(sum.eq(1.0).logical_or(sum.eq(1.0 + spacing)).all().item<bool>());
  EXPECT_NEAR(sum.mean().item<double>(), 1.0 + small, 0.1 * small);  // round to nearest: exactly 1
}

TEST(Optimizers, AdafactorStateIsFactoredAndProdigyKeepsFourCopies) {
  torch::Tensor w = torch::randn({64, 32}).requires_grad_(true), b = torch::randn({32}).requires_grad_(true);
  for (auto kind : {OptimizerKind::adafactor, OptimizerKind::prodigy}) {
    auto opt = make_optimizer(kind, {{"w", w}, {"b", b}}, default_options(kind));
    w.mutable_grad() = torch::randn_like(w), b.mutable_grad() = torch::randn_like(b);
    opt->step(kind == OptimizerKind::prodigy ? 1.0 : 1e-3);
    // Adafactor: a row (64) and a column (32) vector for the matrix, a full second moment for the vector.
    const int64_t want = kind == OptimizerKind::adafactor ? (64 + 32 + 32) * 4 : 4 * (64 * 32 + 32) * 4;
    EXPECT_EQ(opt->state_bytes(), want) << config::name_of(kind);
    EXPECT_EQ(opt->walk(opt->names()).state_bytes, want) << config::name_of(kind);
  }
  EXPECT_DOUBLE_EQ(optimizer_lr(OptimizerKind::prodigy, 1e-4), 1.0);  // AI Toolkit: lr < 0.1 becomes 1.0
  EXPECT_DOUBLE_EQ(optimizer_lr(OptimizerKind::prodigy, 0.5), 0.5);
  EXPECT_DOUBLE_EQ(optimizer_lr(OptimizerKind::adamw, 1e-4), 1e-4);
}

// What an optimizer holds — its state, and its step's temporaries with clip_grad_norm before it — walked on
// the meta device (Optimizer::walk: what the estimate's optimizer phase reads) is what the same optimizer
// allocates on the CPU under the tracking allocator, for every kind AI Toolkit's configs name, float32 and
// bfloat16 weights, a matrix large enough for bitsandbytes' 8-bit blocks and a vector under them.
TEST(Optimizers, TheWalkedStateAndStepAreWhatTheCpuAllocates) {
  for (const auto dtype : {torch::kFloat, torch::kBFloat16})
    for (const auto kind : {OptimizerKind::adamw, OptimizerKind::adamw8bit, OptimizerKind::adam,
                            OptimizerKind::adam8bit, OptimizerKind::lion, OptimizerKind::lion8bit,
                            OptimizerKind::adafactor, OptimizerKind::prodigy, OptimizerKind::sgd}) {
      torch::manual_seed(3);
      memory::CpuMemoryTracker tracker;
      torch::Tensor w = torch::randn({96, 64}).to(dtype).requires_grad_(true);
      torch::Tensor b = torch::randn({32}).to(dtype).requires_grad_(true);
      OptimizerOptions o = default_options(kind);
      o.weight_decay = 0.01;  // the decay's temporaries too
      auto opt = make_optimizer(kind, {{"w", w}, {"b", b}}, o);
      w.mutable_grad() = torch::randn_like(w), b.mutable_grad() = torch::randn_like(b);
      const int64_t held = tracker.stats().live_bytes;
      opt->step(1e-4);
      const int64_t state = tracker.stats().live_bytes - held;
      const int64_t before = tracker.stats().live_bytes;
      tracker.reset_peak();
      clip_grad_norm({w, b}, 1.0);
      opt->step(1e-4);
      const int64_t step = tracker.stats().peak_bytes - before;
      const Optimizer::Walk walked = opt->walk(opt->names());
      const std::string what = std::string(config::name_of(kind)) + " " + c10::toString(dtype);
      if (kind != OptimizerKind::sgd) {
        EXPECT_GT(state, 0) << what;
      }
      EXPECT_EQ(walked.state_bytes, state) << what;
      // Within a few bytes: a 0-dim scalar of the CPU run (Prodigy's sums) is a CPU tensor on meta too.
      EXPECT_NEAR(walked.step_bytes, step, 16) << what;
    }
}

// The learning rate at steps 0, 1 and 1000 of a 2000-step run, as AI Toolkit's schedulers give it
// (toolkit/scheduler.py with total_iters = steps): torch's ConstantLR and LinearLR (from lr/3), diffusers'
// constant schedule with a 1000-step warm-up (lr 0 at the first update), and its own cosine.
TEST(LrSchedulers, EachGivesAiToolkitsRate) {
  using config::LrScheduler;
  const config::LrSchedulerParams none;
  auto lr = [&](LrScheduler s, int64_t step, const config::LrSchedulerParams& p) {
    return scheduled_lr(s, p, 1e-4, step, 2000);
  };
  EXPECT_DOUBLE_EQ(lr(LrScheduler::constant, 0, none), 1e-4);
  EXPECT_DOUBLE_EQ(lr(LrScheduler::constant, 1000, none), 1e-4);
  EXPECT_DOUBLE_EQ(lr(LrScheduler::constant_with_warmup, 0, none), 0.0);
  EXPECT_DOUBLE_EQ(lr(LrScheduler::constant_with_warmup, 1, none), 1e-7);
  EXPECT_DOUBLE_EQ(lr(LrScheduler::constant_with_warmup, 1000, none), 1e-4);
  EXPECT_NEAR(lr(LrScheduler::linear, 0, none), 1e-4 / 3, 1e-18);
  EXPECT_NEAR(lr(LrScheduler::linear, 1, none), 1e-4 * (1.0 / 3 + (2.0 / 3) / 2000), 1e-18);
  EXPECT_NEAR(lr(LrScheduler::linear, 1000, none), 1e-4 * 2 / 3, 1e-18);
  EXPECT_NEAR(lr(LrScheduler::linear, 2000, none), 1e-4, 1e-18);
  EXPECT_DOUBLE_EQ(lr(LrScheduler::cosine, 0, none), 1e-4);
  EXPECT_NEAR(lr(LrScheduler::cosine, 1000, none), 0.5e-4, 1e-15);
  config::LrSchedulerParams p;
  p.num_warmup_steps = 10, p.start_factor = 0.5, p.eta_min = 1e-5;
  EXPECT_DOUBLE_EQ(lr(LrScheduler::constant_with_warmup, 5, p), 0.5e-4);
  EXPECT_DOUBLE_EQ(lr(LrScheduler::linear, 0, p), 0.5e-4);
  // cosine: torch's CosineAnnealingLR(T_max = steps, eta_min), closed form; no warm-up (toolkit/scheduler.py:11-15)
  EXPECT_DOUBLE_EQ(lr(LrScheduler::cosine, 0, p), 1e-4);
  EXPECT_NEAR(lr(LrScheduler::cosine, 1000, p), 1e-5 + 0.5 * (1e-4 - 1e-5), 1e-15);
  EXPECT_NEAR(lr(LrScheduler::cosine, 500, p), 1e-5 + (1e-4 - 1e-5) * 0.5 * (1 + std::cos(std::acos(-1.0) / 4)), 1e-15);
  EXPECT_NEAR(lr(LrScheduler::cosine, 2000, p), 1e-5, 1e-15);
}

}  // namespace
}  // namespace gclab::train
