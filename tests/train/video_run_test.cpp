// Wan on video files end to end (issue 48 item 5): MP4 clips written by `gclab synth --video`'s code, decoded
// by FFmpeg, trained by tiny-wan21 with checkpointing on and off to the same losses, previewed as frames (the
// first as the sample format, all of them as animated WebP and MP4 at the sample's fps), and resumed to the
// same losses and weights as a run straight through.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <tuple>

#include <nlohmann/json.hpp>

#include "../support/test_util.h"
#include "gclab/config/loader.h"
#include "gclab/data/synth.h"
#include "gclab/data/video.h"
#include "gclab/io/safetensors.h"
#include "gclab/train/plan.h"
#include "gclab/train/trainer.h"

namespace gclab::train {
namespace {
namespace fs = std::filesystem;

config::ProcessConfig wan_config(const fs::path& dir, const std::string& name, std::vector<std::string> extra = {}) {
  if (!fs::exists(dir / "clips")) {
    data::SynthOptions o;
    o.count = 3, o.frames = 13, o.sizes = {{64, 48}}, o.video_format = "mp4", o.fps = 16;
    data::write_synthetic_dataset(dir / "clips", o);
  }
  const std::string yaml =
      "name: " + name + "\ntraining_folder: " + dir.string() +
      "\ndevice: cpu\ntraining_seed: 4\n"
      "network: {type: lora, linear: 4, linear_alpha: 4}\n"
      "save: {dtype: float32, save_every: 2}\n"
      "datasets:\n  - folder_path: " +
      (dir / "clips").string() +
      "\n    resolution: [64]\n    num_frames: 5\n"
      "train: {batch_size: 2, steps: 4, lr: 1e-3, optimizer: adamw, dtype: fp32, gradient_checkpointing: true, "
      "skip_first_sample: true}\n"
      "sample: {sample_every: 4, width: 64, height: 48, sample_steps: 2, guidance_scale: 3, num_frames: 5, fps: 8, "
      "prompts: [a red circle moving right], format: png}\n"
      "model: {arch: tiny-wan21}\n";
  config::LoadOptions options;
  options.overrides = std::move(extra);
  auto r = model::load_config_text(yaml, "wan.yaml", options);
  if (!r.ok()) throw std::runtime_error("config refused: " + r.diagnostics.all().front().format());
  return *r.config;
}

TEST(VideoRun, WanTrainsOnMp4ClipsPreviewsFramesAndResumes) {
  const fs::path dir = testing::fresh_dir("wan_video_run");
  const TrainSummary on = train(wan_config(dir, "on"), {});
  const TrainSummary off = train(wan_config(dir, "off", {"train.gradient_checkpointing=false"}), {});
  ASSERT_EQ(on.losses.size(), 4u);
  ASSERT_EQ(off.losses.size(), 4u);
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_TRUE(std::isfinite(on.losses[i]));
    EXPECT_EQ(on.losses[i], off.losses[i]) << "step " << i + 1;
  }
  EXPECT_TRUE(on.unusable_images.empty());
  // The preview at step 4: the first frame, then the frames as animated WebP and as MP4 at 8 fps.
  ASSERT_EQ(on.samples.size(), 3u);
  EXPECT_EQ(on.samples[0].extension(), ".png");
  EXPECT_EQ(on.samples[2].filename().string(), on.samples[0].stem().string() + "_frames.mp4");
  std::string why;
  const auto mp4 = data::probe_video(on.samples[2], &why);
  ASSERT_TRUE(mp4) << why;
  EXPECT_EQ(mp4->frames, 5);
  EXPECT_EQ(mp4->width, 64);
  EXPECT_EQ(mp4->height, 48);
  EXPECT_DOUBLE_EQ(mp4->fps, 8.0);
  // Stopped at step 2 (a save) and resumed: the same losses and LoRA as straight through.
  train(wan_config(dir, "split", {"train.steps=2"}), {});
  TrainOptions resume;
  resume.resume = true;
  const TrainSummary second = train(wan_config(dir, "split", {"train.disable_sampling=true"}), resume);
  EXPECT_EQ(second.start_step, 2);
  ASSERT_EQ(second.losses.size(), 2u);
  for (size_t i = 0; i < 2; ++i) EXPECT_EQ(second.losses[i], on.losses[2 + i]) << "step " << 3 + i;
  const auto a = io::SafetensorsFile::open(dir / "on" / "on.safetensors");
  const auto b = io::SafetensorsFile::open(dir / "split" / "split.safetensors");
  ASSERT_EQ(a.entries().size(), b.entries().size());
  for (const auto& e : a.entries()) EXPECT_TRUE(torch::equal(a.tensor(e.name), b.tensor(e.name))) << e.name;
  fs::remove_all(dir);
}

// auto_frame_count (AI Toolkit's get_auto_frame_count): each MP4 at its own length at the dataset's 16 fps —
// 13 frames at 16 fps train at 13, 12 frames at 24 fps (0.5 s, 8 frames at 16) at 5 — each its own bucket;
// every step's phases predicted from its own bucket, and the run's prediction (the longest clip's) confirmed.
TEST(VideoRun, AutoFrameCountTrainsEachMp4AtItsOwnLength) {
  const fs::path dir = testing::fresh_dir("wan_auto_frames");
  for (const auto& [folder, frames, fps] : {std::tuple{"a", 13, 16}, std::tuple{"b", 12, 24}}) {
    data::SynthOptions o;
    o.count = 1, o.frames = frames, o.sizes = {{64, 48}}, o.video_format = "mp4", o.fps = fps;
    data::write_synthetic_dataset(dir / "clips" / folder, o);
  }
  const config::ProcessConfig config =
      wan_config(dir, "auto",
                 {"datasets[0].auto_frame_count=true", "datasets[0].fps=16", "train.batch_size=1", "train.steps=2",
                  "train.disable_sampling=true"});
  EXPECT_EQ(plan_run(config, PlanOptions{/*meta=*/true}).largest.frames, 13);  // the longest clip's step
  const TrainSummary run = train(config, {});
  ASSERT_EQ(run.losses.size(), 2u);
  std::ifstream in(dir / "auto" / "metrics.jsonl");
  std::set<std::string> buckets;
  for (std::string line; std::getline(in, line);) {
    const auto m = nlohmann::json::parse(line);
    if (!m.contains("loss")) continue;
    EXPECT_TRUE(std::isfinite(m["loss"].get<double>()));
    buckets.insert(m["bucket"].get<std::string>());
    for (const char* phase : {"forward", "backward"}) {  // each step predicted at its own frames
      const double measured = m["phases"][phase].get<double>(), predicted = m["predicted_phases"][phase].get<double>();
      EXPECT_NEAR(predicted / measured, 1.0, 0.05) << m["bucket"] << " " << phase;
    }
  }
  EXPECT_EQ(buckets, (std::set<std::string>{"64x48x13f", "64x48x5f"}));
  fs::remove_all(dir);
}

}  // namespace
}  // namespace gclab::train
