// The proof that a video family is a folder (issue 47 item 5): the reel family, registered by one line,
// trains on clips end to end — latents encoded by its causal video autoencoder, on the fly and cached —
// with checkpointing changing nothing, previews several frames (an animated WebP beside the first frame),
// is estimated phase by phase within the image families' bounds (the phase sweep), and `fit` finds the
// largest num_frames per resolution and policy. Nothing outside this folder names it but its registration.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cctype>
#include <fstream>
#include <regex>
#include <sstream>

#include "../../support/test_util.h"
#include "gclab/bench/advise.h"
#include "gclab/bench/bench.h"
#include "gclab/config/loader.h"
#include "gclab/data/dataset.h"
#include "gclab/data/image.h"
#include "gclab/data/synth.h"
#include "gclab/io/safetensors.h"
#include "gclab/model/diffusers_config.h"
#include "gclab/model/registry.h"
#include "gclab/sample/sampler.h"
#include "gclab/train/checkpointing.h"
#include "gclab/train/flow.h"
#include "gclab/train/oom_report.h"
#include "gclab/train/predict.h"
#include "gclab/train/session.h"
#include "gclab/train/trainer.h"

namespace fs = std::filesystem;

namespace gclab {
namespace {

constexpr int kFrames = 9;  // 1 + 4·2: three latent frames

fs::path clips(const fs::path& dir) {
  if (!fs::exists(dir / "clips")) {
    data::SynthOptions o;
    o.count = 4;
    o.frames = 11;  // longer than a sample: num_frames of them are picked, evenly spread
    o.sizes = {{64, 64}, {80, 64}};
    data::write_synthetic_dataset(dir / "clips", o);
  }
  return dir / "clips";
}

config::ProcessConfig reel_config(const fs::path& dir, const std::string& name, std::vector<std::string> extra = {}) {
  const std::string yaml =
      "name: " + name + "\ntraining_folder: " + dir.string() +
      "\ndevice: cpu\ntraining_seed: 5\n"
      "save: {dtype: float32, save_every: 1000}\n"
      "datasets:\n  - folder_path: " +
      clips(dir).string() + "\n    resolution: [64]\n    num_frames: " + std::to_string(kFrames) +
      "\n"
      "train: {batch_size: 2, steps: 3, lr: 1e-3, optimizer: adamw, dtype: fp32, "
      "gradient_checkpointing: true, skip_first_sample: true}\n"
      "sample: {sample_every: 3, width: 64, height: 48, sample_steps: 2, guidance_scale: 3, num_frames: 5, fps: 8, "
      "prompts: [a red circle moving right], format: png}\n"
      "model: {arch: tiny-reel}\n";
  config::LoadOptions options;
  options.overrides = std::move(extra);
  auto r = model::load_config_text(yaml, "reel.yaml", options);
  if (!r.ok()) throw std::runtime_error("reel config refused: " + r.diagnostics.all().front().format());
  return *r.config;
}

TEST(VideoFamily, ItsGeometryIsFramesTimesHeightTimesWidth) {
  const model::ModelSpec spec = model::spec_by_preset("tiny-reel");
  EXPECT_TRUE(model::takes_frames(spec));
  EXPECT_EQ(model::latent_shape(spec, {2, 9, 64, 48}), (std::vector<int64_t>{2, 16, 3, 8, 6}));
  EXPECT_EQ(model::image_tokens(spec, {1, 9, 64, 48}), 3 * 4 * 3);  // 3 latent frames of 4 x 3 tokens
  EXPECT_EQ(model::family_of(spec.family).describe_blocks(spec), "3 video (self + cross attention)");
  // An image family refuses frames; a clip's frames are picked as AI Toolkit's shrink_video_to_frames does.
  EXPECT_THROW(model::latent_shape(model::spec_by_preset("tiny-flux"), {1, 5, 64, 64}), std::invalid_argument);
  EXPECT_EQ(data::clip_frame_indices(11, 9), (std::vector<int>{0, 1, 2, 4, 5, 6, 8, 9, 10}));  // 1.25 i, halves even
  EXPECT_EQ(data::clip_frame_indices(3, 5), (std::vector<int>{0, 0, 1, 2, 2}));                // short: repeated
}

// The transformer itself: 5-D latents through the flow loss, gradients equal to the bit with and without
// checkpointing; the sampler gives a sample of the latent shape, the guidance rule's two passes.
TEST(VideoFamily, ItsFlowLossIsExactUnderCheckpointing) {
  const model::ModelSpec spec = model::spec_by_preset("tiny-reel");
  torch::manual_seed(1);
  auto m = model::build_transformer(spec);
  train::MicroBatch b;
  b.x0 = torch::randn(model::latent_shape(spec, {2, 9, 64, 48}));
  b.noise = torch::randn_like(b.x0);
  b.t = torch::rand({2});
  b.conditioning.text = torch::randn({2, spec.max_text_tokens, spec.text_dim});
  auto grads = [&](const char* policy) {
    train::ModelCheckpointing gc(*m);
    gc.apply(ckpt::CheckpointPolicy::parse(policy));
    const double loss = train::flow_matching_step(*m, b, {});
    std::vector<torch::Tensor> g;
    for (auto& p : m->parameters()) g.push_back(p.grad().clone()), p.mutable_grad() = torch::Tensor();
    EXPECT_TRUE(std::isfinite(loss));
    return g;
  };
  const auto off = grads("off");
  for (const char* policy : {"full", "selective:attn", "every:2"}) {
    const auto on = grads(policy);
    ASSERT_EQ(off.size(), on.size());
    const auto names = m->named_parameters();
    for (size_t i = 0; i < off.size(); ++i)
      EXPECT_TRUE(torch::equal(off[i], on[i]))
          << policy << " " << names[i].key() << " " << (off[i] - on[i]).abs().max().item<double>();
  }
  sample::SampleOptions o;
  o.height = 64, o.width = 48, o.frames = 9, o.steps = 2, o.guidance_scale = 2;
  model::ModelInputs cond, uncond;
  cond.text = torch::randn({1, spec.max_text_tokens, spec.text_dim});
  uncond.text = torch::zeros({1, spec.max_text_tokens, spec.text_dim});
  EXPECT_EQ(sample::euler_sample(*m, cond, uncond, o).sizes(), torch::IntArrayRef({1, 16, 3, 8, 6}));
  EXPECT_EQ(model::family_of(spec.family).preview_guidance(spec, true)->forward_batch(2.0), 1);
}

// From a folder of clips: the autoencoder encodes each batch's frames on the fly (or once, cached), the loss
// is the same with checkpointing on and off, the preview is frames, and the weights are the family's.
TEST(VideoFamily, ItTrainsOnClipsAndPreviewsFrames) {
  const fs::path dir = testing::fresh_dir("reel_family");
  const train::TrainSummary on = train::train(reel_config(dir, "on"), {});
  const train::TrainSummary off = train::train(reel_config(dir, "off", {"train.gradient_checkpointing=false"}), {});
  ASSERT_EQ(on.losses.size(), 3u);
  ASSERT_EQ(off.losses.size(), 3u);
  for (size_t i = 0; i < on.losses.size(); ++i) {
    EXPECT_TRUE(std::isfinite(on.losses[i]));
    EXPECT_EQ(on.losses[i], off.losses[i]) << "step " << i + 1;
  }
  // The preview at step 3: its first frame as the sample format, all five frames as an animated WebP.
  ASSERT_EQ(on.samples.size(), 3u);  // the first frame, animated WebP, MP4
  EXPECT_EQ(on.samples[0].extension(), ".png");
  const auto first = data::read_image_size(on.samples[0]);
  ASSERT_TRUE(first);
  EXPECT_EQ(first->width, 64);
  EXPECT_EQ(first->height, 48);
  EXPECT_EQ(on.samples[1].filename().string(), on.samples[0].stem().string() + "_frames.webp");
  const data::AnimatedImage animation = data::read_animated_webp(on.samples[1]);
  EXPECT_EQ(animation.frames.sizes(), torch::IntArrayRef({5, 48, 64, 3}));
  EXPECT_EQ(animation.timestamps_ms.back(), 5 * 125);  // 8 fps
  // Latents cached before training: the same batches, encoded once; a run still trains.
  // The weights saved are the family's own tensors (Wan's names).
  const auto saved = io::SafetensorsFile::open(dir / "on" / "on.safetensors");
  EXPECT_TRUE(saved.contains("blocks.2.attn2.to_k.weight"));
  EXPECT_TRUE(saved.contains("blocks.0.scale_shift_table"));
  EXPECT_TRUE(saved.contains("patch_embedding.weight"));
  const train::TrainSummary cached =
      train::train(reel_config(dir, "cached", {"datasets[0].cache_latents=true", "train.disable_sampling=true"}), {});
  EXPECT_EQ(cached.losses.size(), 3u);
  fs::remove_all(dir);
}

// An image family refuses clips, and the video family's dataset refuses what it cannot read: clear errors.
TEST(VideoFamily, FramesAreRefusedWhereTheyCannotBeTrained) {
  const fs::path dir = testing::fresh_dir("reel_refusals");
  config::ProcessConfig image = reel_config(dir, "image", {"model.arch=tiny-flux"});
  EXPECT_THROW(train::plan_run(image), UserError);
  // Where every verb plans its autoencoder (gclab check and estimate too), not only a run's plan.
  EXPECT_THROW(train::codec_plan(image, model::spec_by_preset("tiny-flux")), UserError);
  config::ProcessConfig dct = reel_config(dir, "dct", {"model.vae=dct"});
  EXPECT_THROW(train::plan_run(dct), UserError);
  // An autoencoder whose frames per latent frame are not the transformer's.
  fs::create_directories(dir / "vae");
  std::ofstream(dir / "vae" / "config.json")
      << R"({"_class_name": "AutoencoderKLQwenImage", "temperal_downsample": [false, false, true]})";
  try {
    train::plan_run(reel_config(dir, "vae", {"model.vae_path=" + (dir / "vae").string()}));
    ADD_FAILURE() << "an autoencoder of 2 frames per latent frame was taken for a transformer of 4";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("turns 2 frames into a latent frame"), std::string::npos) << e.what();
  }
  // An image family's previews take one frame: a prompt's --num_frames is refused before training starts.
  config::ProcessConfig prompt =
      reel_config(dir, "prompt", {"model.arch=tiny-flux", "datasets[0].num_frames=1", "sample.num_frames=1"});
  prompt.sample->samples[0].num_frames = 5;
  EXPECT_THROW(train::plan_run(prompt), UserError);
  prompt.sample->samples[0].num_frames = 1;
  EXPECT_NO_THROW(train::plan_run(prompt));
  config::DatasetConfig loose;
  loose.folder_path = (dir / "loose").string();
  loose.num_frames = 5;
  data::SynthOptions o;
  o.count = 2, o.sizes = {{64, 64}};
  data::write_synthetic_dataset(dir / "loose", o);  // images, not clips
  EXPECT_THROW(data::scan_dataset(loose, 0), data::DataError);
  fs::remove_all(dir);
}

// The estimate of a clip run: every phase the run measured within the image families' bounds (the phase
// sweep's 5%), through gclab's own command line with this family registered — the sweep over cached and
// encoded latents, resident and cached captions, every checkpoint policy.
TEST(VideoFamily, ThePhaseSweepHoldsItsEstimate) {
  const fs::path dir = testing::fresh_dir("reel_phase_sweep");
  const std::string command = std::string(GCLAB_PYTHON) + " " + GCLAB_SOURCE_DIR +
                              "/scripts/docs/phase_sweep.py --bin " + GCLAB_TEST_FAMILIES_BIN +
                              " --presets tiny-reel --frames 5 --tolerance 0.05 --work " + dir.string() + " > " +
                              (dir / "sweep.txt").string() + " 2>&1";
  const int rc = std::system(command.c_str());
  std::ifstream in(dir / "sweep.txt");
  std::stringstream text;
  text << in.rdbuf();
  std::printf("%s\n", text.str().c_str());
  EXPECT_EQ(rc, 0) << text.str();
  EXPECT_NE(text.str().find("tiny-reel-fly-te-gc_off"), std::string::npos);
}

// fit grows a video run's frames: the largest num_frames (1 + 4k) per resolution and policy that trains
// under the cap, and the memory model's prediction of it.
TEST(VideoFamily, FitReportsTheLargestNumFrames) {
  const fs::path dir = testing::fresh_dir("reel_fit");
  config::ProcessConfig c = reel_config(dir, "fit", {"train.disable_sampling=true", "datasets[0].cache_latents=true"});
  c.vram_cap.bytes = int64_t{12} << 20;
  train::Session session = train::open_session(c, dir / "fit");
  const auto rows = bench::run_fit(session, {ckpt::CheckpointPolicy::off(), ckpt::CheckpointPolicy::full()}, {64},
                                   /*max_batch=*/8, /*max_frames=*/161);
  ASSERT_EQ(rows.size(), 2u);
  for (const auto& r : rows) {
    std::printf("fit %s at %d: largest num_frames %d measured, %d predicted (batch %d, peak %lld)\n", r.policy.c_str(),
                r.resolution, r.largest, r.predicted, r.batch, static_cast<long long>(r.peak_bytes));
    EXPECT_EQ(r.lever, "num_frames");
    EXPECT_EQ(r.batch, 2);
    ASSERT_GE(r.largest, 1);
    EXPECT_EQ((r.largest - 1) % 4, 0) << "a count the autoencoder takes";
    EXPECT_LT(r.largest, 161) << "the cap, not --max-frames, stopped it";
    EXPECT_LE(r.peak_bytes, c.vram_cap.bytes);
    EXPECT_LE(std::abs(r.predicted - r.largest), 4) << r.policy;  // within one step of 4 frames
  }
  EXPECT_GT(rows[1].largest, rows[0].largest) << "checkpointing lets more frames fit";
  fs::remove_all(dir);
}

// The checks every shipped family passes, run from the folder (the generic tests' preset lists are the
// shipped families'): each block keeps what the walk says, to the byte — full and LoRA — and the
// config.json a diffusers save writes reads back as the same shape.
TEST(VideoFamily, ItsBlocksKeepWhatTheWalkSaysAndItsConfigReadsBack) {
  const fs::path dir = testing::fresh_dir("reel_walk");
  for (const auto& extra : std::vector<std::vector<std::string>>{{}, {"network.type=lora", "network.linear=4"}}) {
    train::Session session(reel_config(dir, "probe", extra));
    const auto [measured, walked] = session.probe_block_activations();
    ASSERT_EQ(measured.per_block.size(), 3u);
    ASSERT_EQ(walked.per_block.size(), 3u);
    for (size_t i = 0; i < 3; ++i) {
      EXPECT_GT(measured.per_block[i].saved, 0) << i;
      EXPECT_EQ(walked.per_block[i].saved, measured.per_block[i].saved) << "block " << i << " " << extra.size();
      EXPECT_EQ(walked.per_block[i].input, measured.per_block[i].input) << "block " << i << " " << extra.size();
    }
  }
  const model::ModelSpec spec = model::spec_by_preset("tiny-reel");
  fs::create_directories(dir / "model" / "transformer");
  std::ofstream(dir / "model" / "transformer" / "config.json") << model::diffusers_config_json(spec);
  config::ModelConfig m;
  m.arch = "tiny-reel";
  m.name_or_path = (dir / "model").string();
  const model::ModelSpec read = model::spec_for(m);
  EXPECT_EQ(read.hidden, spec.hidden);
  EXPECT_EQ(read.heads, spec.heads);
  EXPECT_EQ(read.mlp_hidden, spec.mlp_hidden);
  EXPECT_EQ(read.single_blocks, spec.single_blocks);
  EXPECT_EQ(read.text_dim, spec.text_dim);
  EXPECT_EQ(read.latent_channels, spec.latent_channels);
  EXPECT_EQ(read.patch, spec.patch);
  EXPECT_EQ(read.patch_frames, spec.patch_frames);
  fs::remove_all(dir);
}

// advise on a clip run measures the num_frames lever beside the checkpoint policies: half the latent
// frames (33 -> 17), a change to what trains, so never the first thing advised, and cheaper than the run.
TEST(VideoFamily, AdviseMeasuresFewerFrames) {
  const fs::path dir = testing::fresh_dir("reel_advise");
  const config::ProcessConfig c = reel_config(
      dir, "advise", {"datasets[0].cache_latents=true", "train.disable_sampling=true", "datasets[0].num_frames=33"});
  train::Session session = train::open_session(c, dir / "advise");
  bench::AdviseOptions o;
  o.timed_steps = 1;
  const bench::AdviseResult r = bench::run_advise(session, o);
  const auto fewer =
      std::find_if(r.rows.begin(), r.rows.end(), [](const bench::Advice& a) { return a.change == "num_frames 17"; });
  ASSERT_NE(fewer, r.rows.end()) << bench::advise_table(r);
  EXPECT_TRUE(fewer->set.empty()) << "no --set reaches every dataset's num_frames";
  EXPECT_TRUE(fewer->changes_training);
  EXPECT_TRUE(fewer->fits);
  EXPECT_LT(fewer->peak_bytes, r.rows.front().peak_bytes) << "17 frames hold less than 33";
  EXPECT_EQ(r.first.find("num_frames"), std::string::npos) << r.first;
  fs::remove_all(dir);
}

// The OOM report of a clip run prices frames: fewer frames a sample when a step ran out (its bucket's frames
// read from the key, 64x64x9f), fewer preview frames when a preview did — each saving re-planned.
TEST(VideoFamily, TheOomReportOffersFewerFrames) {
  const fs::path dir = testing::fresh_dir("reel_oom");
  const config::ProcessConfig c = reel_config(dir, "oom", {"sample.num_frames=17"});
  const model::ModelSpec spec = model::spec_for(c.model);
  auto fix = [&](memory::Phase phase, const std::string& bucket, const std::string& title) -> std::optional<int64_t> {
    train::OomContext ctx;
    ctx.phase = phase, ctx.bucket = bucket, ctx.batch = 2, ctx.step = 2;
    for (const auto& f : train::recommend_fixes(ctx, c, train::codec_plan(c, spec)))
      if (f.title == title) return f.predicted_saving_bytes;
    return std::nullopt;
  };
  const auto frames = fix(memory::Phase::backward, "64x64x9f", "Train on fewer frames");
  ASSERT_TRUE(frames) << "no fewer-frames fix for a step of 9-frame clips";
  EXPECT_GT(*frames, 0);
  const auto preview = fix(memory::Phase::sample, "64x48", "Preview fewer frames");
  ASSERT_TRUE(preview) << "no fewer-frames fix for a 17-frame preview";
  EXPECT_GT(*preview, 0);
  fs::remove_all(dir);
}

// The folder is the family: outside tests/families/reel/ only its registration (tests/families/registry.cpp:
// the include and the one line) names it — no generic file of src/, include/, scripts/ or the other tests.
TEST(VideoFamily, NothingOutsideItsFolderNamesItButTheRegistryLine) {
  const fs::path root = GCLAB_SOURCE_DIR;
  const std::regex name("\\breel", std::regex::icase);  // the family's id, file names, namespace
  std::vector<std::string> found;
  for (const char* top :
       {"src", "include", "tests", "scripts", "bench", "cmake", "configs", "third_party", "CMakeLists.txt", ".ci"}) {
    if (!fs::exists(root / top)) continue;
    std::vector<fs::path> files;
    if (fs::is_regular_file(root / top)) files.push_back(root / top);
    if (fs::is_directory(root / top))
      for (const auto& entry : fs::recursive_directory_iterator(root / top))
        if (entry.is_regular_file()) files.push_back(entry.path());
    for (const fs::path& f : files) {
      const std::string rel = fs::relative(f, root).generic_string();
      if (rel.rfind("tests/families/reel/", 0) == 0) continue;
      std::ifstream in(f);
      std::string line;
      for (int n = 1; std::getline(in, line); ++n)
        if (std::regex_search(line, name)) found.push_back(rel + ":" + std::to_string(n) + ": " + line);
    }
  }
  ASSERT_EQ(found.size(), 2u) << ::testing::PrintToString(found);
  EXPECT_NE(found[0].find("tests/families/registry.cpp"), std::string::npos) << found[0];
  EXPECT_NE(found[0].find("#include \"reel/reel.h\""), std::string::npos) << found[0];
  EXPECT_NE(found[1].find("tests/families/registry.cpp"), std::string::npos) << found[1];
  EXPECT_NE(found[1].find("register_family(model::reel::reel_family())"), std::string::npos) << found[1];
}

}  // namespace
}  // namespace gclab
