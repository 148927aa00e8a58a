// The training run, end to end on a tiny model: checkpointing does not change the math, accumulation is
// a bigger batch, resuming is the same as never stopping, and what a run writes can be read back.
#include "gclab/train/trainer.h"

#include <gtest/gtest.h>
#include <stb/stb_image_write.h>
#include <torch/torch.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>

#include <nlohmann/json.hpp>
#include <numeric>
#include "../support/test_util.h"
#include "../support/tiny_run.h"
#include "gclab/bench/report.h"
#include "gclab/config/loader.h"
#include "gclab/data/dataset.h"
#include "gclab/data/image.h"
#include "gclab/data/synth.h"
#include "gclab/io/safetensors.h"
#include "gclab/memory/cpu_isa.h"
#include "gclab/memory/tracker.h"
#include "gclab/model/family.h"
#include "gclab/model/lora.h"
#include "gclab/train/flow.h"
#include "gclab/train/plan.h"
#include "gclab/train/predict.h"
#include "gclab/train/session.h"
#include "gclab/train/state_file.h"

namespace fs = std::filesystem;
using gclab::testing::tiny_config;

namespace gclab::train {
namespace {

TEST(Trainer, CheckpointingOnAndOffGiveIdenticalLossesAndWeights) {
  const fs::path dir = testing::fresh_dir("train_gc");
  const auto on = train(tiny_config(dir, "on"), {});
  const auto off = train(tiny_config(dir, "off", {"train.gradient_checkpointing=false"}), {});
  ASSERT_EQ(on.losses.size(), 20u);
  ASSERT_EQ(off.losses.size(), 20u);
  for (size_t i = 0; i < 20; ++i) EXPECT_EQ(on.losses[i], off.losses[i]) << "step " << i + 1;
  const auto a = io::SafetensorsFile::open(dir / "on" / "on.safetensors");
  const auto b = io::SafetensorsFile::open(dir / "off" / "off.safetensors");
  ASSERT_EQ(a.entries().size(), b.entries().size());
  for (const auto& e : a.entries()) EXPECT_TRUE(torch::equal(a.tensor(e.name), b.tensor(e.name))) << e.name;
  fs::remove_all(dir);
}

TEST(Trainer, ResumingAfterTenStepsEqualsTwentyStraightStepsBitwise) {
  const fs::path dir = testing::fresh_dir("train_resume");
  const auto straight = train(tiny_config(dir, "straight", {"train.optimizer=adamw8bit"}), {});
  train(tiny_config(dir, "split", {"train.optimizer=adamw8bit", "train.steps=10"}), {});
  TrainOptions resume;
  resume.resume = true;
  const auto second = train(tiny_config(dir, "split", {"train.optimizer=adamw8bit"}), resume);
  EXPECT_EQ(second.start_step, 10);
  ASSERT_EQ(second.losses.size(), 10u);
  for (size_t i = 0; i < 10; ++i) EXPECT_EQ(second.losses[i], straight.losses[10 + i]) << "step " << 11 + i;
  const auto a = io::SafetensorsFile::open(dir / "straight" / "straight.safetensors");
  const auto b = io::SafetensorsFile::open(dir / "split" / "split.safetensors");
  for (const auto& e : a.entries()) EXPECT_TRUE(torch::equal(a.tensor(e.name), b.tensor(e.name))) << e.name;
  fs::remove_all(dir);
}

// N micro-batches of b samples are one batch of N*b: the same gradients (to float32 rounding).
TEST(Trainer, AccumulatedMicroBatchesGiveTheGradientOfOneBigBatch) {
  torch::manual_seed(3);
  auto m = model::build_transformer(model::spec_by_preset("tiny-dit"));
  const auto in = m->example_inputs({4, 1, 64, 64});
  MicroBatch big;
  big.x0 = in.latents;
  big.noise = torch::randn_like(in.latents);
  big.t = torch::rand({4});
  big.conditioning.class_labels = in.class_labels;
  auto grads = [&] {
    std::vector<torch::Tensor> g;
    for (auto& p : m->parameters()) g.push_back(p.grad().clone()), p.mutable_grad() = torch::Tensor();
    return g;
  };
  StepOptions whole;
  flow_matching_step(*m, big, whole);
  const auto g_big = grads();
  StepOptions part;
  part.loss_scale = 0.5;
  for (int k = 0; k < 2; ++k) {
    MicroBatch mb;
    mb.x0 = big.x0.narrow(0, 2 * k, 2);
    mb.noise = big.noise.narrow(0, 2 * k, 2);
    mb.t = big.t.narrow(0, 2 * k, 2);
    mb.conditioning.class_labels = in.class_labels.narrow(0, 2 * k, 2);
    flow_matching_step(*m, mb, part);
  }
  const auto g_acc = grads();
  for (size_t i = 0; i < g_big.size(); ++i)
    EXPECT_TRUE(torch::allclose(g_big[i], g_acc[i], 1e-4, 1e-6))
        << i << ": " << (g_big[i] - g_acc[i]).abs().max().item<double>();
}

TEST(Trainer, EndToEndWritesMetricsASamplePngAndALoraThatLoadsBack) {
  const fs::path dir = testing::fresh_dir("train_e2e");
  auto config =
      tiny_config(dir, "e2e",
                  {"train.steps=6", "sample.sample_every=6", "sample.width=64", "sample.height=64",
                   "sample.sample_steps=2", "sample.prompts=[\"a red circle\"]", "train.gradient_accumulation=2"});
  const auto s = train(config, {});
  // metrics.jsonl: one object per step
  std::ifstream metrics(dir / "e2e" / "metrics.jsonl");
  int lines = 0;
  for (std::string l; std::getline(metrics, l);) {
    EXPECT_NE(l.find("\"loss\""), std::string::npos);
    EXPECT_NE(l.find("\"peak_bytes\""), std::string::npos);
    ++lines;
  }
  EXPECT_EQ(lines, 6);
  ASSERT_EQ(s.samples.size(), 1u);
  const torch::Tensor png = data::decode_image_rgb(s.samples[0]);
  EXPECT_EQ(png.sizes(), (std::vector<int64_t>{64, 64, 3}));
  torch::manual_seed(7);
  auto m = model::build_transformer(model::spec_by_preset("tiny-flux"));
  model::apply_lora(*m, {4, 4.0});
  EXPECT_NO_THROW(model::load_lora(*m, dir / "e2e" / "e2e.safetensors"));
  EXPECT_TRUE(fs::exists(dir / "e2e" / "config.resolved.yaml"));
  EXPECT_TRUE(fs::exists(dir / "e2e" / "memory.json"));
  EXPECT_TRUE(fs::exists(dir / "e2e" / "log.txt"));
  fs::remove_all(dir);
}

// cache_latents_to_disk: latents are written beside the images once and reused by the next run (the
// files are not rewritten and the run's losses are the same).
TEST(Trainer, LatentDiskCacheIsWrittenOnceAndReused) {
  const fs::path dir = testing::fresh_dir("train_cache");
  const auto first = train(tiny_config(dir, "c1", {"datasets.0.cache_latents_to_disk=true", "train.steps=4"}), {});
  std::map<std::string, fs::file_time_type> written;
  for (const auto& e : fs::directory_iterator(dir / "data" / "_latent_cache"))
    written[e.path().string()] = e.last_write_time();
  ASSERT_FALSE(written.empty());
  const auto second = train(tiny_config(dir, "c2", {"datasets.0.cache_latents_to_disk=true", "train.steps=4"}), {});
  for (const auto& e : fs::directory_iterator(dir / "data" / "_latent_cache")) {
    ASSERT_TRUE(written.count(e.path().string())) << "new cache file " << e.path();
    EXPECT_EQ(written.at(e.path().string()), e.last_write_time()) << "rewritten: " << e.path();
  }
  EXPECT_EQ(first.losses, second.losses);
  fs::remove_all(dir);
}

TEST(Trainer, UnusableSettingsAndDataAreClearErrors) {
  const fs::path dir = testing::fresh_dir("train_errors");
  // (Conflicting accumulation keys and unknown optimizers are refused when the config is read: the typed
  // config cannot hold them. tests/config covers those messages.)
  EXPECT_THROW(train(tiny_config(dir, "c", {"datasets.0.folder_path=" + (dir / "missing").string()}), {}),
               data::DataError);
  fs::create_directories(dir / "empty");
  EXPECT_THROW(train(tiny_config(dir, "d", {"datasets.0.folder_path=" + (dir / "empty").string()}), {}),
               data::DataError);
  fs::remove_all(dir);
}

std::vector<int64_t> metric_steps(const fs::path& file) {
  std::vector<int64_t> steps;
  std::ifstream in(file);
  for (std::string line; std::getline(in, line);)
    steps.push_back(nlohmann::json::parse(line).at("step").get<int64_t>());
  return steps;
}

// A run killed between saves (kill -9 after step 7, last save at step 5: its step-7 state never written)
// and resumed: metrics.jsonl holds every step once.
TEST(Trainer, AResumedRunLogsEveryStepOnceAfterAKillBetweenSaves) {
  const fs::path dir = testing::fresh_dir("train_kill");
  train(tiny_config(dir, "k", {"train.steps=7", "save.save_every=5", "save.max_step_saves_to_keep=5"}), {});
  // What a kill -9 after step 7 leaves: the step-5 save, metrics for steps 1..7, no step-7 state.
  fs::remove(dir / "k" / "k_000000007.state.safetensors");
  fs::remove(dir / "k" / "k_000000007.safetensors");
  ASSERT_EQ(metric_steps(dir / "k" / "metrics.jsonl").size(), 7u);
  TrainOptions resume;
  resume.resume = true;
  const auto s = train(tiny_config(dir, "k", {"train.steps=10", "save.save_every=5"}), resume);
  EXPECT_EQ(s.start_step, 5);
  std::vector<int64_t> expected(10);
  std::iota(expected.begin(), expected.end(), 1);
  EXPECT_EQ(metric_steps(dir / "k" / "metrics.jsonl"), expected);
  fs::remove_all(dir);
}

// AI Toolkit's baseline previews (BaseSDTrainProcess.py:2477-2481): at the start of a fresh run; a resumed
// run takes them at the step it resumes from only under force_first_sample (either run also samples its
// last step).
TEST(Trainer, ForceFirstSampleTakesTheBaselineWhereAResumedRunStarts) {
  const fs::path dir = testing::fresh_dir("train_force_first");
  const std::vector<std::string> knobs = {"train.skip_first_sample=false",
                                          "train.disable_sampling=false",
                                          "sample.samples=[{prompt: 'a red circle'}]",
                                          "sample.sample_every=1000",
                                          "sample.width=64",
                                          "sample.height=64",
                                          "sample.sample_steps=1",
                                          "save.save_every=2"};
  auto with = [&](std::vector<std::string> extra) {
    extra.insert(extra.end(), knobs.begin(), knobs.end());
    return extra;
  };
  TrainOptions resume;
  resume.resume = true;
  for (const bool force : {false, true}) {
    const std::string name = force ? "f" : "n";
    train(tiny_config(dir, name, with({"train.steps=2"})), {});
    EXPECT_TRUE(fs::exists(dir / name / "samples" / (name + "_000000000_0.jpg"))) << name;
    fs::remove_all(dir / name / "samples");  // the first run's (its last step's included)
    std::vector<std::string> more = {"train.steps=3"};
    if (force) more.push_back("train.force_first_sample=true");
    const auto s = train(tiny_config(dir, name, with(more)), resume);
    EXPECT_EQ(s.start_step, 2);
    EXPECT_EQ(fs::exists(dir / name / "samples" / (name + "_000000002_0.jpg")), force) << name;
  }
  fs::remove_all(dir);
}

// Step saves rotate as AI Toolkit's files[:-max_step_saves_to_keep] removes them (BaseSDTrainProcess.py:
// 460-470): the newest N stay, and 0 removes none.
TEST(Trainer, StepSavesRotateAsAiToolkitsSliceAndZeroKeepsAll) {
  const fs::path dir = testing::fresh_dir("train_rotate");
  auto step_saves = [&](const std::string& name) {
    int n = 0;
    for (const auto& e : fs::directory_iterator(dir / name))
      n += e.path().filename().string().find(".state.") == std::string::npos &&
           e.path().filename().string().rfind(name + "_", 0) == 0;
    return n;
  };
  train(tiny_config(dir, "two", {"train.steps=6", "save.save_every=1", "save.max_step_saves_to_keep=2"}), {});
  EXPECT_EQ(step_saves("two"), 2);
  train(tiny_config(dir, "all", {"train.steps=6", "save.save_every=1", "save.max_step_saves_to_keep=0"}), {});
  EXPECT_EQ(step_saves("all"), 6);
  fs::remove_all(dir);
}

// A save that cannot be written ends the run with SaveError naming the file; the previous save stays.
TEST(Trainer, AFailedSaveNamesTheFileAndKeepsThePreviousSave) {
  const fs::path dir = testing::fresh_dir("train_save_fail");
  // A folder where the step-4 weights file must go: the rename into place fails, as on a full disk.
  fs::create_directories(dir / "s" / "s_000000004.safetensors" / "blocker");
  try {
    train(tiny_config(dir, "s", {"train.steps=6", "save.save_every=2", "save.max_step_saves_to_keep=5"}), {});
    FAIL() << "expected SaveError";
  } catch (const SaveError& e) {
    EXPECT_NE(std::string(e.what()).find("s_000000004.safetensors"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("--resume"), std::string::npos) << e.what();
  }
  EXPECT_NO_THROW(io::SafetensorsFile::open(dir / "s" / "s_000000002.safetensors"));
  EXPECT_NO_THROW(io::SafetensorsFile::open(dir / "s" / "s_000000002.state.safetensors"));
  fs::remove_all(dir);
}

// A half-written PNG (its header reads, its pixels do not) never ends a run: it is replaced by another
// image of its bucket, listed once, and not used again.
TEST(Trainer, AnImageThatCannotBeDecodedIsReplacedAndListed) {
  const fs::path dir = testing::fresh_dir("train_truncated");
  tiny_config(dir, "unused");  // writes the data folder
  fs::path victim;
  for (const auto& e : fs::directory_iterator(dir / "data"))
    if (e.path().extension() == ".png") victim = e.path();
  ASSERT_FALSE(victim.empty());
  fs::resize_file(victim, 80);  // header and the start of the first chunk only
  const auto s = train(tiny_config(dir, "t", {"train.steps=12"}), {});
  EXPECT_EQ(s.end_step, 12);
  ASSERT_EQ(s.unusable_images.size(), 1u);
  EXPECT_EQ(s.unusable_images[0], victim.string());
  fs::remove_all(dir);
}

// check, estimate and train --dry-run accept and refuse the same configs: every shipped and shared one.
TEST(Trainer, DryRunGivesTheSameVerdictAsCheckForEveryShippedConfig) {
  std::vector<fs::path> files;
  for (const auto& root : {fs::path(GCLAB_SOURCE_DIR) / "configs", fs::path(GCLAB_SHARED_DIR) / "aitk-configs"})
    for (const auto& e : fs::recursive_directory_iterator(root))
      if (e.path().extension() == ".yaml") files.push_back(e.path());
  ASSERT_GT(files.size(), 15u);
  int accepted = 0;
  for (const auto& f : files) {
    const auto r = model::load_config_file(f.string());
    if (!r.ok()) continue;  // refused by check: train loads through the same function
    ++accepted;
    EXPECT_NO_THROW(dry_run(*r.config)) << f;
  }
  EXPECT_GT(accepted, 10);
}

// The Session builds the model where and how it trains: a bf16 LoRA run never holds a float32 copy of the
// base. The host peak while building is the final weights (plus the text encoder), not 3x them.
// gradient_accumulation: N sums the N micro-batches' gradients, as AI Toolkit's SDTrainer.hook_train_loop
// does (backward on each loss, no 1/N): from the same micro-batches and the same random stream, the
// gradient is twice the legacy key's average.
TEST(Session, GradientAccumulationSumsTheMicroBatchesAsAiToolkitDoes) {
  const fs::path dir = testing::fresh_dir("session_accumulation");
  auto next = [](Session& s) { return [&s] { return s.synthetic_batch({1, 1, 64, 64}); }; };
  auto snapshot = [](Session& s) {
    std::vector<torch::Tensor> out;
    for (const auto& p : s.model().parameters()) out.push_back(p.detach().clone());
    return out;
  };
  // gradient_accumulation: 2 micro-batches in one step, their gradients summed into one update.
  double summed = 0;
  {
    Session session(tiny_config(dir, "a", {"train.gradient_accumulation=2", "train.max_grad_norm=1e30"}));
    torch::manual_seed(5);
    summed = session.train_step(0, next(session)).grad_norm;
  }
  // The same two micro-batches by hand (the same draws in the same order): the norm of their summed
  // gradients, and of the second one's alone.
  double by_hand = 0, second = 0;
  {
    Session session(tiny_config(dir, "o", {"train.max_grad_norm=1e30"}));
    auto norm = [&] {
      double sq = 0;
      for (const auto& p : session.model().parameters())
        if (p.grad().defined()) sq += p.grad().to(torch::kDouble).pow(2).sum().item<double>();
      for (auto& p : session.model().parameters()) p.mutable_grad() = torch::Tensor();
      return std::sqrt(sq);
    };
    for (const bool both : {true, false}) {
      torch::manual_seed(5);
      for (int i = 0; i < 2; ++i) {
        const MicroBatch mb = session.micro_batch(session.synthetic_batch({1, 1, 64, 64}));
        const torch::Tensor loss = flow_matching_loss(session.model(), mb, StepOptions{});
        if (both || i == 1) loss.backward();
      }
      (both ? by_hand : second) = norm();
    }
  }
  EXPECT_NEAR(summed, by_hand, 1e-5 * by_hand);
  // The legacy gradient_accumulation_steps: 2 trains one micro-batch a step and updates on every second
  // step (is_grad_accumulation_step); hook_train_loop zeroes the gradients at the start of every step, so
  // the update at step 1 carries step 1's gradient only, and the weights stay as they were at step 0.
  Session session(tiny_config(dir, "l", {"train.gradient_accumulation_steps=2", "train.max_grad_norm=1e30"}));
  torch::manual_seed(5);
  const auto before = snapshot(session);
  const StepResult r0 = session.train_step(0, next(session));
  EXPECT_FALSE(r0.updated);
  EXPECT_GT(r0.gradient_bytes, 0);
  const auto held = snapshot(session);
  for (size_t i = 0; i < before.size(); ++i) ASSERT_TRUE(torch::equal(before[i], held[i])) << i;
  const StepResult r1 = session.train_step(1, next(session));
  EXPECT_TRUE(r1.updated);
  EXPECT_NEAR(r1.grad_norm, second, 1e-5 * second);
  EXPECT_GT(std::abs(summed - second), 1e-3 * summed);  // not the sum of the two
  // Its update pattern: N = 3 updates at steps 2, 5, 8; -1 on an epoch's first batch only.
  config::TrainConfig t;
  t.gradient_accumulation_steps = 3;
  std::vector<int> at;
  for (int s = 0; s < 9; ++s)
    if (t.optimizer_steps_at(s, false)) at.push_back(s);
  EXPECT_EQ(at, (std::vector<int>{2, 5, 8}));
  t.gradient_accumulation_steps = -1;
  EXPECT_FALSE(t.optimizer_steps_at(7, false));
  EXPECT_TRUE(t.optimizer_steps_at(8, true));
  fs::remove_all(dir);
}

// hook_train_loop clips the gradients for every optimizer but Adafactor: under a clipping norm of 1e-9,
// AdamW's first update changes (its eps is no longer negligible), Adafactor's does not.
TEST(Session, AdafactorGradientsAreNotClippedAsInAiToolkit) {
  const fs::path dir = testing::fresh_dir("session_adafactor_clip");
  auto weights_after_a_step = [&](const std::string& optimizer, const std::string& max_norm) {
    Session session(
        tiny_config(dir, optimizer + max_norm, {"train.optimizer=" + optimizer, "train.max_grad_norm=" + max_norm}));
    torch::manual_seed(5);
    session.train_step(0, [&] { return session.synthetic_batch({1, 1, 64, 64}); });
    std::vector<torch::Tensor> out;
    for (const auto& p : session.model().parameters()) out.push_back(p.detach().clone());
    return out;
  };
  auto same = [](const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
    for (size_t i = 0; i < a.size(); ++i)
      if (!torch::allclose(a[i], b[i], 1e-6, 1e-7)) return false;
    return true;
  };
  EXPECT_TRUE(same(weights_after_a_step("adafactor", "1e-9"), weights_after_a_step("adafactor", "1e30")));
  EXPECT_FALSE(same(weights_after_a_step("adamw", "1e-9"), weights_after_a_step("adamw", "1e30")));
  fs::remove_all(dir);
}

// max_grad_norm: 0 clips every gradient to zero, as torch's clip_grad_norm_ does in AI Toolkit
// (SDTrainer.py:2276-2283): without weight decay AdamW then moves nothing; a large norm trains.
TEST(Session, MaxGradNormZeroClipsEveryGradientToZeroAsAiToolkit) {
  const fs::path dir = testing::fresh_dir("session_clip_zero");
  auto moved = [&](const std::string& max_norm) {
    Session session(tiny_config(
        dir, "c" + max_norm,
        {"train.optimizer=adamw", "train.optimizer_params.weight_decay=0", "train.max_grad_norm=" + max_norm}));
    std::vector<torch::Tensor> before;
    for (const auto& p : session.model().parameters()) before.push_back(p.detach().clone());
    torch::manual_seed(5);
    const StepResult r = session.train_step(0, [&] { return session.synthetic_batch({1, 1, 64, 64}); });
    EXPECT_GT(r.grad_norm, 0) << max_norm;  // the norm measured before clipping
    bool any = false;
    size_t i = 0;
    for (const auto& p : session.model().parameters()) any = any || !torch::equal(p, before[i++]);
    return any;
  };
  EXPECT_FALSE(moved("0"));
  EXPECT_TRUE(moved("1e30"));
  fs::remove_all(dir);
}

// A dataset's loss_multiplier weighs its items' losses (SDTrainer.py:544, 994): twice the multiplier, twice
// the loss and the gradient norm of the same step.
TEST(Session, ADatasetsLossMultiplierWeighsItsLoss) {
  const fs::path dir = testing::fresh_dir("session_loss_multiplier");
  auto step = [&](const std::string& m) {
    Session session(tiny_config(dir, "m" + m, {"datasets.0.loss_multiplier=" + m, "train.max_grad_norm=1e30"}));
    torch::manual_seed(5);
    return session.train_step(0, [&] { return session.synthetic_batch({1, 1, 64, 64}); });
  };
  const StepResult one = step("1"), two = step("2");
  EXPECT_NEAR(two.loss, 2 * one.loss, 1e-6 * one.loss);
  EXPECT_NEAR(two.grad_norm, 2 * one.grad_norm, 1e-5 * one.grad_norm);
  fs::remove_all(dir);
}

// FLUX-dev trains at guidance train.cfg_scale (SDTrainer's guidance_embedding_scale); with Flex's
// bypass_guidance_embedding the guidance embedder is left out of the training forward altogether.
TEST(Session, GuidanceEmbeddingTrainsAtCfgScaleOrIsBypassed) {
  const fs::path dir = testing::fresh_dir("session_guidance");
  {
    Session session(tiny_config(dir, "g", {"train.cfg_scale=2.5"}));
    ASSERT_TRUE(session.spec().guidance_embed);
    const MicroBatch mb = session.micro_batch(session.synthetic_batch({2, 1, 64, 64}));
    EXPECT_TRUE(torch::equal(mb.conditioning.guidance, torch::full({2}, 2.5)));
    EXPECT_FALSE(mb.conditioning.bypass_guidance);
  }
  Session session(tiny_config(dir, "b", {"train.bypass_guidance_embedding=true"}));
  MicroBatch mb = session.micro_batch(session.synthetic_batch({1, 1, 64, 64}));
  EXPECT_TRUE(mb.conditioning.bypass_guidance);
  EXPECT_FALSE(mb.conditioning.guidance.defined());
  torch::NoGradGuard no_grad;
  auto& model = session.model();
  model::ModelInputs in = mb.conditioning;
  in.latents = mb.x0, in.timestep = mb.t;
  const torch::Tensor bypassed = model.forward(in);
  in.bypass_guidance = false, in.guidance = torch::full({1}, 4.0);
  const torch::Tensor guided = model.forward(in);
  EXPECT_FALSE(torch::allclose(bypassed, guided));
  // ...and it is the forward whose guidance embedder adds nothing.
  for (auto& item : model.named_parameters())
    if (item.key().find("guidance_embedder.linear_2") != std::string::npos) item.value().zero_();
  EXPECT_TRUE(torch::allclose(model.forward(in), bypassed, 1e-5, 1e-6));
  fs::remove_all(dir);
}

// Previews use the EMA weights when EMA is on (BaseSDTrainProcess.sample swaps them in), and the live
// weights are back afterwards. With decay 0 the EMA is the live weights, so the preview is the one a run
// without EMA draws; with decay 0.9 after two large steps it is not.
// A preview item's network_multiplier (`--m`) scales the LoRA while it denoises, as AI Toolkit's
// generate_images sets network.multiplier (stable_diffusion_model.py:1440-1441): --m 0 previews the base
// alone — what zeroed adapters give —, --m 1 the adapted model; training's multiplier is 1 after.
TEST(Session, APreviewsNetworkMultiplierScalesTheLora) {
  const fs::path dir = testing::fresh_dir("session_preview_multiplier");
  config::ProcessConfig c = tiny_config(dir, "m");
  config::SampleConfig sc;
  sc.width = sc.height = 64, sc.sample_steps = 2, sc.seed = 3, sc.format = "png";
  sc.samples = {config::SampleItem{}, config::SampleItem{}};
  sc.samples[0].prompt = sc.samples[1].prompt = "a photo";
  sc.samples[0].network_multiplier = 0.0;
  sc.samples[1].network_multiplier = 1.0;
  c.sample = sc;
  Session session(c);
  auto set_lora_b = [&](bool zero) {
    torch::NoGradGuard no_grad;
    torch::manual_seed(1);
    for (auto& p : session.model().named_parameters())
      if (p.key().find("lora_B") != std::string::npos) zero ? p.value().zero_() : p.value().normal_(0, 0.5);
  };
  set_lora_b(false);
  auto images = [&](const std::string& sub) {
    std::vector<torch::Tensor> out;
    for (const auto& f : session.sample(0, dir / sub)) out.push_back(data::decode_image_rgb(f));
    return out;
  };
  const auto adapted = images("adapted");
  ASSERT_EQ(adapted.size(), 2u);
  EXPECT_FALSE(torch::equal(adapted[0], adapted[1]));
  for (auto& [path, linear] : nn::named_linears(session.model()))
    if (linear->has_lora()) {
      EXPECT_EQ(linear->lora_multiplier(), 1.0) << path;
    }
  set_lora_b(true);
  const auto base = images("base");
  EXPECT_TRUE(torch::equal(adapted[0], base[0]));  // --m 0 is the base alone
  EXPECT_TRUE(torch::equal(base[0], base[1]));
  fs::remove_all(dir);
}

TEST(Session, PreviewsUseTheEmaWeightsAndRestoreTheLiveOnes) {
  const fs::path dir = testing::fresh_dir("session_ema_preview");
  auto preview = [&](const std::string& name, std::vector<std::string> extra) {
    config::ProcessConfig c = tiny_config(dir, name, extra);
    config::SampleConfig sc;
    sc.width = sc.height = 64, sc.sample_steps = 2, sc.seed = 3;
    sc.samples = {config::SampleItem{}};
    sc.samples[0].prompt = "a photo";
    c.sample = sc;
    Session session(c);
    torch::manual_seed(5);
    for (int step = 0; step < 2; ++step)
      session.train_step(step, [&] { return session.synthetic_batch({1, 1, 64, 64}); });
    std::vector<torch::Tensor> live;
    for (const auto& p : session.model().parameters()) live.push_back(p.detach().clone());
    fs::create_directories(dir / name);
    const auto files = session.sample(2, dir / name);
    size_t i = 0;
    for (const auto& p : session.model().parameters()) EXPECT_TRUE(torch::equal(p, live[i++])) << name;
    EXPECT_EQ(files.size(), 1u);
    return data::decode_image_rgb(files.at(0));
  };
  const std::vector<std::string> big = {"train.lr=0.05"};
  const torch::Tensor plain = preview("plain", big);
  auto with = [&](const std::string& decay) {
    auto e = big;
    e.push_back("train.ema_config.use_ema=true");
    e.push_back("train.ema_config.ema_decay=" + decay);
    return e;
  };
  EXPECT_TRUE(torch::equal(preview("ema0", with("0")), plain));
  EXPECT_FALSE(torch::equal(preview("ema9", with("0.9")), plain));
  fs::remove_all(dir);
}

// AI Toolkit's EMA (toolkit/ema.py:100-153) in a bf16 full fine-tune: the update in float32, written back to
// the bf16 shadow by stochastic rounding. With round-to-nearest a 0.998 EMA of bf16 weights never moves
// (each step, 0.001 here, is below half a bf16 spacing near 1); here, 500 updates toward weights moved by 0.5
// move the EMA 1 - 0.998^500 = 63.2% of the way on average, as in float32.
TEST(Session, EmaOfBf16WeightsMovesAsInFloat32) {
  const fs::path dir = testing::fresh_dir("session_ema_bf16");
  Session session(tiny_config(
      dir, "e",
      {"network=null", "train.dtype=bf16", "train.ema_config.use_ema=true", "train.ema_config.ema_decay=0.998"}));
  std::vector<torch::Tensor> start;
  {
    torch::NoGradGuard no_grad;
    for (auto& [n, p] : session.trained()) {
      ASSERT_EQ(p.scalar_type(), torch::kBFloat16) << n;
      start.push_back(p.to(torch::kFloat));
      p.add_(0.5);
    }
  }
  torch::manual_seed(1);
  for (int i = 0; i < 500; ++i) session.update_ema();
  double moved = 0, elements = 0;
  session.with_ema_weights([&] {
    size_t i = 0;
    for (auto& [n, p] : session.trained()) {
      moved += (p.to(torch::kFloat) - start[i++]).sum().item<double>() / 0.5;
      elements += static_cast<double>(p.numel());
    }
  });
  const double expected = 1 - std::pow(0.998, 500);
  std::printf("the bf16 EMA moved %.4f of the way (float32: %.4f)\n", moved / elements, expected);
  EXPECT_NEAR(moved / elements, expected, 0.01);
  fs::remove_all(dir);
}

// The model's prediction less the flow-matching target (noise - x0) for a micro-batch, without gradients: the
// loss tests' own reckoning of what flow_matching_loss reduces.
torch::Tensor velocity_error(Session& session, const MicroBatch& mb) {
  torch::NoGradGuard no_grad;
  model::ModelInputs in = mb.conditioning;
  const torch::Tensor t4 = mb.t.view({-1, 1, 1, 1});
  in.latents = (1 - t4) * mb.x0 + t4 * mb.noise, in.timestep = mb.t;
  return session.model().forward(in) - (mb.noise - mb.x0);
}

// loss_type mae is SDTrainer's l1_loss (mean absolute error), mse its default; noise_offset adds
// noise_offset * N(0, 1) per sample and channel (toolkit/train_tools.py apply_noise_offset).
TEST(Session, LossTypeAndNoiseOffsetAsAiToolkit) {
  const fs::path dir = testing::fresh_dir("session_loss_type");
  Session session(tiny_config(dir, "l"));
  torch::manual_seed(2);
  const MicroBatch mb = session.micro_batch(session.synthetic_batch({2, 1, 64, 64}));
  const torch::Tensor diff = velocity_error(session, mb);
  StepOptions o;
  EXPECT_NEAR(flow_matching_loss(session.model(), mb, o).item<double>(), diff.square().mean().item<double>(), 1e-6);
  o.loss_type = config::LossType::mae;
  EXPECT_NEAR(flow_matching_loss(session.model(), mb, o).item<double>(), diff.abs().mean().item<double>(), 1e-6);
  // Channel means of the noise: about 1/8 apart without the offset (8x8 latents), about 0.5 with 0.5.
  auto channel_mean_spread = [&](const std::string& offset) {
    Session s(tiny_config(dir, "n" + offset, {"train.noise_offset=" + offset}));
    torch::manual_seed(3);
    return s.micro_batch(s.synthetic_batch({4, 1, 64, 64})).noise.mean({2, 3}).std().item<double>();
  };
  EXPECT_LT(channel_mean_spread("0"), 0.2);
  EXPECT_GT(channel_mean_spread("0.5"), 0.35);
  fs::remove_all(dir);
}

// --memory-snapshot: the allocator's history from the load to the out-of-memory stop, as a pickle PyTorch's
// own tools read (torch/cuda/_memory_viz.py's segsum and trace, the viewer's alloc / free pairing): every
// allocation's frame the phase it came from, the OOM with the bytes it asked for, the blocks still live at
// the end the ones the trace leaves allocated.
TEST(Trainer, AMemorySnapshotOpensInPyTorchsMemoryTools) {
  const fs::path dir = testing::fresh_dir("memory_snapshot");
  const auto config = tiny_config(
      dir, "s", {"train.steps=3", "train.gradient_checkpointing=false", "vram_cap=12MiB", "train.oom_policy=abort"});
  TrainOptions options;
  options.memory_snapshot = dir / "snapshot.pickle";
  EXPECT_THROW(train(config, options), OutOfMemoryStop);
  ASSERT_TRUE(fs::exists(options.memory_snapshot));
  const std::string out = dir / "check.json";
  const std::string command = std::string("\"") + GCLAB_PYTHON + "\" \"" + GCLAB_SOURCE_DIR +
                              "/tests/reference/memory_snapshot_check.py\" \"" + options.memory_snapshot.string() +
                              "\" > \"" + out + "\"";
  if (std::system(command.c_str()) != 0) GTEST_SKIP() << "PyTorch's _memory_viz did not run";
  std::ifstream in(out);
  const auto j = nlohmann::json::parse(in);
  EXPECT_GT(j["events"].get<int>(), 100);
  const auto actions = j["actions"].get<std::vector<std::string>>();
  EXPECT_EQ(actions, (std::vector<std::string>{"alloc", "free_completed", "free_requested", "oom"}));
  const auto phases = j["phases"].get<std::vector<std::string>>();
  for (const char* p : {"setup", "data", "text", "forward"})
    EXPECT_NE(std::find(phases.begin(), phases.end(), p), phases.end()) << p << " not in " << j["phases"].dump();
  ASSERT_EQ(j["oom_requested"].size(), 1u);
  EXPECT_GT(j["oom_requested"][0].get<int64_t>(), 0);
  EXPECT_GT(j["segments"].get<int>(), 0);
  EXPECT_TRUE(j["replayed_live_in_segments"].get<bool>());
  EXPECT_EQ(j["unpaired_frees"].get<int>(), 0);
  EXPECT_TRUE(j["segsum_ok"].get<bool>());
  EXPECT_TRUE(j["trace_ok"].get<bool>());
  fs::remove_all(dir);
}

// A batch's loss masks weigh the loss as SDTrainer's mask_multiplier (SDTrainer.py:1484-1504, 953-959): each
// brought to the latents' size (nearest), over every channel, divided by the batch's mean — a sample with a
// zero mask (no mask file beside one that has) does not train.
TEST(Session, LossMasksWeighTheLossAsAiToolkitsMaskMultiplier) {
  const fs::path dir = testing::fresh_dir("session_loss_mask");
  Session session(tiny_config(dir, "m"));
  data::LoadedBatch lb = session.synthetic_batch({2, 1, 64, 64});
  lb.loss_mask = torch::zeros({2, 1, 64, 64});
  lb.loss_mask[0].fill_(1.0);
  lb.loss_mask[0].narrow(1, 32, 32).fill_(0.25);  // the bottom half at mask_min_value 0.25
  torch::manual_seed(2);
  const MicroBatch mb = session.micro_batch(lb);
  ASSERT_TRUE(mb.loss_mask.defined());
  ASSERT_EQ(mb.loss_mask.sizes(), mb.x0.sizes());
  torch::Tensor m = torch::zeros_like(mb.x0);
  const int64_t h = mb.x0.size(2);
  m[0].fill_(1.0);
  m[0].narrow(1, h / 2, h / 2).fill_(0.25);
  m = m / m.mean();
  EXPECT_TRUE(torch::allclose(mb.loss_mask, m));
  const torch::Tensor diff = velocity_error(session, mb);
  const StepOptions o;
  const double masked = flow_matching_loss(session.model(), mb, o).item<double>();
  EXPECT_NEAR(masked, (diff.square() * m).mean().item<double>(), 1e-6);
  MicroBatch plain = mb;
  plain.loss_mask = torch::Tensor();
  EXPECT_GT(std::abs(flow_matching_loss(session.model(), plain, o).item<double>() - masked), 1e-4);
  fs::remove_all(dir);
}

// unload_text_encoder without cached captions, as AI Toolkit runs it: the encoder is gone after the
// precompute, and every step trains on the trigger word's embedding whatever the captions say.
TEST(Session, UnloadingTheTextEncoderWithoutCachingTrainsOnTheTriggerWordAsAiToolkit) {
  const fs::path dir = testing::fresh_dir("session_unload");
  Session session(tiny_config(dir, "u",
                              {"train.unload_text_encoder=true", "train.cache_text_embeddings=false",
                               "trigger_word=sks", "train.disable_sampling=true"}));
  EXPECT_GT(session.resident().text_encoder, 0);
  session.precompute_text(std::vector<std::string>{"a red circle", "a blue square"});
  EXPECT_EQ(session.resident().text_encoder, 0);
  data::LoadedBatch a = session.synthetic_batch({1, 1, 64, 64}), b = a;
  a.captions = {"a red circle"}, b.captions = {"a blue square"};
  const torch::Tensor ta = session.micro_batch(a).conditioning.text, tb = session.micro_batch(b).conditioning.text;
  EXPECT_TRUE(torch::equal(ta, tb));
  fs::remove_all(dir);
}

// AI Toolkit unloads the encoder when captions are cached too (is_caching_text_embeddings takes the unload
// path), with unload_text_encoder unset, and per dataset as well as for the run: the captions still get their
// own embeddings, and the estimate does not count the encoder.
TEST(Session, CachingTextEmbeddingsUnloadsTheEncoderAsAiToolkit) {
  const fs::path dir = testing::fresh_dir("session_cache_text");
  for (const char* knob : {"train.cache_text_embeddings=true", "datasets.0.cache_text_embeddings=true"}) {
    const auto config = tiny_config(dir, "c", {knob, "train.unload_text_encoder=false", "train.disable_sampling=true"});
    EXPECT_TRUE(text_encoder_leaves(config)) << knob;
    Session session(config);
    EXPECT_GT(session.resident().text_encoder, 0);
    session.precompute_text(std::vector<std::string>{"a red circle", "a blue square"});
    EXPECT_EQ(session.resident().text_encoder, 0) << knob;
    data::LoadedBatch a = session.synthetic_batch({1, 1, 64, 64}), b = a;
    a.captions = {"a red circle"}, b.captions = {"a blue square"};
    EXPECT_FALSE(torch::equal(session.micro_batch(a).conditioning.text, session.micro_batch(b).conditioning.text));
    EXPECT_EQ(train::estimate_memory(config).text_encoder_bytes, 0) << knob;
  }
  EXPECT_FALSE(text_encoder_leaves(tiny_config(dir, "k", {"train.disable_sampling=true"})));
  fs::remove_all(dir);
}

// A family whose text length follows the caption (Qwen-Image): after the encoder leaves, a batch of cached
// captions of different lengths still finds each one's embedding, padded to the longest, as before it left.
TEST(Session, CachedCaptionsOfAVariableLengthFamilyOutliveTheEncoder) {
  const fs::path dir = testing::fresh_dir("session_cache_qwen");
  const auto config = tiny_config(dir, "q",
                                  {"model.arch=tiny-qwen-image", "train.cache_text_embeddings=true",
                                   "train.disable_sampling=true", "train.batch_size=2"});
  const std::vector<std::string> captions = {"a red circle", "a small white circle on the right on a red background"};
  Session kept(
      tiny_config(dir, "k", {"model.arch=tiny-qwen-image", "train.disable_sampling=true", "train.batch_size=2"}));
  Session session(config);
  session.precompute_text(captions);
  ASSERT_EQ(session.resident().text_encoder, 0);
  data::LoadedBatch batch = session.synthetic_batch({2, 1, 64, 64});
  batch.captions = captions;
  const torch::Tensor after = session.micro_batch(batch).conditioning.text;
  const torch::Tensor resident = kept.micro_batch(batch).conditioning.text;
  EXPECT_EQ(after.sizes(), resident.sizes());
  EXPECT_TRUE(torch::equal(after, resident));
  batch.captions = {"a caption nobody precomputed", "a red circle"};
  EXPECT_THROW(session.micro_batch(batch), UserError);
  fs::remove_all(dir);
}

// An edit model's text encoder reads each sample's control image through its vision tower, as AI Toolkit's
// qwen_image_edit get_prompt_embeds: the caption's rows grow by the image's tokens, another control image
// gives another embedding, and cached embeddings are found by caption and control file after the encoder
// left (equal to the resident encoder's).
TEST(Session, EditModelsEncodeEachCaptionWithItsControlImage) {
  const fs::path dir = testing::fresh_dir("session_edit_text");
  const fs::path a = dir / "a.png", b = dir / "b.png";
  torch::manual_seed(3);
  data::write_png(a, torch::randint(0, 256, {48, 64, 3}, torch::kUInt8));
  data::write_png(b, torch::randint(0, 256, {48, 64, 3}, torch::kUInt8));
  const std::vector<std::string> base = {"model.arch=tiny-qwen-image-edit", "train.disable_sampling=true"};
  auto with = [&](std::vector<std::string> extra) {
    extra.insert(extra.end(), base.begin(), base.end());
    return extra;
  };
  Session kept(tiny_config(dir, "k", with({})));
  Session cached(tiny_config(dir, "c", with({"train.cache_text_embeddings=true"})));
  const std::string caption = "a red circle";
  cached.precompute_text({data::Caption{caption, {a}, {}, {}}, data::Caption{caption, {b}, {}, {}}});
  ASSERT_EQ(cached.resident().text_encoder, 0);
  data::LoadedBatch batch = kept.synthetic_batch({1, 1, 64, 64});
  batch.captions = {caption};
  batch.control_images.clear();
  batch.control_files = {{a}};
  const torch::Tensor ka = kept.micro_batch(batch).conditioning.text, ca = cached.micro_batch(batch).conditioning.text;
  batch.control_files = {{b}};
  const torch::Tensor kb = kept.micro_batch(batch).conditioning.text, cb = cached.micro_batch(batch).conditioning.text;
  // 112²-area at 3:4 -> 96x128 -> the processor's 84x140 -> 15 tokens, and the markers.
  const int64_t words = kept.text().encoder()->rows(caption);
  EXPECT_EQ(ka.size(1), words - 3 + 1 + 15 + 1);
  EXPECT_FALSE(torch::allclose(ka, kb));
  EXPECT_TRUE(torch::equal(ka, ca));
  EXPECT_TRUE(torch::equal(kb, cb));
  batch.control_files = {{dir / "c.png"}};  // never precomputed
  EXPECT_THROW(cached.micro_batch(batch), UserError);
  fs::remove_all(dir);
}

// cache_text_embeddings keeps a dataset caption's embedding on disk beside its image, as AI Toolkit's
// _t_e_cache/ (PromptEmbeds.save: text_embed [1, T, D]); nothing of it stays in host memory, a batch reads
// it back equal to the resident encoder's, and the next run reuses the file instead of encoding again.
// A tiny Qwen-Image-Edit run previewing `samples` (YAML) at 64², with a 64x48 control image at
// dir/control.png.
config::ProcessConfig edit_preview_config(const fs::path& dir, const std::string& samples) {
  torch::manual_seed(5);
  data::write_png(dir / "control.png", torch::randint(0, 256, {48, 64, 3}, torch::kUInt8));
  return tiny_config(dir, "p",
                     {"model.arch=tiny-qwen-image-edit", "sample.sample_steps=1", "sample.width=64", "sample.height=64",
                      "sample.samples=" + samples, "train.disable_sampling=false"});
}

// The memory model walks a preview's control images and its decode through the Session's own code
// (walk_preview_controls, walk_preview_decode): the files read in host memory, copied to the device in the
// autoencoder's dtype and encoded, the decode and the frames' uint8 conversion. What the real calls hold on
// the CPU is what the walks say, to the byte (float32).
TEST(Session, APreviewsControlEncodeAndDecodeAreWhatTheirWalksHold) {
  const fs::path dir = testing::fresh_dir("session_preview_walks");
  Session session(
      edit_preview_config(dir, "[{prompt: 'make it blue', ctrl_img: '" + (dir / "control.png").string() + "'}]"));
  ASSERT_TRUE(session.codec_spec().autoencoder);
  ASSERT_FALSE(session.codec().offloaded());  // latents encoded on the fly: it stays on the device
  auto measured = [&](const std::function<void()>& f) {
    const int64_t before = session.meter().stats().live_bytes;
    session.meter().reset_peak();
    f();
    return session.meter().stats().peak_bytes - before;
  };
  const sample::SampleOptions so = session.preview_options(0);
  model::ModelInputs cond, uncond;
  const int64_t controls = measured([&] { session.preview_controls(0, so, cond, uncond); });
  ASSERT_EQ(cond.reference_latents.size(), 1u);
  EXPECT_EQ(session.walk_preview_controls(0), controls);
  const model::SampleShape shape{1, 1, so.height, so.width};
  const torch::Tensor z = torch::randn(model::latent_shape(session.spec(), shape));
  const int64_t decode = measured([&] { session.decode_preview(z); });
  EXPECT_EQ(session.walk_preview_decode(shape), decode);
  fs::remove_all(dir);
}

// An edit model's preview conditions on its sample's ctrl_img as the pipelines do: the control image at a
// 1024² area of its aspect, encoded to reference latents, beside the prompt encoded with it; a ctrl_img that
// is not a file is warned about and left out.
TEST(Session, EditPreviewsEncodeTheirControlImage) {
  const fs::path dir = testing::fresh_dir("session_edit_preview");
  const fs::path control = dir / "control.png";
  Session session(edit_preview_config(dir, "[{prompt: 'make it blue', ctrl_img: '" + control.string() +
                                               "'}, {prompt: 'a', ctrl_img: '" + (dir / "missing.png").string() +
                                               "'}]"));
  const auto refs = session.preview_references({control}, 64, 48 * 2);
  ASSERT_EQ(refs.size(), 1u);
  // Qwen-Image-Edit resizes the control image to the preview's 64x96 first (qwen_image_edit.py:98-105): the
  // tiny preset's 512² area at 2:3 -> 418x627 -> rounded to multiples of 32, 416x640 -> latents / 8.
  const data::BucketResolution ref = preview_reference_size(session.spec(), {64, 48}, 64, 96);
  EXPECT_EQ(ref.width, 416);
  EXPECT_EQ(ref.height, 640);
  EXPECT_EQ(refs[0].sizes(), (std::vector<int64_t>{1, session.spec().latent_channels, ref.height / 8, ref.width / 8}));
  // The Plus pipeline keeps the image's 4:3 and rounds as calculate_dimensions (1182.4 x 886.8 at 1024²:
  // 1184 x 896, where flooring gave 1152 x 864).
  const data::BucketResolution plus =
      preview_reference_size(model::spec_by_preset("qwen-image-edit-2509"), {64, 48}, 64, 96);
  EXPECT_EQ(plus.width, 1184);
  EXPECT_EQ(plus.height, 896);
  EXPECT_TRUE(session.preview_references({}, 64, 64).empty());
  const auto files = session.sample(0, dir / "samples");
  EXPECT_EQ(files.size(), 2u);
  for (const auto& f : files) EXPECT_TRUE(fs::exists(f)) << f;
  fs::remove_all(dir);
}

TEST(Session, CachedTextEmbeddingsLiveInTeCacheFilesBesideTheImages) {
  const fs::path dir = testing::fresh_dir("session_te_cache");
  const std::vector<std::string> knobs = {"model.arch=tiny-qwen-image", "train.disable_sampling=true",
                                          "train.batch_size=1"};
  auto with = [&](std::vector<std::string> extra) {
    extra.insert(extra.end(), knobs.begin(), knobs.end());
    return extra;
  };
  Session kept(tiny_config(dir, "k", with({})));
  fs::path image;
  for (const auto& f : fs::directory_iterator(dir / "data"))
    if (f.path().extension() == ".png") image = f.path();
  ASSERT_FALSE(image.empty());
  const data::Caption caption{"a red circle", {}, {}, image};
  data::LoadedBatch batch = kept.synthetic_batch({1, 1, 64, 64});
  batch.captions = {caption.text};
  batch.image_files = {image};
  const torch::Tensor resident = kept.micro_batch(batch).conditioning.text;
  fs::path file;
  {
    Session first(tiny_config(dir, "c", with({"train.cache_text_embeddings=true"})));
    first.precompute_text({caption});
    file = first.text().cache_file(caption);
    EXPECT_EQ(file.parent_path(), image.parent_path() / "_t_e_cache");
    EXPECT_EQ(file.filename().string().rfind(image.stem().string() + "_", 0), 0u) << file;
    ASSERT_TRUE(fs::exists(file));
    EXPECT_EQ(first.text().cache_files(), std::vector<fs::path>{file});
    // In host memory: only what belongs to no image (the empty prompt every cached run encodes too).
    EXPECT_EQ(first.resident().text_cache_host,
              kept.text().encoder()->rows("") * resident.size(2) * static_cast<int64_t>(resident.element_size()));
    const auto saved = io::load_safetensors(file);
    ASSERT_TRUE(saved.count("text_embed"));
    EXPECT_TRUE(torch::equal(saved.at("text_embed"), resident.to(torch::kCPU)));
    EXPECT_TRUE(torch::equal(first.micro_batch(batch).conditioning.text, resident));
  }
  // The next run finds the file: its values, not a new encode (marked here by changing them on disk).
  auto tensors = io::SafetensorsFile::open(file);
  const auto metadata = tensors.metadata();
  const torch::Tensor marked = tensors.tensor("text_embed").clone() + 1;
  io::save_safetensors(file, {{"text_embed", marked}}, metadata);
  Session second(tiny_config(dir, "s", with({"train.cache_text_embeddings=true"})));
  second.precompute_text({caption});
  EXPECT_TRUE(torch::equal(second.micro_batch(batch).conditioning.text, marked));
  fs::remove_all(dir);
}

TEST(Session, BuildsTheModelInItsTrainingDtypeWithoutAFloat32Copy) {
  const fs::path dir = testing::fresh_dir("session_build");
  memory::CpuMemoryTracker tracker;
  tracker.reset_peak();
  const int64_t before = tracker.stats().live_bytes;
  Session session(tiny_config(dir, "b", {"train.dtype=bf16"}));
  const ResidentBytes r = session.resident();
  const int64_t peak = tracker.stats().peak_bytes - before;
  EXPECT_EQ(session.model().blocks().front()->parameters().front().scalar_type(), torch::kBFloat16);
  EXPECT_LT(peak, r.weights + r.text_encoder + r.weights / 10) << "peak " << peak << " weights " << r.weights;
  fs::remove_all(dir);
}

// Every AI Toolkit example config gclab models, shrunk to its family's tiny preset (256², 2 steps, its own
// sample block at 256² with 2 sample steps, the baseline sample included), trains end to end: its
// prompts, negative prompt, guidance, optimizer, timestep type and dtype as written. One test per config
// (ctest runs them side by side): AI Toolkit's examples, and jobs in the shape its web UI writes. The
// latents come from the DCT stand-in: most examples train in bf16, and on a CPU without AVX-512 PyTorch
// runs a bf16 3-D convolution on its slow path (about 30 s for one 256² Qwen-Image encode, 12 minutes a
// test); the autoencoders' own runs are tested in autoencoder_run_test.cpp and against diffusers.
std::vector<fs::path> example_configs() {
  std::vector<fs::path> configs;
  for (const auto& root : {fs::path(GCLAB_SHARED_DIR) / "aitk-configs", fs::path(GCLAB_SOURCE_DIR) / "configs/aitk-ui"})
    if (fs::is_directory(root))
      for (const auto& e : fs::directory_iterator(root))
        if (e.path().extension() == ".yaml") configs.push_back(e.path());
  std::sort(configs.begin(), configs.end());
  return configs;
}

class AitkExample : public ::testing::TestWithParam<fs::path> {};

TEST_P(AitkExample, TrainsEndToEndShrunkToItsTinyPreset) {
  const fs::path config_file = GetParam();
  const auto as_written = model::load_config_file(config_file.string());
  if (!as_written.ok()) GTEST_SKIP() << "an arch gclab does not model: refused by check and train alike";
  const std::string name = config_file.stem().string();
  const fs::path dir = testing::fresh_dir("aitk_e2e_" + name);
  data::SynthOptions o;
  o.count = 4;
  o.sizes = {{256, 256}};
  data::write_synthetic_dataset(dir / "data", o);
  for (int c = 0; c < 3; ++c) data::write_synthetic_dataset(dir / ("control" + std::to_string(c)), o);
  // The family's tiny preset of the same kind: edit references, image-to-video channels, latent channels.
  std::string tiny;
  const model::ModelSpec written = model::spec_for(as_written.config->model);
  for (const auto& a : model::supported_archs()) {
    if (!a.tiny || a.family != model::find_arch(as_written.config->model.arch)->family) continue;
    const model::ModelSpec t = model::spec_by_preset(a.preset);
    if (tiny.empty() || (written.reference_tokens == t.reference_tokens &&
                         written.condition_input_channels == t.condition_input_channels &&
                         written.latent_channels == t.latent_channels))
      tiny = a.name;
  }
  // The DCT stand-in is an image codec: a video family keeps its own (tiny) autoencoder, and previews 5 frames.
  const bool video = model::takes_frames(model::spec_by_preset(model::find_arch(tiny)->preset));
  std::vector<std::string> shrink = {"model.arch=" + tiny,
                                     video ? "sample.num_frames=5" : "model.vae=dct",
                                     "training_folder=" + (dir / "out").string(),
                                     "device=cpu",
                                     "datasets.0.folder_path=" + (dir / "data").string(),
                                     "datasets.0.resolution=[256]",
                                     "train.steps=2",
                                     "train.skip_first_sample=false",
                                     "train.disable_sampling=false",
                                     "sample.width=256",
                                     "sample.height=256",
                                     "sample.sample_steps=2",
                                     "sample.sample_every=2"};
  if (!as_written.config->datasets.at(0).control_path.empty()) {
    std::string controls;
    for (size_t c = 0; c < as_written.config->datasets[0].control_path.size(); ++c)
      controls += (c ? ", " : "") + (dir / ("control" + std::to_string(c))).string();
    shrink.push_back("datasets.0.control_path=[" + controls + "]");
  }
  if (as_written.config->source.origin_by_path.count("sample.samples")) {  // items of their own (not `prompts`)
    for (size_t i = 0; i < as_written.config->sample->samples.size(); ++i) {
      shrink.push_back("sample.samples." + std::to_string(i) + ".width=256");
      shrink.push_back("sample.samples." + std::to_string(i) + ".height=256");
      shrink.push_back("sample.samples." + std::to_string(i) + ".sample_steps=2");
    }
  }
  config::LoadOptions options;
  options.overrides = shrink;
  const auto shrunk = model::load_config_file(config_file.string(), options);
  ASSERT_TRUE(shrunk.ok()) << name << ": " << shrunk.diagnostics.all().front().format();
  TrainSummary s;
  ASSERT_NO_THROW(s = train(*shrunk.config, {})) << name;
  EXPECT_EQ(s.end_step, 2) << name;
  if (shrunk.config->sample) {
    EXPECT_FALSE(s.samples.empty()) << name;
  }
  fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(AitkExamples, AitkExample, ::testing::ValuesIn(example_configs()),
                         [](const ::testing::TestParamInfo<fs::path>& info) {
                           std::string id =
                               info.param.parent_path().filename().string() + "_" + info.param.stem().string();
                           for (char& c : id)
                             if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
                           return id;
                         });

// The examples above are most of AI Toolkit's: at least 14 of them are archs gclab models.
TEST(AitkExamples, MostExamplesAreModelled) {
  int modelled = 0;
  for (const auto& config : example_configs()) modelled += model::load_config_file(config.string()).ok() ? 1 : 0;
  EXPECT_GE(modelled, 14);
}

// save_format: diffusers — a LoRA is still one file (AI Toolkit's UI writes the key into every job); a full
// fine-tune is a diffusers folder whose transformer/ loads back into the model it came from.
TEST(Trainer, DiffusersSaveFormatWritesAFolderForAFullFineTuneAndOneFileForALora) {
  const fs::path dir = testing::fresh_dir("train_diffusers");
  train(tiny_config(dir, "lora", {"save.save_format=diffusers", "train.steps=2"}), {});
  EXPECT_TRUE(fs::is_regular_file(dir / "lora" / "lora.safetensors"));
  auto full = tiny_config(dir, "full", {"save.save_format=diffusers", "train.steps=2"});
  full.network.reset();
  train(full, {});
  const fs::path transformer = dir / "full" / "full" / "transformer";
  ASSERT_TRUE(fs::is_regular_file(transformer / "config.json"));
  std::ifstream config_in(transformer / "config.json");
  const auto config = nlohmann::json::parse(config_in);
  EXPECT_EQ(config["_class_name"], "FluxTransformer2DModel");
  EXPECT_EQ(config["num_layers"], 2);
  EXPECT_EQ(config["num_single_layers"], 2);
  // The saved weights are the trained ones: a fresh model loads them with nothing missing or left over.
  auto fresh = model::build_transformer(model::spec_by_preset("tiny-flux"));
  EXPECT_TRUE(model::load_weights(*fresh, transformer / "diffusion_pytorch_model.safetensors").empty());
  const auto step2 = io::SafetensorsFile::open(dir / "full" / "full_000000002.state.safetensors");
  for (const auto& p : fresh->named_parameters())
    EXPECT_TRUE(torch::equal(p.value().to(torch::kHalf), step2.tensor("param." + p.key()).to(torch::kHalf))) << p.key();
  fs::remove_all(dir);
}

// FLUX.1 Kontext (AI Toolkit's FluxKontextModel): each step appends the control image's latents (scaled and
// cropped as its image, encoded at its size) to the image sequence — another loss than without controls,
// checkpointing on and off to the same losses; a preview edits its ctrl_img. What the class fails on is
// refused before anything loads: a preview without a ctrl_img, two control images a sample.
TEST(Trainer, FluxKontextTrainsOnItsControlImagesAndPreviewsAnEdit) {
  const fs::path dir = testing::fresh_dir("flux_kontext");
  data::SynthOptions o;
  o.count = 6, o.sizes = {{64, 64}, {96, 64}}, o.seed = 9;
  data::write_synthetic_dataset(dir / "controls", o);
  const std::string control = (dir / "controls" / "synth_0000.png").string();
  const std::vector<std::string> kontext = {"model.arch=tiny-flux-kontext", "train.steps=2",
                                            "datasets.0.control_path=[" + (dir / "controls").string() + "]"};
  auto with = [&](std::vector<std::string> extra) {
    extra.insert(extra.begin(), kontext.begin(), kontext.end());
    return extra;
  };
  const TrainSummary on = train(tiny_config(dir, "on", with({})), {});
  const TrainSummary off = train(tiny_config(dir, "off", with({"train.gradient_checkpointing=false"})), {});
  testing::expect_same_losses(on.losses, off.losses, 2);
  for (const double loss : on.losses) EXPECT_TRUE(std::isfinite(loss));
  const TrainSummary bare = train(tiny_config(dir, "bare", {"model.arch=tiny-flux-kontext", "train.steps=2"}), {});
  ASSERT_EQ(bare.losses.size(), 2u);
  EXPECT_NE(bare.losses[0], on.losses[0]);  // the same images and noise, without the reference tokens
  const TrainSummary previewed =
      train(tiny_config(dir, "previewed",
                        with({"train.steps=1", "train.disable_sampling=false", "sample.sample_every=1",
                              "sample.width=64", "sample.height=48", "sample.sample_steps=2",
                              "sample.prompts=['make it blue --ctrl_img " + control + "']"})),
            {});
  ASSERT_FALSE(previewed.samples.empty());
  EXPECT_TRUE(fs::exists(previewed.samples.front()));
  auto refused = [&](std::vector<std::string> extra, const std::string& says) {
    try {
      train(tiny_config(dir, "refused", with(std::move(extra))), {});
      ADD_FAILURE() << "accepted: " << says;
    } catch (const UserError& e) {
      EXPECT_NE(std::string(e.what()).find(says), std::string::npos) << e.what();
    }
  };
  refused({"train.disable_sampling=false", "sample.sample_every=1", "sample.prompts=[make it blue]"},
          "Control image is required");
  refused({"datasets.0.control_path=[" + (dir / "controls").string() + ", " + (dir / "controls").string() + "]"},
          "takes 1");
  fs::remove_all(dir);
}

// Chroma (AI Toolkit's ChromaModel): the T5 rows of each caption go to the transformer with the tokenizer's
// mask, cached beside them (PromptEmbeds.save's attention_mask: ones on the caption's tokens, zeros on the
// padding to 32) and read back; checkpointing on and off give the same losses; a preview at guidance 4 runs
// the negative prompt in a forward of its own (ChromaPipeline). Its adapters are the blocks' fused Linears.
TEST(Trainer, ChromaTrainsOnMaskedT5RowsAndPreviewsWithCfg) {
  const fs::path dir = testing::fresh_dir("chroma");
  const std::vector<std::string> chroma = {"model.arch=tiny-chroma", "train.steps=2",
                                           "train.cache_text_embeddings=true"};
  auto with = [&](std::vector<std::string> extra) {
    extra.insert(extra.begin(), chroma.begin(), chroma.end());
    return extra;
  };
  const TrainSummary on = train(tiny_config(dir, "on", with({})), {});
  const TrainSummary off = train(tiny_config(dir, "off", with({"train.gradient_checkpointing=false"})), {});
  testing::expect_same_losses(on.losses, off.losses, 2);
  for (const double loss : on.losses) EXPECT_TRUE(std::isfinite(loss));
  int cached = 0;
  for (const auto& e : fs::directory_iterator(dir / "data" / "_t_e_cache")) {
    const auto file = io::SafetensorsFile::open(e.path());
    ASSERT_TRUE(file.contains("attention_mask")) << e.path();
    const torch::Tensor mask = file.tensor("attention_mask");
    ASSERT_EQ(mask.sizes(), c10::IntArrayRef({1, 32}));
    const int64_t tokens = mask.sum().item<int64_t>();
    EXPECT_GT(tokens, 0);
    EXPECT_LT(tokens, 32);
    EXPECT_TRUE(torch::equal(mask.narrow(1, 0, tokens), torch::ones({1, tokens}, mask.options())));
    EXPECT_EQ(file.tensor("text_embed").size(1), 32);  // every row, padding included
    ++cached;
  }
  EXPECT_GT(cached, 0);
  const TrainSummary again = train(tiny_config(dir, "again", with({})), {});  // the cache read back
  testing::expect_same_losses(again.losses, on.losses, 2);
  const auto lora = io::SafetensorsFile::open(on.saves.back());
  EXPECT_EQ(lora.tensor("diffusion_model.double_blocks.0.img_attn.qkv.lora_B.weight").size(0), 3 * 128);
  EXPECT_TRUE(lora.contains("diffusion_model.single_blocks.1.linear1.lora_A.weight"));
  for (const auto& e : lora.entries())
    EXPECT_TRUE(e.name.find("distilled_guidance_layer") == std::string::npos &&
                e.name.find("img_in") == std::string::npos && e.name.find("final_layer") == std::string::npos)
        << e.name;
  const TrainSummary previewed =
      train(tiny_config(dir, "previewed",
                        with({"train.steps=1", "train.disable_sampling=false", "sample.sample_every=1",
                              "sample.width=64", "sample.height=48", "sample.sample_steps=2", "sample.guidance_scale=4",
                              "sample.prompts=['a red square']"})),
            {});
  ASSERT_FALSE(previewed.samples.empty());
  EXPECT_TRUE(fs::exists(previewed.samples.front()));
  fs::remove_all(dir);
}

// FLUX.2 klein (AI Toolkit's Flux2KleinModel): a control folder's images taken raw — each at its own size, capped
// and cropped to 16 as its pipeline prepares a reference — their tokens after the image's at t = 10; without a
// control folder the same model trains text-to-image (another loss); checkpointing on and off give the same
// losses; a preview takes its ctrl_img the same way. What AI Toolkit fails on is refused by name: a batch whose
// references differ in size, a control image below 64 pixels a side.
TEST(Trainer, Flux2KleinTrainsOnRawReferenceImagesOrWithout) {
  const fs::path dir = testing::fresh_dir("flux2_klein");
  data::SynthOptions o;
  o.count = 6, o.sizes = {{80, 96}}, o.seed = 9;
  data::write_synthetic_dataset(dir / "controls", o);
  const std::string control = (dir / "controls" / "synth_0000.png").string();
  const std::vector<std::string> klein = {"model.arch=tiny-flux2-klein", "train.steps=2",
                                          "datasets.0.control_path=[" + (dir / "controls").string() + "]"};
  auto with = [&](std::vector<std::string> extra) {
    extra.insert(extra.begin(), klein.begin(), klein.end());
    return extra;
  };
  const TrainSummary on = train(tiny_config(dir, "on", with({})), {});
  const TrainSummary off = train(tiny_config(dir, "off", with({"train.gradient_checkpointing=false"})), {});
  testing::expect_same_losses(on.losses, off.losses, 2);
  const TrainSummary bare = train(tiny_config(dir, "bare", {"model.arch=tiny-flux2-klein", "train.steps=2"}), {});
  ASSERT_EQ(bare.losses.size(), 2u);
  EXPECT_NE(bare.losses[0], on.losses[0]);  // the same images and noise, without the reference tokens
  const TrainSummary previewed =
      train(tiny_config(dir, "previewed",
                        with({"train.steps=1", "train.disable_sampling=false", "sample.sample_every=1",
                              "sample.width=64", "sample.height=48", "sample.sample_steps=2", "sample.guidance_scale=4",
                              "sample.prompts=['make it blue --ctrl_img " + control + "']"})),
            {});
  ASSERT_FALSE(previewed.samples.empty());
  // An 80 x 96 control image keeps its size, cropped to 80 x 96 (multiples of 16): 5 x 6 tokens at 16 pixels.
  const auto ref = data::raw_reference_image(data::decode_image_rgb(control), 1024 * 1024);
  EXPECT_EQ(ref.sizes(), c10::IntArrayRef({3, 96, 80}));
  auto refused = [&](const std::string& name, std::vector<std::string> extra, const std::string& says) {
    try {
      train(tiny_config(dir, name, with(std::move(extra))), {});
      ADD_FAILURE() << "accepted: " << says;
    } catch (const std::exception& e) {
      EXPECT_NE(std::string(e.what()).find(says), std::string::npos) << e.what();
    }
  };
  o.count = 6, o.sizes = {{80, 96}, {96, 64}};  // two sizes: a batch of two meets both
  data::write_synthetic_dataset(dir / "mixed", o);
  refused("mixed", {"datasets.0.control_path=[" + (dir / "mixed").string() + "]", "train.steps=6"},
          "must give one size");
  o.sizes = {{48, 64}};
  data::write_synthetic_dataset(dir / "small", o);
  refused("small", {"datasets.0.control_path=[" + (dir / "small").string() + "]"}, "below 64 pixels");
  fs::remove_all(dir);
}

// FLUX.2-dev (AI Toolkit's Flux2Model): the tiny Mistral's stacked layers as the text, the guidance embedder
// trained at train.cfg_scale — bypass_guidance_embedding, FLUX.1's switch, is not read (the UI sends it true),
// another cfg_scale is another loss — checkpointing on and off give the same losses, and a preview embeds
// its guidance_scale in one forward a step.
TEST(Trainer, Flux2DevTrainsItsGuidanceEmbedderAtCfgScale) {
  const fs::path dir = testing::fresh_dir("flux2_dev");
  const std::vector<std::string> dev = {"model.arch=tiny-flux2-dev", "train.steps=2"};
  auto with = [&](std::vector<std::string> extra) {
    extra.insert(extra.begin(), dev.begin(), dev.end());
    return extra;
  };
  const TrainSummary on = train(tiny_config(dir, "on", with({})), {});
  const TrainSummary off = train(tiny_config(dir, "off", with({"train.gradient_checkpointing=false"})), {});
  testing::expect_same_losses(on.losses, off.losses, 2);
  const TrainSummary bypass = train(tiny_config(dir, "bypass", with({"train.bypass_guidance_embedding=true"})), {});
  testing::expect_same_losses(on.losses, bypass.losses, 2);  // not read: the same guidance embedded
  const TrainSummary scaled = train(tiny_config(dir, "scaled", with({"train.cfg_scale=4"})), {});
  ASSERT_EQ(scaled.losses.size(), 2u);
  EXPECT_NE(scaled.losses[0], on.losses[0]);  // the same images and noise under another embedded guidance
  // One preview after one step at guidance g: the scale is the model's input (no second forward to mix), so
  // the image at 4 differs from the one at 1 only through it.
  auto preview_at = [&](const std::string& name, const std::string& g) {
    const TrainSummary s =
        train(tiny_config(dir, name,
                          with({"train.steps=1", "train.disable_sampling=false", "sample.sample_every=1",
                                "sample.width=64", "sample.height=48", "sample.sample_steps=2",
                                "sample.guidance_scale=" + g, "sample.prompts=['a red fox']"})),
              {});
    EXPECT_EQ(s.samples.size(), 1u);
    std::ifstream in(s.samples.at(0), std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  const std::string at4 = preview_at("previewed", "4"), at1 = preview_at("guided1", "1");
  EXPECT_FALSE(at4.empty());
  EXPECT_NE(at4, at1);
  fs::remove_all(dir);
}

// model.name_or_path as a local diffusers folder: the shape from its config.json (any width and depth),
// the weights loaded and checked; without weights, that shape with random ones; weights of another shape
// are a UserError naming the first mismatch and how many there are.
// A Flex.2 (its 196-feature input, from a config.json) trained with a control folder and AI Toolkit's
// model_kwargs: each step encodes the batch's control images at the batch's size and hands the model the
// inpainting and control channels (the conditioning itself: Flex2.TrainingInputsAsAiToolkitsConditionNoisyLatents).
TEST(Trainer, Flex2TrainsWithItsControlImagesAndModelKwargs) {
  const fs::path dir = testing::fresh_dir("flex2_controls");
  data::SynthOptions o;
  o.count = 6;
  o.sizes = {{64, 64}, {96, 64}};
  data::write_synthetic_dataset(dir / "controls", o);
  fs::create_directories(dir / "flex2" / "transformer");
  std::ofstream(dir / "flex2" / "transformer" / "config.json")
      << R"({"_class_name": "FluxTransformer2DModel", "in_channels": 196, "out_channels": 64, "num_layers": 1,
             "num_single_layers": 1, "num_attention_heads": 2, "attention_head_dim": 32, "joint_attention_dim": 64,
             "pooled_projection_dim": 32, "guidance_embeds": true, "axes_dims_rope": [8, 12, 12]})";
  const std::vector<std::string> flex2 = {"model.arch=flex2",
                                          "model.name_or_path=" + (dir / "flex2").string(),
                                          "model.vae=dct",
                                          "train.steps=3",
                                          "train.bypass_guidance_embedding=true",
                                          "datasets.0.control_path=[" + (dir / "controls").string() + "]",
                                          "model.model_kwargs.control_dropout=0.5",
                                          "model.model_kwargs.do_random_inpainting=true",
                                          "model.model_kwargs.random_blur_mask=true",
                                          "model.model_kwargs.random_dialate_mask=true"};
  TrainSummary s;
  ASSERT_NO_THROW(s = train(tiny_config(dir, "flex2", flex2), {}));
  EXPECT_EQ(s.end_step, 3);
  for (const double loss : s.losses) EXPECT_TRUE(std::isfinite(loss));
  // Inpainting images (alpha 0 on the left third) and loss masks (dark at the top) beside every image
  // change what is trained: the same seed, other losses.
  fs::create_directories(dir / "inpaint");
  fs::create_directories(dir / "masks");
  for (const auto& entry : fs::directory_iterator(dir / "data")) {
    if (entry.path().extension() != ".png") continue;
    const auto size = data::read_image_size(entry.path());
    ASSERT_TRUE(size);
    torch::Tensor rgba = torch::full({size->height, size->width, 4}, 255, torch::kUInt8);
    rgba.narrow(1, 0, size->width / 3).select(2, 3).fill_(0);
    const torch::Tensor c = rgba.contiguous();
    ASSERT_TRUE(stbi_write_png((dir / "inpaint" / entry.path().filename()).c_str(), size->width, size->height, 4,
                               c.data_ptr<uint8_t>(), size->width * 4));
    torch::Tensor mask = torch::full({size->height, size->width, 3}, 255, torch::kUInt8);
    mask.narrow(0, 0, size->height / 4).fill_(30);
    data::write_png(dir / "masks" / entry.path().filename(), mask);
  }
  // Previews with a ctrl_img: a control (ctrl_idx 1) and an inpainting image (the default slot 0) each
  // change the picture; a control at the default slot is refused before anything runs.
  {
    const fs::directory_entry first = *std::find_if(fs::directory_iterator(dir / "inpaint"), fs::directory_iterator(),
                                                    [](const auto& e) { return e.path().extension() == ".png"; });
    fs::copy_file(first.path(), dir / "subject.inpaint.png");
    std::vector<std::string> previews = flex2;
    const std::string control = (dir / "controls" / first.path().filename()).string();
    previews.insert(previews.end(),
                    {"sample.sample_steps=2", "sample.width=64", "sample.height=64", "train.disable_sampling=false",
                     "sample.samples=[{prompt: 'a'}, {prompt: 'a', ctrl_img: '" + control +
                         "', ctrl_idx: 1}, {prompt: 'a --ctrl_img " + (dir / "subject.inpaint.png").string() + "'}]"});
    Session session(tiny_config(dir, "flex2_previews", previews));
    const auto files = session.sample(0, dir / "previews");
    ASSERT_EQ(files.size(), 3u);
    const torch::Tensor plain = data::decode_image_rgb(files[0]);
    EXPECT_FALSE(torch::equal(data::decode_image_rgb(files[1]), plain));
    EXPECT_FALSE(torch::equal(data::decode_image_rgb(files[2]), plain));
    previews.back() = "sample.samples=[{prompt: 'a', ctrl_img: '" + control + "'}]";
    EXPECT_THROW(Session(tiny_config(dir, "flex2_refused", previews)), UserError);
  }
  std::vector<std::string> with = flex2;
  with.push_back("datasets.0.inpaint_path=" + (dir / "inpaint").string());
  with.push_back("datasets.0.mask_path=" + (dir / "masks").string());
  with.push_back("datasets.0.mask_min_value=0.1");
  TrainSummary inpainted;
  ASSERT_NO_THROW(inpainted = train(tiny_config(dir, "flex2_inpaint", with), {}));
  ASSERT_EQ(inpainted.losses.size(), s.losses.size());
  for (size_t i = 0; i < s.losses.size(); ++i) {
    EXPECT_TRUE(std::isfinite(inpainted.losses[i]));
    EXPECT_NE(inpainted.losses[i], s.losses[i]) << "step " << i + 1;
  }
  // The same config for another arch: the keys are Flex.2's, said to do nothing there.
  const auto other = model::load_config_text(
      "name: x\nmodel: {arch: flux, model_kwargs: {control_dropout: 0.5}}\n"
      "datasets: [{folder_path: /tmp}]\n",
      "x.yaml");
  ASSERT_TRUE(other.ok());
  bool warned = false;
  for (const auto& d : other.diagnostics.all()) warned = warned || d.path == "model.model_kwargs";
  EXPECT_TRUE(warned);
  fs::remove_all(dir);
}

TEST(Session, ALocalDiffusersFolderGivesTheShapeAndTheWeights) {
  const fs::path dir = testing::fresh_dir("local_folder");
  auto full = tiny_config(dir, "full", {"save.save_format=diffusers", "train.steps=2"});
  full.network.reset();
  train(full, {});
  const fs::path folder = dir / "full" / "full";
  {
    Session s(tiny_config(dir, "again", {"model.name_or_path=" + folder.string()}));
    const auto saved = io::load_safetensors(folder / "transformer" / "diffusion_pytorch_model.safetensors");
    int compared = 0;
    for (const auto& p : s.model().named_parameters())
      if (saved.count(p.key())) {
        EXPECT_TRUE(torch::equal(p.value().to(torch::kFloat), saved.at(p.key()).to(torch::kFloat))) << p.key();
        ++compared;
      }
    EXPECT_GT(compared, 20);
  }
  // A shape of one's own: config.json only.
  fs::create_directories(dir / "custom" / "transformer");
  std::ofstream(dir / "custom" / "transformer" / "config.json")
      << R"({"_class_name": "FluxTransformer2DModel", "num_layers": 1, "num_single_layers": 3,
             "num_attention_heads": 2, "attention_head_dim": 32, "joint_attention_dim": 64,
             "pooled_projection_dim": 32, "guidance_embeds": true, "axes_dims_rope": [8, 12, 12]})";
  {
    Session s(tiny_config(dir, "custom", {"model.name_or_path=" + (dir / "custom").string()}));
    EXPECT_EQ(s.spec().hidden, 64);
    EXPECT_EQ(s.model().blocks().size(), 4u);
    EXPECT_NO_THROW(
        train(tiny_config(dir, "custom", {"model.name_or_path=" + (dir / "custom").string(), "train.steps=2"}), {}));
  }
  // The trained weights beside a config.json of another shape.
  fs::copy(folder / "transformer" / "diffusion_pytorch_model.safetensors",
           dir / "custom" / "transformer" / "diffusion_pytorch_model.safetensors");
  try {
    Session s(tiny_config(dir, "mismatch", {"model.name_or_path=" + (dir / "custom").string()}));
    FAIL() << "expected a UserError";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("more missing or misshapen"), std::string::npos) << e.what();
  }
  fs::remove_all(dir);
}

// budget:BYTES comes from the walk; train.budget_probe measures the same blocks on a probe forward (an
// optional check). On tiny-flux the two agree block by block to the byte, and the probe leaves the policy
// and the random stream as they were.
TEST(Session, TheBudgetProbeMeasuresWhatTheWalkSays) {
  const fs::path dir = testing::fresh_dir("budget_probe");
  Session session(tiny_config(dir, "p", {"train.checkpoint_policy=budget:2MiB", "train.budget_probe=true"}));
  const std::string applied = session.applied_policy().to_string();
  const torch::Tensor before = torch::rand({4});
  torch::manual_seed(7);
  const torch::Tensor a = torch::rand({4});
  torch::manual_seed(7);
  const auto [measured, walked] = session.probe_block_activations();
  const torch::Tensor b = torch::rand({4});
  EXPECT_GT(measured.total_off_bytes, 0);
  ASSERT_EQ(measured.per_block.size(), walked.per_block.size());
  for (size_t i = 0; i < measured.per_block.size(); ++i) {
    EXPECT_EQ(walked.per_block[i].saved, measured.per_block[i].saved) << "block " << i;
    EXPECT_EQ(walked.per_block[i].input, measured.per_block[i].input) << "block " << i;
  }
  EXPECT_TRUE(torch::equal(a, b));
  EXPECT_EQ(session.applied_policy().to_string(), applied);
  EXPECT_NE(applied.find("blocks:"), std::string::npos) << applied;
  EXPECT_NO_THROW(train(
      tiny_config(dir, "t", {"train.checkpoint_policy=budget:2MiB", "train.budget_probe=true", "train.steps=2"}), {}));
  fs::remove_all(dir);
}

// The LoRA file as AI Toolkit writes it (issue 32, row 20): Qwen-Image's and Z-Image's keys renamed to
// "diffusion_model." (qwen_image.py:418-423, z_image.py:467-472), FLUX's PEFT "transformer."; the metadata
// BaseSDTrainProcess.update_training_metadata adds (training_info, ss_base_model_version, ss_output_name,
// ss_tag_frequency with a trigger word) and software. load_lora reads the renamed file back.
// Caption dropout with cached text embeddings (AI Toolkit's load_prompt_embedding, dataloader_mixins.py:
// 2239-2253): still drawn per item, to the dropout caption's embedding, cached beside the image with the
// caption's own before training — two files an image — and the run trains with the encoders gone.
TEST(Trainer, CachedTextStillDropsCaptionsToTheCachedDropoutEmbedding) {
  const fs::path dir = testing::fresh_dir("cached_dropout");
  const auto config = tiny_config(dir, "cached_dropout",
                                  {"train.steps=4", "train.cache_text_embeddings=true", "trigger_word=sks",
                                   "datasets[0].caption_dropout_rate=0.5"});
  EXPECT_EQ(config.datasets[0].caption_dropout_rate, 0.5);
  const auto summary = train(config, {});
  EXPECT_EQ(summary.losses.size(), 4u);
  size_t files = 0;
  for (const auto& e : fs::directory_iterator(dir / "data" / "_t_e_cache")) files += e.is_regular_file() ? 1 : 0;
  EXPECT_EQ(files, 12u);  // six images: each one's caption and its dropout caption ("sks ")
  fs::remove_all(dir);
}

// model.only_if_contains / ignore_if_contains choose what a full fine-tune trains (AI Toolkit's
// named_parameters filters, stable_diffusion_model.py:2704-2713): the rest frozen, out of the optimizer;
// filters that leave nothing are a clear error.
TEST(Trainer, FullFineTuneTrainsWhatModelOnlyIfContainsLeaves) {
  const fs::path dir = testing::fresh_dir("only_if_contains");
  const auto config = tiny_config(
      dir, "o",
      {"network=null", "model.only_if_contains=[single_transformer_blocks]", "model.ignore_if_contains=[norm]"});
  Session session(config, SessionOptions{/*meta=*/true});
  ASSERT_FALSE(session.trained().empty());
  for (const auto& [name, p] : session.trained()) {
    EXPECT_EQ(name.rfind("single_transformer_blocks.", 0), 0u) << name;
    EXPECT_EQ(name.find("norm"), std::string::npos) << name;
  }
  int64_t frozen = 0;
  for (const auto& p : session.model().parameters()) frozen += p.requires_grad() ? 0 : 1;
  EXPECT_GT(frozen, 0);
  EXPECT_THROW(
      Session(tiny_config(dir, "o", {"network=null", "model.only_if_contains=[no_such_module]"}), SessionOptions{true}),
      UserError);
  fs::remove_all(dir);
}

// model.assistant_lora_path: the archs whose AI Toolkit model class loads it take it; the others would fail
// when they sample, so gclab refuses it before loading; a Hub name (not fetched) trains without it, said.
TEST(Trainer, AssistantAdapterIsTakenWhereAiToolkitTakesIt) {
  const fs::path dir = testing::fresh_dir("assistant");
  EXPECT_THROW(
      plan_run(tiny_config(dir, "a", {"model.arch=tiny-qwen-image", "model.assistant_lora_path=x.safetensors"})),
      UserError);
  const RunPlan hub = plan_run(
      tiny_config(dir, "a", {"model.assistant_lora_path=ostris/FLUX.1-schnell-training-adapter/a.safetensors"}));
  EXPECT_TRUE(hub.assistant_adapter.empty());
  ASSERT_FALSE(hub.warnings.empty());
  EXPECT_NE(hub.warnings.back().find("not a local file"), std::string::npos);
  // A local file (a LoRA this run writes) is merged in: the run trains and its previews sample.
  const auto first = train(tiny_config(dir, "a", {"train.steps=1"}), {});
  ASSERT_FALSE(first.saves.empty());
  const auto config = tiny_config(dir, "b",
                                  {"train.steps=2", "model.assistant_lora_path=" + first.saves.back().string(),
                                   "sample={prompts: [a red circle], sample_every: 2, sample_steps: 2, "
                                   "width: 64, height: 64}"});
  EXPECT_EQ(plan_run(config).assistant_adapter, first.saves.back());
  const auto second = train(config, {});
  EXPECT_EQ(second.end_step, 2);
  EXPECT_FALSE(second.samples.empty());
  fs::remove_all(dir);
}

// A bf16 run's step is walked phase by phase (issue 47 item 3): the data phase (its frames copied in the
// autoencoder's dtype and encoded: Session::walk_inputs), the text phase (TextEmbeddingCache::collate walked
// with the embeddings in the encoders' dtype, bf16 here — the estimate counted float32 before 2026-12-05),
// the forward and backward (the micro-batch's embeddings in that dtype too). With the captions cached the
// step's phases are what the run measures to the byte; with the encoders resident every phase but the text
// phase (the encoders' own prediction, text/memory.h, within a kilobyte) is.
TEST(Trainer, ABf16RunsStepPhasesAreWhatTheWalkPredicts) {
  const fs::path dir = testing::fresh_dir("bf16_phases");
  for (const bool cached : {true, false}) {
    SCOPED_TRACE(cached ? "cached captions" : "encoders resident");
    const std::string name = cached ? "c" : "r";
    const auto config = tiny_config(
        dir, name,
        {"train.dtype=bf16", "train.steps=2", "train.gradient_checkpointing=false",
         "train.cache_text_embeddings=" + std::string(cached ? "true" : "false"), "datasets.0.caption_dropout_rate=0"});
    const auto run = train(config, {});
    ASSERT_EQ(run.end_step, 2);
    std::ifstream in(dir / name / "memory.json");
    const auto memory = nlohmann::json::parse(in);
    // Exact on the ISAs the CPU's bf16 rules were measured exact on; elsewhere (AMX, AVX-512 without BF16)
    // held to the bounds measured there (memory/cpu_isa.h).
    const std::map<std::string, memory::CpuRule> rules = {{"data", memory::CpuRule::autoencoder},
                                                          {"text", memory::CpuRule::text_encode},
                                                          {"forward", memory::CpuRule::forward},
                                                          {"backward", memory::CpuRule::backward}};
    for (const auto& [phase, rule] : rules) {
      const int64_t m = memory["phase_peak_bytes"][phase].get<int64_t>();
      const int64_t q = memory["predicted_phase_peak_bytes"][phase].get<int64_t>();
      const memory::CpuRuleBound bound = memory::cpu_bf16_bound(rule);
      if (!bound.exact) {
        EXPECT_GE(static_cast<double>(q) / static_cast<double>(m), bound.low) << phase;
        EXPECT_LE(static_cast<double>(q) / static_cast<double>(m), bound.high) << phase;
      } else if (cached || phase != "text") {
        EXPECT_EQ(q, m) << phase;
      } else {
        EXPECT_NEAR(q, m, 2048) << phase;
      }
    }
  }
  fs::remove_all(dir);
}

// Z-Image with an assistant adapter (z_image.py:224-228): qfloat8 becomes float8, in the plan every verb
// reads (estimate, check, the OOM report's re-planning) and in the run. float8's matmul keeps a dequantized
// copy for the backward where qfloat8 keeps none, so the two predict different backwards; the run's measured
// phases stand within 5% of the float8 prediction (the phase sweep's bound).
TEST(Trainer, ZImagesAssistantAdapterRunsAndIsPredictedInFloat8) {
  const fs::path dir = testing::fresh_dir("zimage_float8");
  const std::vector<std::string> zimage = {"model.arch=tiny-zimage", "model.quantize=true", "model.qtype=qfloat8"};
  auto with = [&](std::vector<std::string> extra) {
    extra.insert(extra.end(), zimage.begin(), zimage.end());
    return extra;
  };
  const auto first = train(tiny_config(dir, "a", {"model.arch=tiny-zimage", "train.steps=1"}), {});
  ASSERT_FALSE(first.saves.empty());
  const auto config =
      tiny_config(dir, "b", with({"train.steps=2", "model.assistant_lora_path=" + first.saves.back().string()}));
  EXPECT_EQ(config.model.qtype, config::QType::float8);
  EXPECT_EQ(plan_run(config).config.model.qtype, config::QType::float8);
  const MemoryModel as_float8(config);
  auto kept_qfloat8 = config;  // what a run that ignored AI Toolkit's rule would hold
  kept_qfloat8.model.qtype = config::QType::qfloat8;
  kept_qfloat8.model.assistant_lora_path.reset();
  const MemoryModel as_qfloat8(kept_qfloat8);
  const ckpt::CheckpointPolicy off = ckpt::CheckpointPolicy::off();
  EXPECT_GT(as_float8.step({2, 1, 64, 64}, off).backward_bytes, as_qfloat8.step({2, 1, 64, 64}, off).backward_bytes);
  const auto run = train(config, {});
  EXPECT_EQ(run.end_step, 2);
  std::ifstream in(dir / "b" / "memory.json");
  const auto memory = nlohmann::json::parse(in);
  for (const char* phase : {"forward", "backward", "optimizer"}) {
    const double m = memory["phase_peak_bytes"][phase].get<double>();
    const double q = memory["predicted_phase_peak_bytes"][phase].get<double>();
    EXPECT_NEAR(q / m, 1.0, 0.05) << phase << ": predicted " << q << ", measured " << m;
  }
  fs::remove_all(dir);
}

// A preview's ctrl_img on an arch whose previews take none (Qwen-Image's generate_single_image raises
// NotImplementedError on one, qwen_image.py:263-266): said, and the preview runs without it.
TEST(Trainer, ACtrlImgWhereTheArchsPreviewsTakeNoneIsSaidAndLeftOut) {
  const fs::path dir = testing::fresh_dir("ctrl_img_plain");
  const RunPlan plan = plan_run(tiny_config(
      dir, "c",
      {"model.arch=tiny-qwen-image", "sample={samples: [{prompt: a red circle, ctrl_img: " + (dir / "c.png").string() +
                                         "}], sample_every: 2, sample_steps: 2, width: 64, height: 64}"}));
  ASSERT_EQ(plan.preview_controls.size(), 1u);
  EXPECT_TRUE(plan.preview_controls[0].empty());
  EXPECT_TRUE(std::any_of(plan.warnings.begin(), plan.warnings.end(),
                          [](const std::string& w) { return w.find("do not read one") != std::string::npos; }));
  fs::remove_all(dir);
}

// is_reg datasets (BaseSDTrainProcess.py:173-176, 2550-2568; SDTrainer.py:1455-1459): their own loader,
// whose batches train the even steps (0-based) that neither save nor sample, the loss times reg_weight.
// With reg_weight 0 those steps' losses are exactly 0, the others' not.
TEST(Trainer, RegularizationDatasetsTrainEveryOtherStepAtRegWeight) {
  const fs::path dir = testing::fresh_dir("is_reg");
  data::SynthOptions o;
  o.count = 4;
  o.sizes = {{64, 64}};
  data::write_synthetic_dataset(dir / "reg", o);
  const auto config = tiny_config(
      dir, "r",
      {"train.steps=6", "train.reg_weight=0", "trigger_word=sks",
       "datasets=[{folder_path: " + (dir / "data").string() +
           ", resolution: [64]}, {folder_path: " + (dir / "reg").string() + ", resolution: [64], is_reg: true}]"});
  ASSERT_EQ(config.datasets.size(), 2u);
  const auto summary = train(config, {});
  ASSERT_EQ(summary.losses.size(), 6u);
  for (size_t step = 0; step < 6; ++step) {
    const bool reg = step % 2 == 0 && step != 0;  // step 0 saves (save_every divides it): never a reg step
    if (reg) {
      EXPECT_EQ(summary.losses[step], 0.0) << "step " << step;
    } else {
      EXPECT_GT(summary.losses[step], 0.0) << "step " << step;
    }
  }
  fs::remove_all(dir);
}

TEST(Trainer, LoraFilesAreNamedAndDescribedAsAiToolkitWritesThem) {
  const fs::path dir = testing::fresh_dir("lora_file_names");
  for (const auto& [arch, prefix, version] :
       std::vector<std::array<std::string, 3>>{{"tiny-zimage", "diffusion_model.", "zimage"},
                                               {"tiny-qwen-image", "diffusion_model.", "qwen_image"},
                                               {"tiny-flux", "transformer.", "flux.1"},
                                               {"tiny-wan21", "diffusion_model.blocks.", "wan_2.1"},
                                               {"tiny-chroma", "diffusion_model.", "chroma"}}) {
    const auto config = tiny_config(dir, arch, {"model.arch=" + arch, "train.steps=1", "trigger_word=sks"});
    const auto summary = train(config, {});
    ASSERT_FALSE(summary.saves.empty()) << arch;
    const auto file = io::SafetensorsFile::open(summary.saves.back());
    ASSERT_FALSE(file.entries().empty());
    for (const auto& e : file.entries()) EXPECT_EQ(e.name.rfind(prefix, 0), 0u) << arch << " " << e.name;
    if (arch == "tiny-wan21") {  // Wan's original names (wan_lora_convert.py's convert_to_original)
      for (const char* key :
           {"diffusion_model.blocks.0.self_attn.q.lora_A.weight", "diffusion_model.blocks.0.self_attn.o.lora_B.weight",
            "diffusion_model.blocks.1.cross_attn.k.lora_A.weight", "diffusion_model.blocks.1.ffn.0.lora_A.weight",
            "diffusion_model.blocks.1.ffn.2.lora_B.weight"})
        EXPECT_TRUE(file.contains(key)) << key;
      for (const auto& e : file.entries())
        EXPECT_TRUE(e.name.find("attn1") == std::string::npos && e.name.find("to_") == std::string::npos &&
                    e.name.find("ffn.net") == std::string::npos)
            << e.name;
    }
    const auto meta = file.metadata();
    EXPECT_EQ(meta.at("ss_base_model_version"), version) << arch;
    EXPECT_EQ(meta.at("ss_output_name"), arch);
    // As Python's json.dumps writes them (the ss_ keys are part of the sshs hashes' input).
    EXPECT_EQ(meta.at("training_info"), R"({"step": 1, "epoch": 0})");
    EXPECT_EQ(meta.at("ss_tag_frequency"), R"({"1_sks": {"sks": 1}})");
    EXPECT_EQ(nlohmann::json::parse(meta.at("software")).at("name"), "gclab");
    // Back into a model with fresh adapters: the same adapters, from the renamed keys.
    Session session(config, SessionOptions{});
    model::load_lora(session.model(), summary.saves.back());
    for (const auto& [name, t] : model::lora_state(session.model(), torch::kFloat))
      EXPECT_TRUE(torch::equal(t, file.tensor(name))) << name;
  }
  // The config's meta block under them, "[name]" already the job's name (the loader substitutes it), values
  // that are not text as JSON; training_info's epoch counts the epochs begun after the first, as AI
  // Toolkit's epoch_num: six images in batches of two make at most three batches an epoch, so seven steps
  // are in the third epoch or later.
  auto config = tiny_config(dir, "meta", {"train.steps=7"});
  config.meta_yaml = "name: meta\nversion: '1.0'\ntags: [a, 2]\n";
  const auto summary = train(config, {});
  ASSERT_FALSE(summary.saves.empty());
  const auto meta = io::SafetensorsFile::open(summary.saves.back()).metadata();
  EXPECT_EQ(meta.at("name"), "meta");
  EXPECT_EQ(meta.at("version"), "1.0");
  EXPECT_EQ(meta.at("tags"), R"(["a", 2])");
  const auto info = nlohmann::json::parse(meta.at("training_info"));
  EXPECT_EQ(info.at("step"), 7);
  EXPECT_GE(info.at("epoch").get<int>(), 2);
  fs::remove_all(dir);
}

// AI Toolkit fills its caches before training in the datasets' setup_epoch (toolkit/data_loader.py:609-614):
// the latents first, then the captions, each under the device state set_device_state_preset gives it
// (toolkit/models/base_model.py:1554-1615, toolkit/dataloader_mixins.py:1963-1976, 2311-2315): the
// transformer off the device. gclab's `cache` phase: its measured peak well below the transformer's weights,
// the memory model's prediction of it within 1%, the latent files written before the text embeddings', and
// everything back on the device for the steps.
TEST(Trainer, FillsTheCachesLatentsFirstWithTheTransformerOffTheDevice) {
  const fs::path dir = testing::fresh_dir("cache_fill");
  const auto config = tiny_config(
      dir, "c", {"train.steps=2", "datasets.0.cache_latents_to_disk=true", "train.cache_text_embeddings=true"});
  const auto summary = train(config, {});
  EXPECT_EQ(summary.end_step, 2);
  std::ifstream in(dir / "c" / "memory.json");
  const auto memory = nlohmann::json::parse(in);
  const auto& measured = memory["phase_peak_bytes"];
  const auto& predicted = memory["predicted_phase_peak_bytes"];
  ASSERT_TRUE(measured.contains("cache")) << measured.dump();
  ASSERT_TRUE(predicted.contains("cache")) << predicted.dump();
  const double m = measured["cache"].get<double>(), q = predicted["cache"].get<double>();
  EXPECT_NEAR(q / m, 1.0, 0.01) << "predicted " << q << ", measured " << m;
  const auto weights = memory["weights_bytes"].get<int64_t>();  // the transformer and its LoRA, back for the steps
  EXPECT_LT(m, 0.5 * static_cast<double>(weights)) << "the transformer stayed on the device while caching";
  EXPECT_GT(measured["forward"].get<int64_t>(), weights);
  // `gclab check` and `estimate` print the same phase (the estimate with a 77-token caption's encode).
  const MemoryModel model(config);
  ASSERT_TRUE(model.estimate().cache);
  EXPECT_EQ(bench::phases_report(model, config).value["phases"]["predicted"]["cache"].get<int64_t>(),
            model.estimate().cache->total_bytes);
  EXPECT_EQ(bench::estimate_report(model.estimate()).value["estimate"]["cache"]["latents"].get<int64_t>(),
            model.estimate().cache->latents_bytes);
  // Latents first: every latent file is older than every text embedding file.
  fs::file_time_type newest_latent = fs::file_time_type::min(), oldest_text = fs::file_time_type::max();
  int latents = 0, texts = 0;
  for (const auto& e : fs::recursive_directory_iterator(dir / "data")) {
    const std::string folder = e.path().parent_path().filename().string();
    if (folder == "_latent_cache") newest_latent = std::max(newest_latent, fs::last_write_time(e.path())), ++latents;
    if (folder == "_t_e_cache") oldest_text = std::min(oldest_text, fs::last_write_time(e.path())), ++texts;
  }
  ASSERT_GT(latents, 0);
  ASSERT_GT(texts, 0);
  EXPECT_LT(newest_latent, oldest_text);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace gclab::train
