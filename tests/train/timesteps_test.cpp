// Training timesteps and preview sigmas as AI Toolkit lays them out: each family's flow-match schedule
// against diffusers' FlowMatchEulerDiscreteScheduler with AI Toolkit's configs (tests/reference/
// flow_schedules.py), the index draws of content_or_style within min/max_denoising_steps, and the loss
// weights of `weighted` (AI Toolkit's measured table) and linear_timesteps (its bell).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <unistd.h>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "gclab/io/safetensors.h"
#include "gclab/model/flow_schedule.h"
#include "gclab/model/lora.h"
#include "gclab/model/spec.h"
#include "gclab/model/transformer.h"
#include "gclab/train/flow.h"
#include "gclab/train/timesteps.h"

namespace gclab::train {
namespace {

using config::TimestepType;
using model::Family;

config::TrainConfig train_with(TimestepType type) {
  config::TrainConfig t;
  t.timestep_type = type;
  return t;
}

double max_relative(const torch::Tensor& ours, const torch::Tensor& ref) {
  return ((ours.to(torch::kDouble) - ref.to(torch::kDouble)).abs() / ref.to(torch::kDouble).abs().clamp_min(1e-3))
      .max()
      .item<double>();
}

TEST(Timesteps, EachFamilysScheduleMatchesDiffusersWithAiToolkitsConfig) {
  namespace fs = std::filesystem;
  const fs::path out = fs::temp_directory_path() / ("gclab_flow_" + std::to_string(::getpid()) + ".safetensors");
  const std::string command = std::string("\"") + GCLAB_PYTHON + "\" \"" + GCLAB_SOURCE_DIR +
                              "/tests/reference/flow_schedules.py\" \"" + out.string() + "\"";
  ASSERT_EQ(std::system(command.c_str()), 0) << command;
  const auto ref = io::SafetensorsFile::open(out);
  for (const auto& [family, name] :
       {std::pair{model::Family("flux"), "flux"}, std::pair{model::Family("qwen_image"), "qwen_image"},
        std::pair{model::Family("zimage"), "zimage"}, std::pair{model::Family("sd3"), "sd3"}}) {
    const model::FlowSchedule schedule = model::flow_schedule(family);
    for (int64_t tokens : {256, 1024, 4096}) {
      const std::string key = std::string(name) + "." + std::to_string(tokens);
      for (auto type : {TimestepType::shift, TimestepType::flux_shift, TimestepType::lumina2_shift}) {
        const torch::Tensor grid = TimestepSampler(schedule, train_with(type)).grid(tokens);
        EXPECT_LT(max_relative(grid, ref.tensor("train." + key)), 1e-5) << key;
      }
      EXPECT_LT(max_relative(schedule.preview_sigmas(20, tokens), ref.tensor("preview." + key)), 1e-5) << key;
    }
  }
  // SD3's 25-step preview at 1024² ends on 0.0089 (the scheduler's own range, shifted twice), not on the
  // 0.116 of linspace(1, 1/25, 25) shifted once.
  const torch::Tensor sd3 = model::flow_schedule(model::Family("sd3")).preview_sigmas(25, 4096);
  EXPECT_LT(max_relative(sd3, ref.tensor("preview.sd3.25")), 1e-5);
  EXPECT_NEAR(sd3[-2].item<double>(), 0.0089, 1e-4);
  fs::remove(out);
  // SD3 takes the legacy path's sd_flow_config (static shift 3), Z-Image its own static 3; FLUX's shift
  // grows with the image.
  EXPECT_FALSE(model::flow_schedule(model::Family("sd3")).dynamic);
  EXPECT_FALSE(model::flow_schedule(model::Family("zimage")).dynamic);
  EXPECT_TRUE(model::flow_schedule(model::Family("flux")).dynamic);
}

// FLUX at 512² (1024 tokens) and 1024² (4096): mu = 0.5 + (tokens - 256) 0.65 / 3840, and the grid's
// median is e^mu / (e^mu + 1) on the 1000 scale.
TEST(Timesteps, FluxShiftAt512And1024FollowsTheBucketsTokens) {
  const model::ModelSpec flux = model::spec_by_preset("flux-dev");
  const model::FlowSchedule schedule = model::flow_schedule(model::Family("flux"));
  for (const auto& [side, mu] : {std::pair{512, 0.63}, std::pair{1024, 1.15}}) {
    const int64_t tokens = model::image_tokens(flux, {1, 1, side, side});
    EXPECT_NEAR(schedule.mu(tokens), mu, 1e-12) << side;
    const torch::Tensor grid = TimestepSampler(schedule, train_with(TimestepType::shift)).grid(tokens);
    EXPECT_NEAR(grid.median().item<double>() / 1000, std::exp(mu) / (std::exp(mu) + 1), 1e-3) << side;
  }
  // Qwen-Image's stretch ends its grid at the terminal 0.02 (timestep 20), whatever the size.
  const torch::Tensor qwen =
      TimestepSampler(model::flow_schedule(model::Family("qwen_image")), train_with(TimestepType::shift)).grid(1024);
  EXPECT_NEAR(qwen[-1].item<double>(), 20.0, 1e-3);
}

TEST(Timesteps, IndicesFollowContentOrStyleWithinTheDenoisingRange) {
  torch::manual_seed(0);
  const model::FlowSchedule schedule = model::flow_schedule(model::Family("zimage"));
  config::TrainConfig t = train_with(TimestepType::linear);
  // balanced: randint(min, max), the max itself never drawn (AI Toolkit's flowmatch branch)
  TimestepDraw d = TimestepSampler(schedule, t).draw(20000, 1024);
  EXPECT_EQ(d.index.min().item<int64_t>(), 0);
  EXPECT_EQ(d.index.max().item<int64_t>(), 998);
  // the linear grid is 1000 ... 1: t = (1000 - index) / 1000
  EXPECT_TRUE(torch::allclose(d.t, (1000 - d.index.to(torch::kFloat)) / 1000));
  EXPECT_TRUE(torch::equal(d.weight, torch::ones({20000})));
  t.min_denoising_steps = 100, t.max_denoising_steps = 200;
  d = TimestepSampler(schedule, t).draw(20000, 1024);
  EXPECT_EQ(d.index.min().item<int64_t>(), 100);
  EXPECT_EQ(d.index.max().item<int64_t>(), 199);
  t.min_denoising_steps = t.max_denoising_steps = 300;
  EXPECT_TRUE(torch::equal(TimestepSampler(schedule, t).draw(8, 1024).index, torch::full({8}, 300, torch::kLong)));
  // content: u^3 favours the first (noisiest) indices, half of them below n/8; style mirrors it
  t.min_denoising_steps = 0, t.max_denoising_steps = 999;
  t.content_or_style = config::ContentOrStyle::content;
  d = TimestepSampler(schedule, t).draw(20000, 1024);
  EXPECT_NEAR((d.index < 125).to(torch::kFloat).mean().item<double>(), 0.5, 0.02);
  EXPECT_GE(d.index.min().item<int64_t>(), 0);
  t.content_or_style = config::ContentOrStyle::style;
  d = TimestepSampler(schedule, t).draw(20000, 1024);
  EXPECT_NEAR((d.index > 874).to(torch::kFloat).mean().item<double>(), 0.5, 0.02);
  EXPECT_LE(d.index.max().item<int64_t>(), 999);
}

// A model of several experts: each micro-batch draws within its stage (BaseSDTrainProcess.py:1230-1245),
// the indices between boundary_max and boundary_min found by searchsorted over the ascending grid. Linear,
// the integers 1000..1: the high-noise stage's indices [0, 124) (t 1000..877), the low-noise one's
// [125, 999) (t 875..2). On a shifted grid the low-noise stage starts at the last point at or above 875,
// which may lie above it (then the wrapper routes that draw to the high-noise expert).
TEST(Timesteps, EachExpertsStageDrawsBetweenItsBoundaries) {
  config::TrainConfig t = train_with(TimestepType::linear);
  model::FlowSchedule schedule;
  schedule.shift = 5.0, schedule.dynamic = false;
  const TimestepSampler linear(schedule, t);
  torch::manual_seed(0);
  const TimestepDraw high = linear.draw(20000, 1024, std::make_pair(1.0, 0.875));
  EXPECT_EQ(high.index.min().item<int64_t>(), 0);
  EXPECT_EQ(high.index.max().item<int64_t>(), 123);
  EXPECT_NEAR(high.t.min().item<double>(), 0.877, 1e-6);
  const TimestepDraw low = linear.draw(20000, 1024, std::make_pair(0.875, 0.0));
  EXPECT_EQ(low.index.min().item<int64_t>(), 125);
  EXPECT_EQ(low.index.max().item<int64_t>(), 998);
  EXPECT_NEAR(low.t.max().item<double>(), 0.875, 1e-6);
  // shift: the grid's points, and the low stage's first index the last point at or above 875.
  const TimestepSampler shifted(schedule, train_with(TimestepType::shift));
  const torch::Tensor grid = shifted.grid(1024);
  const int64_t first_low = (grid >= 875).sum().item<int64_t>() - 1;
  const TimestepDraw s = shifted.draw(50000, 1024, std::make_pair(0.875, 0.0));
  EXPECT_EQ(s.index.min().item<int64_t>(), first_low);
  EXPECT_EQ(s.index.max().item<int64_t>(), 998);
  const TimestepDraw sh = shifted.draw(50000, 1024, std::make_pair(1.0, 0.875));
  EXPECT_GT(sh.t.min().item<double>(), 0.875);
}

TEST(Timesteps, WeightedUsesAiToolkitsTableAndLinearTimestepsItsBell) {
  const model::FlowSchedule schedule = model::flow_schedule(model::Family("flux"));
  const torch::Tensor all = torch::arange(1000, torch::kLong);
  // default_weighing_scheme: mean 1, peak 1.5227 at index 124 (t = 876), 0.9057 at pure noise, 0.4473 at t = 1
  const torch::Tensor table = TimestepSampler(schedule, train_with(TimestepType::weighted)).weights(all);
  EXPECT_NEAR(table.mean().item<double>(), 1.0, 1e-6);
  EXPECT_EQ(table.argmax().item<int64_t>(), 124);
  EXPECT_FLOAT_EQ(table[124].item<float>(), 1.5226575136184692f);
  EXPECT_FLOAT_EQ(table[0].item<float>(), 0.905706524848938f);
  EXPECT_FLOAT_EQ(table[999].item<float>(), 0.4472601115703583f);
  // weighted lays out the linear grid
  EXPECT_TRUE(torch::equal(TimestepSampler(schedule, train_with(TimestepType::weighted)).grid(4096),
                           torch::linspace(1000, 1, 1000)));
  // linear_timesteps: exp(-2 ((x - 500) / 1000)^2) less its minimum (at x = 0), scaled to mean 1
  config::TrainConfig t = train_with(TimestepType::sigmoid);
  t.linear_timesteps = true;
  const TimestepSampler bell(schedule, t);
  EXPECT_EQ(bell.grid_type(), TimestepType::linear);
  const torch::Tensor w = bell.weights(all);
  const double e = std::exp(-0.5);
  double sum = 0;
  for (int x = 0; x < 1000; ++x) sum += std::exp(-2 * std::pow((x - 500) / 1000.0, 2)) - e;
  EXPECT_NEAR(w[500].item<double>(), (1 - e) * 1000 / sum, 1e-4);
  EXPECT_NEAR(w[0].item<double>(), 0.0, 1e-6);
  EXPECT_NEAR(w.mean().item<double>(), 1.0, 1e-5);
  // linear_timesteps2: the second half held at the maximum
  t.linear_timesteps2 = true;
  const torch::Tensor half = TimestepSampler(schedule, t).weights(all);
  EXPECT_TRUE(torch::allclose(half.narrow(0, 500, 500), torch::full({500}, half[500].item<float>())));
  EXPECT_TRUE(torch::allclose(half.narrow(0, 0, 500), w.narrow(0, 0, 500)));
}

TEST(Timesteps, SigmoidAndLognormBlendDrawTheirGridEachBatch) {
  torch::manual_seed(1);
  const model::FlowSchedule schedule = model::flow_schedule(model::Family("flux"));
  const torch::Tensor sig = TimestepSampler(schedule, train_with(TimestepType::sigmoid)).grid(1024);
  EXPECT_TRUE(torch::equal(sig, std::get<0>(torch::sort(sig, 0, true))));  // descending
  EXPECT_GT(sig.min().item<double>(), 0.0);
  EXPECT_LT(sig.max().item<double>(), 1000.0);
  EXPECT_NEAR(sig.median().item<double>(), 500.0, 60.0);  // 1 - sigmoid(N(0, 1)) is symmetric about 1/2
  const torch::Tensor blend = TimestepSampler(schedule, train_with(TimestepType::lognorm_blend)).grid(1024);
  EXPECT_EQ(blend.size(0), 1000);
  EXPECT_TRUE(torch::equal(blend, blend.floor()));  // cast to integers, as AI Toolkit does
  EXPECT_EQ(blend.min().item<double>(), 0.0);       // the largest log-normal draw maps to timestep 0
  // the log-normal part piles up at high timesteps (x / max x is rarely near 1)
  EXPECT_GT((blend > 500).to(torch::kFloat).mean().item<double>(), 0.6);
}

// next_sample (SDTrainer's branch): the family's shift grid over next_sample_timesteps (8) points, an index
// in [0, 5], and the loss trained at the following point, on the latents a no-grad Euler step reached,
// against the noise that step implies; one_step: always the noisiest index of the linear grid.
TEST(Timesteps, NextSampleStepsOnceWithoutGradAndTrainsAtTheNextPoint) {
  torch::manual_seed(2);
  config::TrainConfig t = train_with(TimestepType::next_sample);
  const model::FlowSchedule schedule = model::flow_schedule(model::Family("flux"));
  const TimestepSampler sampler(schedule, t);
  const torch::Tensor grid = sampler.grid(1024);
  EXPECT_EQ(grid.size(0), 8);
  config::TrainConfig shift = train_with(TimestepType::shift);
  shift.num_train_timesteps = 8;
  EXPECT_TRUE(torch::equal(grid, TimestepSampler(schedule, shift).grid(1024)));
  const TimestepDraw d = sampler.draw(4000, 1024);
  EXPECT_EQ(d.index.min().item<int64_t>(), 0);
  EXPECT_EQ(d.index.max().item<int64_t>(), 5);
  EXPECT_TRUE(torch::equal(d.next_t, grid.index_select(0, d.index + 1) / 1000));
  EXPECT_TRUE(
      torch::equal(TimestepSampler(schedule, train_with(TimestepType::one_step)).draw(3, 1024).t, torch::ones({3})));

  auto model = model::build_transformer(model::spec_by_preset("tiny-flux"));
  model->eval();
  MicroBatch mb;
  mb.conditioning = model->example_inputs({2, 1, 64, 64});
  mb.x0 = torch::randn({2, 16, 8, 8});
  mb.noise = torch::randn_like(mb.x0);
  mb.t = torch::tensor({0.9f, 0.6f});
  mb.next_t = torch::tensor({0.8f, 0.4f});
  torch::Tensor want;
  {
    torch::NoGradGuard no_grad;
    model::ModelInputs in = mb.conditioning;
    const torch::Tensor t4 = mb.t.view({-1, 1, 1, 1}), n4 = mb.next_t.view({-1, 1, 1, 1});
    in.latents = (1 - t4) * mb.x0 + t4 * mb.noise, in.timestep = mb.t;
    const torch::Tensor stepped = in.latents + (n4 - t4) * model->forward(in);
    const torch::Tensor noise = (stepped - (1 - n4) * mb.x0) / n4;
    in.latents = stepped, in.timestep = mb.next_t;
    want = (model->forward(in) - (noise - mb.x0)).square().mean();
  }
  EXPECT_NEAR(flow_matching_loss(*model, mb, StepOptions{}).item<double>(), want.item<double>(), 1e-6);
}

// train.dtype bf16 as AI Toolkit trains (no autocast: BaseSDTrainProcess.py:1106, 1327; SDTrainer.py:646,
// 916): latents and noise rounded to bf16, the noisy latents made in float32 from them and cast to bf16,
// the text cast to bf16, the target noise - x0 in bf16, the loss in float32; a bf16 base with float32
// adapters. Fails under bf16 autocast (the adapters would compute in bf16) or with float32 latents.
TEST(FlowMatching, Bf16TrainsWithoutAutocastOnBf16InputsAsAiToolkit) {
  torch::manual_seed(3);
  auto model = model::build_transformer(model::spec_by_preset("tiny-flux"));
  model->to(torch::kBFloat16);
  model::apply_lora(*model, {4, 4.0, 0.0});
  {
    torch::NoGradGuard no_grad;
    for (auto& p : model->named_parameters())
      if (p.key().find("lora_B") != std::string::npos) p.value().normal_(0, 0.2);
  }
  model->eval();
  MicroBatch mb;
  mb.conditioning = model->example_inputs({2, 1, 64, 64});  // float32 text and pooled, as the cache holds them
  mb.x0 = torch::randn({2, 16, 8, 8});
  mb.noise = torch::randn_like(mb.x0);
  mb.t = torch::tensor({0.37f, 0.81f});
  StepOptions o;
  o.dtype = torch::kBFloat16;
  torch::Tensor want;
  {
    torch::NoGradGuard no_grad;
    model::ModelInputs in = mb.conditioning;
    in.text = in.text.to(torch::kBFloat16), in.pooled = in.pooled.to(torch::kBFloat16);
    const torch::Tensor x0 = mb.x0.to(torch::kBFloat16), noise = mb.noise.to(torch::kBFloat16);
    const torch::Tensor t4 = mb.t.view({-1, 1, 1, 1});
    in.latents = ((1 - t4) * x0.to(torch::kFloat) + t4 * noise.to(torch::kFloat)).to(torch::kBFloat16);
    in.timestep = mb.t;
    const torch::Tensor pred = model->forward(in);
    ASSERT_EQ(pred.scalar_type(), torch::kBFloat16);
    want = (pred.to(torch::kFloat) - (noise - x0).to(torch::kFloat)).square().mean();
  }
  EXPECT_EQ(flow_matching_loss(*model, mb, o).item<double>(), want.item<double>());
}

// Wan 2.2 TI2V's first frame (Wan225bModel.get_noise_prediction with add_first_frame_conditioning_v22 and
// scale_loss, wan22_5b_model.py:255-334): the clean first latent frame put in place of the noisy one (on a
// clone), every token's timestep its own — 0 on the first frame's, t elsewhere ((mask[0][0][:, ::2, ::2] *
// t).flatten()) — and the loss times the mask over its mean. So the loss does not see the first frame's noise
// or x0, and does see the clean frame.
TEST(FlowMatching, CleanLeadingFramesAreGivenAtTimeZeroAndLeftOutOfTheLoss) {
  torch::manual_seed(5);
  const model::ModelSpec spec = model::spec_by_preset("tiny-wan22-5b");
  auto model = model::build_transformer(spec);
  model->eval();
  // The per-token timesteps: 3 latent frames of 2 x 2 tokens.
  const torch::Tensor t = torch::tensor({0.25f, 0.75f});
  const torch::Tensor tokens = model::per_token_timesteps(spec, t, {2, 48, 3, 4, 4}, 1);
  ASSERT_EQ(tokens.sizes(), (std::vector<int64_t>{2, 12}));
  EXPECT_EQ(tokens.narrow(1, 0, 4).abs().sum().item<double>(), 0.0);
  EXPECT_TRUE(torch::equal(tokens.narrow(1, 4, 8), t.view({2, 1}).expand({2, 8})));

  MicroBatch mb;
  mb.conditioning = model->example_inputs({2, 9, 64, 64});
  mb.conditioning.clean_latent_frames = torch::randn({2, 48, 1, 4, 4});
  mb.conditioning.per_token_timesteps = true;
  mb.x0 = torch::randn({2, 48, 3, 4, 4});
  mb.noise = torch::randn_like(mb.x0);
  mb.t = t;
  torch::Tensor want;
  {
    torch::NoGradGuard no_grad;
    model::ModelInputs in = mb.conditioning;
    const torch::Tensor t5 = mb.t.view({-1, 1, 1, 1, 1});
    in.latents = (1 - t5) * mb.x0 + t5 * mb.noise;
    in.latents.narrow(2, 0, 1).copy_(in.clean_latent_frames);
    in.timestep = tokens;
    torch::Tensor keep = torch::ones({2, 1, 3, 4, 4});
    keep.narrow(2, 0, 1).zero_();
    want = ((model->forward(in) - (mb.noise - mb.x0)).square() * keep / keep.mean()).mean();
  }
  const double loss = flow_matching_loss(*model, mb, StepOptions{}).item<double>();
  EXPECT_NEAR(loss, want.item<double>(), 1e-6);
  MicroBatch other = mb;  // another first frame of noise and of x0: the same loss
  other.noise = mb.noise.clone(), other.x0 = mb.x0.clone();
  other.noise.narrow(2, 0, 1).normal_();
  other.x0.narrow(2, 0, 1).normal_();
  EXPECT_EQ(flow_matching_loss(*model, other, StepOptions{}).item<double>(), loss);
  other = mb;  // another clean frame: another loss
  other.conditioning.clean_latent_frames = torch::randn({2, 48, 1, 4, 4});
  EXPECT_NE(flow_matching_loss(*model, other, StepOptions{}).item<double>(), loss);
}

}  // namespace
}  // namespace gclab::train
