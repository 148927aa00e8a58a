// Wan 2.2 A14B's two experts trained end to end as AI Toolkit trains them (issue 48): the stages switching
// every switch_boundary_every micro-batches, each micro-batch's timesteps within its expert's range, one LoRA
// file per expert (<name>_high_noise / _low_noise.safetensors, the expert's prefix cut from the keys), only
// the experts model_kwargs trains adapted, checkpointing on = off, and a resumed run equal to one straight
// through (the stage and each adapter's own optimizer step count carried in the state file).
#include <gtest/gtest.h>

#include <filesystem>

#include "../support/test_util.h"
#include "gclab/config/loader.h"
#include "gclab/config/user_error.h"
#include "gclab/data/synth.h"
#include "gclab/io/safetensors.h"
#include "gclab/train/plan.h"
#include "gclab/train/trainer.h"

namespace gclab::train {
namespace {
namespace fs = std::filesystem;

config::ProcessConfig experts_config(const fs::path& dir, const std::string& name,
                                     std::vector<std::string> extra = {}) {
  if (!fs::exists(dir / "clips")) {
    data::SynthOptions o;
    o.count = 3, o.frames = 5, o.sizes = {{64, 48}}, o.video_format = "mp4", o.fps = 16;
    data::write_synthetic_dataset(dir / "clips", o);
  }
  const std::string yaml = "name: " + name + "\ntraining_folder: " + dir.string() +
                           "\ndevice: cpu\ntraining_seed: 5\n"
                           "network: {type: lora, linear: 4}\n"
                           "save: {dtype: float32, save_every: 2, max_step_saves_to_keep: 1}\n"
                           "datasets:\n  - folder_path: " +
                           (dir / "clips").string() +
                           "\n    resolution: [64]\n    num_frames: 5\n"
                           "train: {batch_size: 1, steps: 4, lr: 1e-3, optimizer: adamw, dtype: fp32, "
                           "switch_boundary_every: 2, disable_sampling: true}\n"
                           "model: {arch: tiny-wan22-14b}\n";
  config::LoadOptions options;
  options.overrides = std::move(extra);
  auto r = model::load_config_text(yaml, "experts.yaml", options);
  if (!r.ok()) throw std::runtime_error("config refused: " + r.diagnostics.all().front().format());
  return *r.config;
}

// Whether every lora_B of a file is zero (an expert whose adapters never trained: lora_B starts at 0).
bool untrained(const fs::path& file) {
  const auto f = io::SafetensorsFile::open(file);
  for (const auto& e : f.entries())
    if (e.name.find("lora_B") != std::string::npos && f.tensor(e.name).abs().max().item<double>() > 0) return false;
  return true;
}

TEST(ExpertsRun, Wan22A14bTrainsOneExpertAtATimeAndSavesAFileEach) {
  const fs::path dir = testing::fresh_dir("experts_run");
  const TrainSummary on = train(experts_config(dir, "on"), {});
  ASSERT_EQ(on.losses.size(), 4u);
  // One file per expert, none combined; keys as a single WanTransformer3DModel's in Wan's original names.
  EXPECT_FALSE(fs::exists(dir / "on" / "on.safetensors"));
  const auto high = io::SafetensorsFile::open(dir / "on" / "on_high_noise.safetensors");
  const auto low = io::SafetensorsFile::open(dir / "on" / "on_low_noise.safetensors");
  EXPECT_EQ(high.entries().size(), low.entries().size());
  EXPECT_TRUE(high.contains("diffusion_model.blocks.0.self_attn.q.lora_A.weight"));
  EXPECT_TRUE(low.contains("diffusion_model.blocks.1.ffn.2.lora_B.weight"));
  EXPECT_EQ(high.metadata().at("ss_base_model_version"), "wan_2.2_14b");
  // Steps 1-2 trained the high-noise expert only (switch_boundary_every 2): at the step-2 save the low-noise
  // adapters are as they started. The older save's files went together (max_step_saves_to_keep 1).
  EXPECT_FALSE(fs::exists(dir / "on" / "on_000000002_high_noise.safetensors"));
  EXPECT_FALSE(untrained(dir / "on" / "on_high_noise.safetensors"));
  EXPECT_FALSE(untrained(dir / "on" / "on_low_noise.safetensors"));
  const TrainSummary two = train(experts_config(dir, "two", {"train.steps=2"}), {});
  EXPECT_FALSE(untrained(dir / "two" / "two_high_noise.safetensors"));
  EXPECT_TRUE(untrained(dir / "two" / "two_low_noise.safetensors"));
  // Checkpointing off: the same losses.
  const TrainSummary off = train(experts_config(dir, "off", {"train.gradient_checkpointing=false"}), {});
  for (size_t i = 0; i < 4; ++i) EXPECT_EQ(on.losses[i], off.losses[i]) << "step " << i + 1;
  // Stopped at step 2 and resumed: the same losses and both files as straight through (the low-noise
  // adapters' first AdamW update at step 3 is their first, as torch counts it).
  TrainOptions resume;
  resume.resume = true;
  train(experts_config(dir, "split", {"train.steps=2"}), {});
  const TrainSummary second = train(experts_config(dir, "split"), resume);
  ASSERT_EQ(second.losses.size(), 2u);
  for (size_t i = 0; i < 2; ++i) EXPECT_EQ(second.losses[i], on.losses[2 + i]) << "step " << 3 + i;
  for (const char* part : {"_high_noise", "_low_noise"}) {
    const auto a = io::SafetensorsFile::open(dir / "on" / (std::string("on") + part + ".safetensors"));
    const auto b = io::SafetensorsFile::open(dir / "split" / (std::string("split") + part + ".safetensors"));
    for (const auto& e : a.entries()) EXPECT_TRUE(torch::equal(a.tensor(e.name), b.tensor(e.name))) << part << e.name;
  }
  // A folder AI Toolkit wrote (its LoRA saves, split; no gclab state): resumed from the newest save's files,
  // both experts' adapters as saved, at its step.
  fs::create_directories(dir / "aitk");
  for (const char* part : {"_high_noise", "_low_noise"})
    fs::copy_file(dir / "on" / (std::string("on") + part + ".safetensors"),
                  dir / "aitk" / (std::string("aitk_000000004") + part + ".safetensors"));
  const TrainSummary aitk = train(experts_config(dir, "aitk", {"train.steps=5"}), resume);
  EXPECT_EQ(aitk.start_step, 4);
  ASSERT_EQ(aitk.losses.size(), 1u);
  fs::remove_all(dir);
}

TEST(ExpertsRun, TrainLowNoiseOnlyAdaptsAndSavesTheLowNoiseExpert) {
  const fs::path dir = testing::fresh_dir("experts_low");
  const TrainSummary low = train(experts_config(dir, "low", {"model.model_kwargs.train_high_noise=false"}), {});
  ASSERT_EQ(low.losses.size(), 4u);
  EXPECT_FALSE(fs::exists(dir / "low" / "low_high_noise.safetensors"));
  const auto file = io::SafetensorsFile::open(dir / "low" / "low_low_noise.safetensors");
  EXPECT_TRUE(file.contains("diffusion_model.blocks.0.self_attn.q.lora_A.weight"));
  EXPECT_FALSE(untrained(dir / "low" / "low_low_noise.safetensors"));
  // One file a save: AI Toolkit's doubled max_step_saves_to_keep (1 here) keeps two saves.
  EXPECT_TRUE(fs::exists(dir / "low" / "low_000000002_low_noise.safetensors"));
  // Unsplit, one expert trained: its keys are the expert's own, as AI Toolkit's network on the one
  // WanTransformer3DModel names them.
  train(experts_config(
            dir, "one",
            {"network.split_multistage_loras=false", "model.model_kwargs.train_high_noise=false", "train.steps=1"}),
        {});
  const auto one = io::SafetensorsFile::open(dir / "one" / "one.safetensors");
  EXPECT_TRUE(one.contains("diffusion_model.blocks.0.self_attn.q.lora_A.weight"));
  EXPECT_EQ(one.entries().size(), file.entries().size());
  // network.split_multistage_loras: false — one file, each expert's keys under its own name.
  train(experts_config(dir, "combo", {"network.split_multistage_loras=false", "train.steps=1"}), {});
  const auto combo = io::SafetensorsFile::open(dir / "combo" / "combo.safetensors");
  EXPECT_TRUE(combo.contains("diffusion_model.transformer_1.blocks.0.self_attn.q.lora_A.weight"));
  EXPECT_TRUE(combo.contains("diffusion_model.transformer_2.blocks.0.self_attn.q.lora_A.weight"));
  // A config changed in code past the loader's checks: no expert to train is an error, not a hang.
  config::ProcessConfig none = experts_config(dir, "none");
  none.model.model_kwargs.train_high_noise = none.model.model_kwargs.train_low_noise = false;
  EXPECT_THROW(train(none, {}), UserError);
  // A full fine-tune whose experts would take turns on the device (low_vram): refused when planned.
  config::ProcessConfig full = experts_config(dir, "full", {"model.low_vram=true"});
  full.network.reset();
  EXPECT_THROW(plan_run(full), UserError);
  // Both experts off: AI Toolkit's error, before anything loads.
  auto r = model::load_config_text(
      "model: {arch: tiny-wan22-14b, model_kwargs: {train_high_noise: false, "
      "train_low_noise: false}}\n",
      "none.yaml");
  EXPECT_FALSE(r.ok());
  fs::remove_all(dir);
}

}  // namespace
}  // namespace gclab::train
