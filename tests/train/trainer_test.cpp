// The training run, end to end on a tiny model: checkpointing does not change the math, accumulation is
// a bigger batch, resuming is the same as never stopping, and what a run writes can be read back.
#include "gclab/train/trainer.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <fstream>
#include <map>

#include "gclab/config/loader.h"
#include "gclab/data/dataset.h"
#include "gclab/data/image.h"
#include "gclab/data/synth.h"
#include "gclab/io/safetensors.h"
#include "gclab/model/lora.h"
#include "gclab/train/flow.h"
#include "../support/test_util.h"

namespace fs = std::filesystem;

namespace gclab::train {
namespace {

// A tiny LoRA run on synthetic 64x64 images; `extra` overrides by path.
config::ProcessConfig tiny_config(const fs::path& dir, const std::string& name, std::vector<std::string> extra = {}) {
  if (!fs::exists(dir / "data")) {
    data::SynthOptions o;
    o.count = 6;
    o.sizes = {{64, 64}, {96, 64}};
    data::write_synthetic_dataset(dir / "data", o);
  }
  const std::string yaml = "name: " + name + "\ntraining_folder: " + dir.string() +
                           "\ndevice: cpu\ntraining_seed: 7\n"
                           "network: {type: lora, linear: 4, linear_alpha: 4}\n"
                           "save: {dtype: float32, save_every: 1000, max_step_saves_to_keep: 3}\n"
                           "datasets:\n  - folder_path: " + (dir / "data").string() +
                           "\n    caption_dropout_rate: 0.2\n    resolution: [64]\n"
                           "train: {batch_size: 2, steps: 20, lr: 1e-3, optimizer: adamw, dtype: fp32, "
                           "gradient_checkpointing: true, skip_first_sample: true}\n"
                           "model: {arch: tiny-flux}\n";
  config::LoadOptions options;
  options.overrides = std::move(extra);
  auto r = config::load_config_text(yaml, "test.yaml", options);
  if (!r.ok()) throw std::runtime_error("test config refused: " + r.diagnostics.all().front().format());
  return *r.config;
}

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
  const auto in = m->example_inputs(4, 64, 64);
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
    EXPECT_TRUE(torch::allclose(g_big[i], g_acc[i], 1e-4, 1e-6)) << i << ": " << (g_big[i] - g_acc[i]).abs().max().item<double>();
}

TEST(Trainer, EndToEndWritesMetricsASamplePngAndALoraThatLoadsBack) {
  const fs::path dir = testing::fresh_dir("train_e2e");
  auto config = tiny_config(dir, "e2e", {"train.steps=6", "sample.sample_every=6", "sample.width=64",
                                         "sample.height=64", "sample.sample_steps=2",
                                         "sample.prompts=[\"a red circle\"]", "train.gradient_accumulation=2"});
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
  for (const auto& e : fs::directory_iterator(dir / "data" / "_latent_cache")) written[e.path().string()] = e.last_write_time();
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
  EXPECT_THROW(train(tiny_config(dir, "c", {"datasets.0.folder_path=" + (dir / "missing").string()}), {}), data::DataError);
  fs::create_directories(dir / "empty");
  EXPECT_THROW(train(tiny_config(dir, "d", {"datasets.0.folder_path=" + (dir / "empty").string()}), {}), data::DataError);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace gclab::train
