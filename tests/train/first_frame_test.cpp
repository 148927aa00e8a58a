// Wan 2.1 I2V (issue 48): the first-frame conditioning against diffusers' pipeline and AI Toolkit's training
// preprocessing on the same tiny weights (the fixture of tests/reference/diffusers_wan_i2v_condition.py), and
// tiny-wan21-i2v end to end — checkpointing on and off to the same losses, previews from a ctrl_img, the
// configurations AI Toolkit fails on refused before anything loads.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>

#include "../support/test_util.h"
#include "gclab/config/user_error.h"
#include "gclab/data/synth.h"
#include "gclab/io/safetensors.h"
#include "gclab/model/registry.h"
#include "gclab/train/trainer.h"
#include "gclab/vae/codec.h"

namespace gclab::train {
namespace {
namespace fs = std::filesystem;

double relative(const torch::Tensor& a, const torch::Tensor& b) {
  EXPECT_EQ(a.sizes(), b.sizes());
  if (a.sizes() != b.sizes()) return 1;
  return ((a.to(torch::kFloat) - b).abs().max() / b.abs().max()).item<double>();
}

TEST(FirstFrame, MatchesDiffusersPipelineAndAiToolkitsTrainingInputs) {
  const char* dir = std::getenv("GCLAB_WAN_I2V_FIXTURE");
  if (!dir) GTEST_SKIP() << "run by ctest interop.diffusers_wan21_i2v_condition";
  const fs::path fixture(dir);
  const model::ModelSpec spec = model::spec_by_preset("tiny-wan21-i2v");
  const model::ModelFamily& family = model::family_of(spec.family);
  model::FrameConditioningSource source;
  source.image_encoder = fixture / "image_encoder", source.image_processor = fixture / "image_processor";
  const auto conditioning = family.frame_conditioning(spec, source);
  ASSERT_TRUE(conditioning);
  EXPECT_NE(conditioning->describe().find("weights loaded"), std::string::npos) << conditioning->describe();
  vae::CodecSpec cs;
  cs.latent_channels = spec.latent_channels, cs.video = true, cs.weights = fixture / "vae";
  cs.autoencoder = vae::autoencoder_config(family.autoencoder(spec), cs.weights);
  const auto codec = vae::build_codec(cs, torch::kCPU, 1);
  const auto mean = [&](const torch::Tensor& video) { return codec->encode_mean(video); };
  const auto io = io::SafetensorsFile::open(fixture / "io.safetensors");
  const std::vector<int64_t> latents = {1, 16, 3, 4, 6};  // 9 frames of 32 x 48

  // The preview: WanImageToVideoPipeline's encode_image and prepare_latents.
  model::ModelInputs preview;
  conditioning->preview_condition(preview, fixture / "control.png", latents, mean, mean);
  EXPECT_LT(relative(preview.image_embeds, io.tensor("preview_image_embeds")), 1e-5);
  EXPECT_LT(relative(preview.condition_channels, io.tensor("condition")), 1e-5);
  // The mask: 1 on the first latent frame's four slots, 0 after.
  const torch::Tensor mask = preview.condition_channels.narrow(1, 0, 4);
  EXPECT_TRUE(torch::equal(mask.select(2, 0), torch::ones_like(mask.select(2, 0))));
  EXPECT_EQ(mask.narrow(2, 1, 2).abs().sum().item<double>(), 0.0);

  // A training step: AI Toolkit's preprocess_clip_image for the tokens; the same channels (with the
  // posterior's mean here, as the pipeline takes it; AI Toolkit's training samples it).
  model::ModelInputs step;
  conditioning->condition(step, {io.tensor("frame"), {}}, torch::zeros(latents), mean);
  EXPECT_LT(relative(step.image_embeds, io.tensor("train_image_embeds")), 1e-5);
  EXPECT_LT(relative(step.condition_channels, io.tensor("condition")), 1e-5);
}

config::ProcessConfig i2v_config(const fs::path& dir, const std::string& name, std::vector<std::string> extra = {}) {
  if (!fs::exists(dir / "clips")) {
    data::SynthOptions o;
    o.count = 2, o.frames = 5, o.sizes = {{64, 48}};
    data::write_synthetic_dataset(dir / "clips", o);
    o.count = 1, o.frames = 1;
    data::write_synthetic_dataset(dir / "first", o);
  }
  const std::string yaml =
      "name: " + name + "\ntraining_folder: " + dir.string() +
      "\ndevice: cpu\ntraining_seed: 4\n"
      "network: {type: lora, linear: 4, linear_alpha: 4}\n"
      "save: {dtype: float32, save_every: 100}\n"
      "datasets:\n  - folder_path: " +
      (dir / "clips").string() +
      "\n    resolution: [64]\n    num_frames: 5\n"
      "train: {batch_size: 2, steps: 2, lr: 1e-3, optimizer: adamw, dtype: fp32, gradient_checkpointing: true, "
      "skip_first_sample: true}\n"
      "sample: {sample_every: 2, width: 64, height: 48, sample_steps: 2, guidance_scale: 3, num_frames: 5, fps: 8, "
      "prompts: ['a red circle moving right --ctrl_img " +
      (dir / "first" / "synth_0000.png").string() +
      "'], format: png}\n"
      "model: {arch: tiny-wan21-i2v}\n";
  config::LoadOptions options;
  options.overrides = std::move(extra);
  auto r = model::load_config_text(yaml, "wan_i2v.yaml", options);
  if (!r.ok()) throw std::runtime_error("config refused: " + r.diagnostics.all().front().format());
  return *r.config;
}

TEST(FirstFrame, Wan21I2vTrainsOnItsFirstFramesAndPreviewsFromTheControlImage) {
  const fs::path dir = testing::fresh_dir("wan_i2v_run");
  const TrainSummary on = train(i2v_config(dir, "on"), {});
  const TrainSummary off = train(i2v_config(dir, "off", {"train.gradient_checkpointing=false"}), {});
  ASSERT_EQ(on.losses.size(), 2u);
  ASSERT_EQ(off.losses.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_TRUE(std::isfinite(on.losses[i]));
    EXPECT_EQ(on.losses[i], off.losses[i]) << "step " << i + 1;
  }
  ASSERT_EQ(on.samples.size(), 3u);  // the first frame, the animated WebP, the MP4
  EXPECT_EQ(on.samples[0].extension(), ".png");
  fs::remove_all(dir);
}

// Wan 2.2 TI2V 5B with do_i2v (AI Toolkit's UI default for it): each clip's first frame given clean, the
// previews with and without a ctrl_img; checkpointing on and off to the same losses; without do_i2v another
// objective (another loss on the same data and seed).
TEST(FirstFrame, Wan22Ti2vTrainsOnItsFirstFramesWithDoI2v) {
  const fs::path dir = testing::fresh_dir("wan22_5b_run");
  const std::vector<std::string> ti2v = {
      "model.arch=tiny-wan22-5b", "datasets[0].do_i2v=true",
      "sample.prompts=[a red circle, 'a blue square --ctrl_img " + (dir / "first" / "synth_0000.png").string() + "']"};
  auto with = [&](std::vector<std::string> extra) {
    extra.insert(extra.begin(), ti2v.begin(), ti2v.end());
    return extra;
  };
  const TrainSummary on = train(i2v_config(dir, "on", with({})), {});
  const TrainSummary off = train(i2v_config(dir, "off", with({"train.gradient_checkpointing=false"})), {});
  const TrainSummary t2v = train(i2v_config(dir, "t2v", with({"datasets[0].do_i2v=false"})), {});
  ASSERT_EQ(on.losses.size(), 2u);
  ASSERT_EQ(off.losses.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_TRUE(std::isfinite(on.losses[i]));
    EXPECT_EQ(on.losses[i], off.losses[i]) << "step " << i + 1;
  }
  EXPECT_NE(on.losses[0], t2v.losses[0]);
  EXPECT_EQ(on.samples.size(), 6u);  // two prompts: the first frame, the animated WebP, the MP4 each
  fs::remove_all(dir);
}

// Wan 2.2 TI2V 5B with do_i2v and cache_latents_to_disk: each clip's cache file keeps its first frame's latents
// beside its own (first_frame_latent, [48, 1, h, w]), and the steps condition on those: a cache written
// without them (do_i2v off) gains them, a second run reads them (the same losses), and latents changed in
// the files change the losses.
TEST(FirstFrame, Wan22Ti2vCachesEachClipsFirstFrameLatentsBesideItsOwn) {
  const fs::path dir = testing::fresh_dir("wan22_5b_cached");
  const std::vector<std::string> cached = {"model.arch=tiny-wan22-5b", "datasets[0].cache_latents_to_disk=true",
                                           "sample.prompts=[a red circle]", "sample.sample_every=100"};
  auto with = [&](std::vector<std::string> extra) {
    extra.insert(extra.begin(), cached.begin(), cached.end());
    return extra;
  };
  train(i2v_config(dir, "t2v", with({"datasets[0].do_i2v=false"})), {});
  auto cache_files = [&] {
    std::vector<fs::path> files;
    for (const auto& e : fs::directory_iterator(dir / "clips" / "_latent_cache")) files.push_back(e.path());
    return files;
  };
  ASSERT_EQ(cache_files().size(), 2u);
  for (const auto& f : cache_files()) EXPECT_FALSE(io::SafetensorsFile::open(f).contains("first_frame_latent"));

  const TrainSummary first = train(i2v_config(dir, "first", with({"datasets[0].do_i2v=true"})), {});
  ASSERT_EQ(cache_files().size(), 2u);
  for (const auto& f : cache_files()) {
    const auto file = io::SafetensorsFile::open(f);
    ASSERT_TRUE(file.contains("first_frame_latent")) << f;
    const torch::Tensor latent = file.tensor("latent"), frame = file.tensor("first_frame_latent");
    // 5 frames of 64 x 48 in the 64 x 32 bucket (the 5B's buckets divide by 32), 16x down-sampled.
    EXPECT_EQ(latent.sizes(), (std::vector<int64_t>{48, 2, 2, 4}));
    EXPECT_EQ(frame.sizes(), (std::vector<int64_t>{48, 1, 2, 4}));
    EXPECT_FALSE(torch::equal(frame, latent.narrow(1, 0, 1)));  // a posterior sample of its own
  }
  const TrainSummary again = train(i2v_config(dir, "again", with({"datasets[0].do_i2v=true"})), {});
  const TrainSummary off =
      train(i2v_config(dir, "off", with({"datasets[0].do_i2v=true", "train.gradient_checkpointing=false"})), {});
  ASSERT_EQ(first.losses.size(), 2u);
  ASSERT_EQ(again.losses.size(), 2u);
  ASSERT_EQ(off.losses.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_TRUE(std::isfinite(first.losses[i]));
    EXPECT_EQ(again.losses[i], first.losses[i]) << "step " << i + 1;
    EXPECT_EQ(off.losses[i], first.losses[i]) << "step " << i + 1;
  }
  // The first frames' latents the steps read are the files': zeroed there, another loss.
  for (const auto& f : cache_files()) {
    const auto file = io::SafetensorsFile::open(f);
    const torch::Tensor latent = file.tensor("latent").clone();
    const torch::Tensor zeros = torch::zeros_like(file.tensor("first_frame_latent"));
    io::save_safetensors(f, {{"latent", latent}, {"first_frame_latent", zeros}}, file.metadata());
  }
  const TrainSummary zeroed = train(i2v_config(dir, "zeroed", with({"datasets[0].do_i2v=true"})), {});
  ASSERT_EQ(zeroed.losses.size(), 2u);
  EXPECT_NE(zeroed.losses[0], first.losses[0]);
  fs::remove_all(dir);
}

// Wan 2.2 TI2V's conditioning (Wan225bModel.get_noise_prediction): a batch of clips is conditioned, one of a
// single latent frame whole (AI Toolkit's 5-D batch); a batch of images gets the per-token timesteps only (its
// 4-D batch); cached first-frame latents are taken as they are, without an encode.
TEST(FirstFrame, Wan22Ti2vConditionsClipsOfOneLatentFrameButNotImages) {
  const model::ModelSpec spec = model::spec_by_preset("tiny-wan22-5b");
  const auto conditioning = model::family_of(spec.family).frame_conditioning(spec, {});
  ASSERT_TRUE(conditioning);
  const torch::Tensor x0 = torch::zeros({2, 48, 1, 2, 4}), pixels = torch::zeros({2, 3, 32, 64});
  int encodes = 0;
  const auto encode = [&](const torch::Tensor& video) {
    ++encodes;
    return torch::ones({video.size(0), 48, 1, 2, 4});
  };
  model::ModelInputs image;
  conditioning->condition(image, {pixels, {}, /*clips=*/false}, x0, encode);
  EXPECT_TRUE(image.per_token_timesteps);
  EXPECT_FALSE(image.clean_latent_frames.defined());
  model::ModelInputs clip;
  conditioning->condition(clip, {pixels, {}, /*clips=*/true}, x0, encode);
  ASSERT_TRUE(clip.clean_latent_frames.defined());
  EXPECT_EQ(clip.clean_latent_frames.size(2), 1);
  EXPECT_EQ(encodes, 1);
  model::ModelInputs cached;
  const torch::Tensor z = torch::randn({2, 48, 1, 2, 4});
  conditioning->condition(cached, {{}, z, /*clips=*/true}, x0, encode);
  EXPECT_TRUE(torch::equal(cached.clean_latent_frames, z));
  EXPECT_EQ(encodes, 1);
}

TEST(FirstFrame, WhatAiToolkitFailsOnIsRefusedBeforeLoading) {
  const fs::path dir = testing::fresh_dir("wan_i2v_refusals");
  // Cached latents: no pixels in the step (AI Toolkit fails at step 1 on batch.tensor None).
  try {
    train(i2v_config(dir, "cached", {"datasets[0].cache_latents_to_disk=true"}), {});
    ADD_FAILURE() << "cached latents were accepted";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("cache_latents_to_disk: false"), std::string::npos) << e.what();
  }
  // A preview without a ctrl_img (AI Toolkit: "I2V samples must have a control image" at the first preview).
  try {
    train(i2v_config(dir, "no_ctrl", {"sample.prompts=[a red circle]"}), {});
    ADD_FAILURE() << "a preview without ctrl_img was accepted";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("has no ctrl_img"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(fs::exists(dir / "cached" / "cached.safetensors"));
  fs::remove_all(dir);
}

}  // namespace
}  // namespace gclab::train
