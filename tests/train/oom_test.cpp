// The OOM lab's CPU-scale scenarios (configs/oom/): each runs out in its phase under its emulated cap,
// exits through OutOfMemoryStop (exit code 3 in the CLI) with a report naming the phase and the right
// first fix; each fixed twin finishes under the same cap; what is saved on OOM is the last good step.
#include <gtest/gtest.h>

#include <torch/torch.h>
#include <algorithm>

#include <cstdio>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "gclab/config/loader.h"
#include "gclab/data/image.h"
#include "gclab/data/synth.h"
#include "gclab/io/safetensors.h"
#include "gclab/model/activations.h"
#include "gclab/model/family.h"
#include "gclab/train/oom_report.h"
#include "gclab/train/predict.h"
#include "gclab/train/session.h"
#include "gclab/train/state_file.h"
#include "gclab/train/trainer.h"

namespace fs = std::filesystem;

namespace gclab::train {
namespace {

class OomScenario : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = fs::temp_directory_path() / ("gclab_oom_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    data::SynthOptions o;
    o.count = 8;
    o.sizes = {{512, 512}, {640, 512}, {512, 640}};
    data::write_synthetic_dataset(dir_ / "data", o);
    data::SynthOptions clips;  // the frames scenario's: MP4 clips of 33 frames
    clips.count = 4, clips.frames = 33, clips.sizes = {{256, 256}}, clips.video_format = "mp4";
    data::write_synthetic_dataset(dir_ / "clips", clips);
    data::SynthOptions edit;
    edit.count = 4;
    edit.sizes = {{384, 384}};
    data::write_synthetic_dataset(dir_ / "edit_data", edit);
    edit.sizes = {{512, 512}};
    edit.seed = 9;
    data::write_synthetic_dataset(dir_ / "edit_controls", edit);
  }
  static void TearDownTestSuite() { fs::remove_all(dir_); }

  static config::ProcessConfig load(const std::string& scenario, std::vector<std::string> extra = {}) {
    config::LoadOptions o;
    const bool edit = scenario.rfind("edit", 0) == 0, frames = scenario.rfind("frames", 0) == 0;
    o.overrides = {"datasets.0.folder_path=" + (dir_ / (edit     ? "edit_data"
                                                        : frames ? "clips"
                                                                 : "data"))
                                                   .string(),
                   "training_folder=" + (dir_ / "out").string()};
    if (frames)
      o.overrides.push_back("model.name_or_path=" + std::string(GCLAB_SOURCE_DIR) + "/configs/oom/models/wan_wide");
    if (edit) o.overrides.push_back("datasets.0.control_path=[" + (dir_ / "edit_controls").string() + "]");
    o.overrides.insert(o.overrides.end(), extra.begin(), extra.end());
    auto r = model::load_config_file(std::string(GCLAB_SOURCE_DIR) + "/configs/oom/cpu_" + scenario + ".yaml", o);
    if (!r.ok()) throw std::runtime_error("config refused: " + r.diagnostics.all().front().format());
    return *r.config;
  }

  // Runs a scenario that must run out; returns its report.
  static nlohmann::json expect_oom(const std::string& scenario, std::vector<std::string> extra = {}) {
    const auto config = load(scenario, std::move(extra));
    EXPECT_THROW(train(config, {}), OutOfMemoryStop) << scenario;
    std::ifstream in(dir_ / "out" / config.name / "oom_report.json");
    EXPECT_TRUE(in) << "no oom_report.json for " << scenario;
    return nlohmann::json::parse(in, nullptr, false);
  }

  static fs::path dir_;
};
fs::path OomScenario::dir_;

// The report's fix where checkpoint_policy auto fits the cap for fewer recomputed FLOPs than full.
const char* const kAutoFix = "Let gclab choose what to recompute (checkpoint_policy: auto)";

// FLUX.2 klein with a reference image (configs/oom/cpu_edit_klein.yaml): checkpointing off runs out in the first
// forward and the first fix is checkpointing, which finishes under the same cap; without the control images the
// same run fits — the reference's tokens are what pushed it over.
TEST_F(OomScenario, KleinsReferenceImageRunsOutWithCheckpointingOffAndTheFixIsCheckpointing) {
  const auto report = expect_oom("edit_klein");
  EXPECT_EQ(report["step"], 1);
  EXPECT_EQ(report["phase"], "forward");
  EXPECT_EQ(report["checkpoint_policy"], "off");
  // auto fits the cap less its margin for less recompute than full (it leaves the last block's graph, which
  // its backward would make again at once): the first fix, and a run under it trains; so does full.
  EXPECT_EQ(report["fixes"][0]["title"], kAutoFix) << report["fixes"][0].dump();
  EXPECT_NO_THROW(train(load("edit_klein_fixed"), {}));
  EXPECT_NO_THROW(train(load("edit_klein", {"train.checkpoint_policy=auto", "name=edit_klein_auto"}), {}));
  // The controls (512²) are larger than the images (384²): the walk holds the folder's largest, as the run does.
  train(load("edit_klein", {"vram_cap=0", "train.steps=2", "name=edit_klein_uncapped"}), {});
  const auto memory = nlohmann::json::parse(std::ifstream(dir_ / "out" / "edit_klein_uncapped" / "memory.json"));
  for (const char* phase : {"forward", "backward"})
    EXPECT_NEAR(
        memory["predicted_phase_peak_bytes"][phase].get<double>() / memory["phase_peak_bytes"][phase].get<double>(),
        1.0, 0.01)
        << phase;
  EXPECT_NO_THROW(train(load("edit_klein", {"datasets.0.control_path=[]", "name=edit_klein_plain"}), {}));
}

TEST_F(OomScenario, CheckpointingOffRunsOutInTheFirstForwardAndTheFixIsCheckpointing) {
  const auto report = expect_oom("gc_off");
  EXPECT_EQ(report["step"], 1);
  EXPECT_EQ(report["phase"], "forward");
  EXPECT_EQ(report["checkpoint_policy"], "off");
  EXPECT_EQ(report["fixes"][0]["title"], kAutoFix);
  EXPECT_GT(report["fixes"][0]["predicted_saving_bytes"].get<int64_t>(), int64_t{32} << 20);
  EXPECT_NE(report["fixes"][0]["basis"].get<std::string>().find("of full's recompute time saved"), std::string::npos);
  EXPECT_NO_THROW(train(load("gc_off_fixed"), {}));
  EXPECT_NO_THROW(train(load("gc_off", {"train.checkpoint_policy=auto", "name=gc_off_auto"}), {}));
}

// The step's levers are priced by re-planning, and what the memory model predicts they save is what they
// save: the checkpointing-off scenario's report against the same run without the cap, under auto at the cap
// it ran out under (the plan the report offers), and at half the batch with twice the accumulation — each
// one's step peak (its highest phase, measured by the tracking allocator).
TEST_F(OomScenario, TheStepsLeversSaveWhatTheRunsMeasure) {
  const auto report = expect_oom("gc_off", {"name=gc_off_priced"});
  ASSERT_EQ(report["phase"], "forward");
  std::map<std::string, int64_t> saving;
  for (const auto& f : report["fixes"]) saving[f["title"]] = f["predicted_saving_bytes"].get<int64_t>();
  auto step_peak = [&](const std::string& name, std::vector<std::string> extra, bool capped = false) {
    extra.insert(extra.end(), {"train.steps=2", "name=" + name});
    if (!capped) extra.push_back("vram_cap=0");  // auto decides under the cap the run ran out under
    train(load("gc_off", extra), {});
    std::ifstream in(dir_ / "out" / name / "memory.json");
    const auto phases = nlohmann::json::parse(in)["phase_peak_bytes"];
    int64_t peak = 0;
    for (const char* p : {"data", "text", "forward", "backward", "optimizer"})
      peak = std::max(peak, phases[p].get<int64_t>());
    return peak;
  };
  const int64_t off = step_peak("gc_off_uncapped", {});
  const int64_t automatic = step_peak("gc_off_auto", {"train.checkpoint_policy=auto"}, true);
  const int64_t half = step_peak("gc_off_half", {"train.batch_size=1", "train.gradient_accumulation=2"});
  for (const auto& [title, measured] : {std::pair<std::string, int64_t>{kAutoFix, off - automatic},
                                        {"Lower the batch size and accumulate", off - half}}) {
    ASSERT_TRUE(saving.count(title)) << title;
    std::printf("%s: predicted saving %lld, measured %lld\n", title.c_str(), static_cast<long long>(saving[title]),
                static_cast<long long>(measured));
    EXPECT_NEAR(static_cast<double>(saving[title]) / static_cast<double>(measured), 1.0, 0.05) << title;
  }
}

// A video model with checkpointing on: too many frames run out in the forward, and the report's first fix is
// fewer frames (half the latent frames), priced by re-planning; the run at those frames finishes under the
// same cap, and the saving the report predicts is what the two runs' measured step peaks differ by.
TEST_F(OomScenario, TooManyFramesRunOutInTheForwardAndTheFirstFixIsFewerFrames) {
  const auto report = expect_oom("frames");
  EXPECT_EQ(report["step"], 1);
  EXPECT_EQ(report["phase"], "forward");
  EXPECT_EQ(report["checkpoint_policy"], "full");
  ASSERT_FALSE(report["fixes"].empty());
  EXPECT_EQ(report["fixes"][0]["title"], "Train on fewer frames");
  EXPECT_EQ(report["fixes"][0]["change"], "datasets[*].num_frames: 17 (from 33)");
  const int64_t saving = report["fixes"][0]["predicted_saving_bytes"].get<int64_t>();
  EXPECT_GT(saving, int64_t{64} << 20);
  auto step_peak = [&](const config::ProcessConfig& config) {
    const TrainSummary s = train(config, {});
    EXPECT_EQ(s.end_step, 2) << config.name;
    std::ifstream in(dir_ / "out" / config.name / "memory.json");
    const auto phases = nlohmann::json::parse(in)["phase_peak_bytes"];
    int64_t peak = 0;
    for (const char* p : {"data", "text", "forward", "backward", "optimizer"})
      peak = std::max(peak, phases[p].get<int64_t>());
    return peak;
  };
  const int64_t fewer = step_peak(load("frames_fixed"));  // under the same cap
  const int64_t as_asked = step_peak(load("frames", {"vram_cap=0", "name=frames_uncapped"}));
  std::printf("frames 33: measured step peak %lld, at 17 %lld; the report's saving %lld, measured %lld\n",
              static_cast<long long>(as_asked), static_cast<long long>(fewer), static_cast<long long>(saving),
              static_cast<long long>(as_asked - fewer));
  EXPECT_LE(fewer, int64_t{450} << 20);
  EXPECT_GT(as_asked, int64_t{450} << 20);
  EXPECT_NEAR(static_cast<double>(saving) / static_cast<double>(as_asked - fewer), 1.0, 0.05);
  // The same clips at their own length (auto_frame_count: 33 frames at 16 fps train at 33): the same run
  // out, the lever turning auto_frame_count off for 17 frames, the same saving.
  const auto per_clip = expect_oom("frames", {"datasets.0.auto_frame_count=true", "datasets.0.num_frames=1",
                                              "datasets.0.fps=16", "name=frames_auto"});
  EXPECT_EQ(per_clip["phase"], "forward");
  ASSERT_FALSE(per_clip["fixes"].empty());
  EXPECT_EQ(per_clip["fixes"][0]["change"],
            "datasets[*].num_frames: 17 (from 33) with auto_frame_count: false (or a lower fps)");
  EXPECT_EQ(per_clip["fixes"][0]["predicted_saving_bytes"].get<int64_t>(), saving);
}

TEST_F(OomScenario, TheFirstPreviewRunsOutInTheSamplePhaseAndTheFixIsCheaperPreviews) {
  const auto report = expect_oom("preview");
  EXPECT_EQ(report["phase"], "sample");
  EXPECT_EQ(report["fixes"][0]["title"], "Make previews cheaper");
  EXPECT_NO_THROW(train(load("preview_fixed"), {}));
}

// T5-XXL resident on a 24 GB card, at CPU scale: a wide T5 (48.6 MiB of weights, a local folder of shapes)
// stays on the device every step and the first step runs out; the fix caches the captions' embeddings
// before training, the encoder leaves the device (as AI Toolkit does), and the run finishes under the same
// cap. The report puts the text-encoder levers first, the saving of each predicted from the encoders' bytes
// (and, when the caption's encode is what ran out — the loader's thread decoding the next batch beside it
// sometimes tips the text phase over first — the encode's predicted peak).
TEST_F(OomScenario, AResidentTextEncoderRunsOutAndTheFixIsCachingTextEmbeddings) {
  const std::string folder = "model.name_or_path=" + std::string(GCLAB_SOURCE_DIR) + "/configs/oom/models/flux_wide_t5";
  const auto report = expect_oom("text_encoder", {folder});
  EXPECT_EQ(report["step"], 1);
  const int64_t encoder = report["live_bytes"]["text_encoder"].get<int64_t>();
  EXPECT_GT(encoder, int64_t{48} << 20);
  const auto e = train::estimate_memory(load("text_encoder", {folder}));
  ASSERT_TRUE(e.text);
  const int64_t encode = report["phase"] == "text" ? e.text->encode_bytes : 0;
  ASSERT_GE(report["fixes"].size(), 3u);
  EXPECT_EQ(report["fixes"][0]["title"], "Cache text embeddings (the text encoders then leave the device)");
  EXPECT_EQ(report["fixes"][0]["predicted_saving_bytes"].get<int64_t>(), encoder + encode) << report["phase"];
  EXPECT_EQ(report["fixes"][1]["title"], "Unload the text encoders");
  EXPECT_EQ(report["fixes"][2]["title"], "Quantize the text encoders");
  // float8 Linear weights: three of every four bytes of the wide feed-forward go.
  EXPECT_GT(report["fixes"][2]["predicted_saving_bytes"].get<int64_t>(), encoder * 7 / 10);
  EXPECT_NO_THROW(train(load("text_encoder_fixed", {folder}), {}));
}

// Where the encode itself ran out (the step's `text` phase, or a preview encoding its prompts), the text
// encoders' levers come first, and caching or unloading them is priced with the encode's predicted peak
// (text/memory.h, as `gclab estimate` predicts it) beside their weights.
TEST_F(OomScenario, RunningOutWhileEncodingPricesTheEncodeWithTheEncoders) {
  const std::string folder = "model.name_or_path=" + std::string(GCLAB_SOURCE_DIR) + "/configs/oom/models/flux_wide_t5";
  const auto config =
      load("text_encoder", {folder, "sample.prompts=[a red circle]", "sample.width=256", "sample.height=256"});
  const auto e = train::estimate_memory(config);
  ASSERT_TRUE(e.text && e.preview);
  // Re-planned with cached embeddings: the encoders leave the device and the encode in the step's text phase
  // goes (the batch's cached embeddings come instead), which lowers the step's peak wherever it is; the
  // preview's prompts are cached too, so its encode goes and the preview is bounded by its decode or
  // denoising.
  auto cached_config = config;
  cached_config.train.cache_text_embeddings = true;
  const auto cached = train::estimate_memory(cached_config);
  ASSERT_TRUE(!cached.text->every_step && cached.preview);
  const int64_t embeddings = cached.resolutions.at(0).gc_full.text_bytes;
  EXPECT_GT(embeddings, 0);
  EXPECT_EQ(cached.preview->text_encode_bytes, 0);
  for (const auto& [phase, activity, saving] :
       {std::tuple{Phase::text, Activity::model,
                   e.resolutions.at(0).gc_full.total_bytes - cached.resolutions.at(0).gc_full.total_bytes},
        {Phase::sample, Activity::text_encode, e.preview->total_bytes - cached.preview->total_bytes}}) {
    OomContext ctx;
    ctx.phase = phase, ctx.activity = activity, ctx.bucket = "512x512", ctx.batch = 1, ctx.cpu = true;
    ctx.text_encoder_bytes = e.text_encoder_bytes, ctx.live_bytes = int64_t{1} << 30;  // not crowding: a quarter
    const auto fixes = recommend_fixes(ctx, config, codec_plan(config, model::spec_for(config.model)));
    ASSERT_GE(fixes.size(), 2u);
    EXPECT_EQ(fixes[0].title, "Cache text embeddings (the text encoders then leave the device)") << phase_name(phase);
    EXPECT_EQ(fixes[0].predicted_saving_bytes, saving) << phase_name(phase);
    EXPECT_EQ(fixes[1].title, "Unload the text encoders");
  }
}

// Running out while the caches fill (the `cache` phase, the transformer off the device): the report prices
// the fill's own levers from the memory model's cache estimate — the largest bucket for the latents' encode
// (one image at a time, so not the batch), the text encoders' quantization for the captions' — and none of
// the step's (checkpointing, batch).
TEST_F(OomScenario, RunningOutWhileCachingPricesTheFillsOwnLevers) {
  const std::string folder = "model.name_or_path=" + std::string(GCLAB_SOURCE_DIR) + "/configs/oom/models/flux_wide_t5";
  const auto config = load(
      "text_encoder", {folder, "model.vae=autoencoder", "datasets.0.cache_latents=true",
                       "train.cache_text_embeddings=true", "datasets.0.resolution=[256,512]", "train.batch_size=2"});
  const auto e = train::estimate_memory(config);
  ASSERT_TRUE(e.cache && e.text);
  EXPECT_EQ(e.cache->resolution, 512);
  EXPECT_GT(e.cache->latents_bytes, 0);
  EXPECT_GT(e.cache->text_bytes, 0);
  EXPECT_EQ(e.text->total_bytes, e.cache->text_bytes);  // the captions' encode before training is the fill
  auto smaller = config;
  smaller.datasets[0].resolution = {256};
  auto quantized = config;
  quantized.model.quantize_te = true;
  const int64_t latents_saving = e.cache->latents_bytes - train::estimate_memory(smaller).cache->latents_bytes;
  const int64_t text_saving = e.cache->text_bytes - train::estimate_memory(quantized).cache->text_bytes;
  ASSERT_GT(latents_saving, 0);
  ASSERT_GT(text_saving, 0);
  for (const auto& [activity, title, saving] :
       {std::tuple{Activity::vae_encode, std::string("Drop the largest bucket"), latents_saving},
        {Activity::text_encode, std::string("Quantize the text encoders"), text_saving}}) {
    OomContext ctx;
    ctx.phase = Phase::cache, ctx.activity = activity, ctx.batch = 1, ctx.cpu = true;
    ctx.text_encoder_bytes = activity == Activity::text_encode ? int64_t{48} << 20 : 0;
    const auto fixes = recommend_fixes(ctx, config, codec_plan(config, model::spec_for(config.model)));
    const auto it = std::find_if(fixes.begin(), fixes.end(), [&](const OomFix& f) { return f.title == title; });
    ASSERT_NE(it, fixes.end()) << title;
    EXPECT_EQ(it->predicted_saving_bytes, saving) << title;
    for (const OomFix& f : fixes) {
      EXPECT_NE(f.title, "Turn gradient checkpointing on");
      EXPECT_NE(f.title, "Lower the batch size and accumulate");
    }
  }
}

// A LoRA base whose frozen weights crowd the card, at CPU scale (a width-512 FLUX shape: 109 MiB of
// weights, a local folder of shapes): the first step runs out; the report offers quantizing and then
// offloading the base, each priced; the twin offloads its Linears to host memory (as AI Toolkit's
// layer_offloading) and finishes under the same cap, the offloaded weights measured as host memory.
TEST_F(OomScenario, AResidentBaseRunsOutAndOffloadingItsLayersFinishes) {
  const std::string folder = "model.name_or_path=" + std::string(GCLAB_SOURCE_DIR) + "/configs/oom/models/flux_wide";
  const auto report = expect_oom("offload", {folder});
  EXPECT_EQ(report["step"], 1);
  std::vector<std::string> titles;
  for (const auto& f : report["fixes"]) titles.push_back(f["title"].get<std::string>());
  const auto at = std::find(titles.begin(), titles.end(), "Offload the base's layers to host memory");
  ASSERT_NE(at, titles.end());
  EXPECT_GT(report["fixes"][at - titles.begin()]["predicted_saving_bytes"].get<int64_t>(), int64_t{64} << 20);
  const auto fixed = load("offload_fixed", {folder});
  EXPECT_NO_THROW(train(fixed, {}));
  std::ifstream in(dir_ / "out" / fixed.name / "memory.json");
  const auto memory = nlohmann::json::parse(in, nullptr, false);
  EXPECT_GT(memory["host"]["offloaded_weight_bytes"].get<int64_t>(), int64_t{100} << 20);
  EXPECT_GE(memory["host"]["measured_peak_bytes"].get<int64_t>(),
            memory["host"]["offloaded_weight_bytes"].get<int64_t>());
  EXPECT_LT(memory["peak_bytes"].get<int64_t>(), fixed.vram_cap.bytes);
}

// The load itself, before any step: AI Toolkit's FLUX.1 loader quantizes the transformer on the device
// unless model.low_vram is set, so a config whose checkpointed step fits can still run out while loading
// (the width-512 FLUX shape, qfloat8, float32: 119 MiB at load under a 100 MiB cap). The report names the
// load and offers low_vram first, priced from the load's walk; the low_vram twin loads with 28 MiB on the
// device (the rest in host memory, measured) and trains under the same cap.
TEST_F(OomScenario, QuantizingOnTheDeviceRunsOutWhileLoadingAndLowVramFinishes) {
  const std::string folder = "model.name_or_path=" + std::string(GCLAB_SOURCE_DIR) + "/configs/oom/models/flux_wide";
  const auto report = expect_oom("load_quantize", {folder});
  EXPECT_EQ(report["phase"], "setup");
  EXPECT_EQ(report["step"], 0);
  ASSERT_FALSE(report["fixes"].empty());
  EXPECT_EQ(report["fixes"][0]["change"], "model.low_vram: true");
  const int64_t saving = report["fixes"][0]["predicted_saving_bytes"].get<int64_t>();
  const int64_t load_peak = report["peak_bytes"].get<int64_t>();
  EXPECT_GT(load_peak, int64_t{100} << 20);
  EXPECT_LT(load_peak - saving, int64_t{100} << 20);  // the twin's load, predicted, fits
  const auto fixed = load("load_quantize_fixed", {folder});
  EXPECT_NO_THROW(train(fixed, {}));
  std::ifstream in(dir_ / "out" / fixed.name / "memory.json");
  const auto memory = nlohmann::json::parse(in, nullptr, false);
  const auto& l = memory["load"];
  EXPECT_TRUE(l["quantized_on_host"].get<bool>());
  EXPECT_EQ(l["measured_peak_bytes"].get<int64_t>(), l["predicted_peak_bytes"].get<int64_t>());
  EXPECT_EQ(l["measured_peak_bytes"].get<int64_t>(), load_peak - saving);
  EXPECT_EQ(l["host_measured_peak_bytes"].get<int64_t>(), l["host_predicted_peak_bytes"].get<int64_t>());
  EXPECT_GT(l["host_measured_peak_bytes"].get<int64_t>(), int64_t{100} << 20);
  EXPECT_LT(memory["peak_bytes"].get<int64_t>(), fixed.vram_cap.bytes);
}

// The seed's "OOM at the first sample": the step fits, the preview's denoising fits, and the autoencoder's
// decode at 1024² runs out; the fix decodes in tiles, which finishes under the same cap, its preview peak
// as gclab estimate predicts it.
TEST_F(OomScenario, TheFirstPreviewsDecodeRunsOutAndTheFixIsTiledDecoding) {
  const auto report = expect_oom("preview_decode");
  EXPECT_EQ(report["phase"], "sample");
  EXPECT_EQ(report["activity"], "vae decode");
  EXPECT_EQ(report["step"], 2);
  ASSERT_GE(report["fixes"].size(), 3u);
  EXPECT_EQ(report["fixes"][0]["title"], "Decode previews in tiles");
  EXPECT_EQ(report["fixes"][1]["title"], "Make previews cheaper");
  EXPECT_EQ(report["fixes"][2]["title"], "Preview less often, or not at all");
  const auto broken = train::estimate_memory(load("preview_decode"));
  const auto fixed_config = load("preview_decode_fixed");
  const auto fixed = train::estimate_memory(fixed_config);
  EXPECT_GT(broken.preview->total_bytes, broken.cap_bytes);
  EXPECT_LT(fixed.preview->total_bytes, fixed.cap_bytes);
  EXPECT_GT(report["fixes"][0]["predicted_saving_bytes"].get<int64_t>(),
            broken.preview->total_bytes - broken.cap_bytes);
  EXPECT_NO_THROW(train(fixed_config, {}));
  const auto png =
      data::read_image_size(dir_ / "out" / "preview_decode_fixed" / "samples" / "preview_decode_fixed_000000002_0.jpg");
  ASSERT_TRUE(png);
  EXPECT_EQ(png->width, 1024);
  EXPECT_EQ(png->height, 1024);
  std::ifstream in(dir_ / "out" / "preview_decode_fixed" / "memory.json");
  const auto memory = nlohmann::json::parse(in);
  const int64_t measured = memory["phase_peak_bytes"]["sample"].get<int64_t>();
  std::printf("tiled preview: predicted %lld, measured %lld\n", static_cast<long long>(fixed.preview->total_bytes),
              static_cast<long long>(measured));
  EXPECT_NEAR(static_cast<double>(fixed.preview->total_bytes) / static_cast<double>(measured), 1.0, 0.05);
}

TEST_F(OomScenario, TheLargestBucketRunsOutAndTheFixIsDroppingItAndTheSavedStateIsTheLastGoodStep) {
  const auto report = expect_oom("bucket");
  EXPECT_EQ(report["bucket"], "512x512");
  EXPECT_TRUE(report["phase"] == "forward" || report["phase"] == "backward") << report["phase"];
  EXPECT_EQ(report["fixes"][0]["title"], "Drop the largest bucket");
  const int64_t good = report["last_good_step"].get<int64_t>();
  ASSERT_GT(good, 0);
  // The same run stopped at the last good step without a cap: the state saved on OOM equals it.
  auto straight = load("bucket", {"vram_cap=0", "train.steps=" + std::to_string(good), "name=bucket_straight"});
  train(straight, {});
  char tag[16];
  std::snprintf(tag, sizeof tag, "%09lld", static_cast<long long>(good));
  const auto saved =
      io::SafetensorsFile::open(dir_ / "out" / "bucket" / ("bucket_" + std::string(tag) + ".state.safetensors"));
  const auto reference = io::SafetensorsFile::open(dir_ / "out" / "bucket_straight" /
                                                   ("bucket_straight_" + std::string(tag) + ".state.safetensors"));
  int compared = 0;
  for (const auto& e : reference.entries())
    if (e.name.rfind("param.", 0) == 0) {
      EXPECT_TRUE(torch::equal(saved.tensor(e.name), reference.tensor(e.name))) << e.name;
      ++compared;
    }
  EXPECT_GT(compared, 10);
  EXPECT_NO_THROW(train(load("bucket_fixed"), {}));
}

TEST_F(OomScenario, ABatchTooBigForTheResolutionRunsOutAndTheFixIsSmallerBatchesWithAccumulation) {
  const auto report = expect_oom("batch");
  EXPECT_EQ(report["batch"], 4);
  EXPECT_EQ(report["fixes"][0]["title"], "Lower the batch size and accumulate");
  EXPECT_NO_THROW(train(load("batch_fixed"), {}));
}

TEST_F(OomScenario, AnEditModelsReferenceTokensRunOutWithCheckpointingOffAndTheFixIsCheckpointing) {
  const auto report = expect_oom("edit");
  EXPECT_EQ(report["phase"], "forward");
  EXPECT_EQ(report["fixes"][0]["title"], kAutoFix) << report["fixes"][0].dump();
  EXPECT_NO_THROW(train(load("edit_fixed"), {}));
  EXPECT_NO_THROW(train(load("edit", {"train.checkpoint_policy=auto", "name=edit_auto"}), {}));
  // Without its control images the same model fits under the same cap: the references are the cause.
  EXPECT_NO_THROW(train(load("edit", {"datasets.0.control_path=[]", "name=edit_without_controls"}), {}));
}

// oom_policy: skip (the default) drops the batch as AI Toolkit's step loop does (BaseSDTrainProcess.py:
// 2624-2647): the step counts with no update, and the 4th in a row stops the run — with the state saved and
// every skipped batch (step, phase, bucket, batch) in the report, which AI Toolkit does not write.
TEST_F(OomScenario, SkipPolicyDropsBatchesAndStopsAtTheFourthInARow) {
  const auto config = load("gc_off", {"train.oom_policy=skip", "name=gc_off_skip", "train.steps=6"});
  EXPECT_THROW(train(config, {}), OutOfMemoryStop);
  std::ifstream metrics(dir_ / "out" / "gc_off_skip" / "metrics.jsonl");
  std::vector<int64_t> skipped;
  for (std::string line; std::getline(metrics, line);) {
    const auto j = nlohmann::json::parse(line);
    if (j.value("oom_skip", false)) {
      skipped.push_back(j["step"].get<int64_t>());
      EXPECT_EQ(j["batch"], 2);
      EXPECT_EQ(j["phase"], "forward");
    }
  }
  EXPECT_EQ(skipped, (std::vector<int64_t>{1, 2, 3}));  // each skipped step counts: the 4th stops the run
  std::ifstream in(dir_ / "out" / "gc_off_skip" / "oom_report.json");
  const auto report = nlohmann::json::parse(in);
  EXPECT_EQ(report["step"], 4);
  ASSERT_EQ(report["skipped"].size(), 3u);
  EXPECT_EQ(report["skipped"][2]["step"], 3);
  EXPECT_FALSE(report["skipped"][2]["bucket"].get<std::string>().empty());
  EXPECT_FALSE(RunSaves(dir_ / "out" / "gc_off_skip", "gc_off_skip", 0).newest_state() == std::nullopt);
}

}  // namespace
}  // namespace gclab::train
