// The loader's behaviour on small configs written for each rule: overrides, substitution, AI Toolkit's
// derived values, and every validation error path (each names the field and where its value came from).
#include <gtest/gtest.h>

#include <cctype>
#include <cstdlib>

#include "gclab/config/loader.h"
#include "gclab/model/family.h"

namespace gclab::config {
namespace {

// A minimal valid config in the plain (top-level) shape; tests append or override what they check.
const char* kMinimal = R"(name: tiny_run
model:
  arch: tiny-flux
train:
  steps: 10
  lr: 1e-4
datasets:
  - folder_path: /tmp
    resolution: [256, 512]
)";

LoadResult load(const std::string& text, std::vector<std::string> overrides = {}) {
  LoadOptions options;
  options.overrides = std::move(overrides);
  return model::load_config_text(text, "test.yaml", options);
}

std::string all_messages(const LoadResult& r) {
  std::string out;
  for (const auto& d : r.diagnostics.all()) out += d.format() + "\n";
  return out;
}

TEST(ConfigLoader, MinimalPlainShapeLoadsWithAitkDefaults) {
  const auto r = load(kMinimal);
  ASSERT_TRUE(r.ok()) << all_messages(r);
  const ProcessConfig& c = *r.config;
  EXPECT_EQ(c.name, "tiny_run");
  EXPECT_EQ(c.train.batch_size, 1);
  EXPECT_EQ(c.train.optimizer, config::OptimizerKind::adamw);
  EXPECT_EQ(c.train.dtype, config::DType::fp32);
  EXPECT_EQ(c.train.policy().to_string(), "full");  // gradient_checkpointing defaults to true in AI Toolkit
  EXPECT_EQ(c.save.save_every, 1000);
  EXPECT_EQ(c.save.max_step_saves_to_keep, 5);
  EXPECT_FALSE(c.network.has_value());
  EXPECT_FALSE(c.sample.has_value());
  EXPECT_EQ(c.vram_cap.bytes, 0);
  EXPECT_TRUE(r.diagnostics.all().empty()) << all_messages(r);
}

TEST(ConfigLoader, AitkShapeTakesNameFromConfigAndRunsFirstProcess) {
  const auto r = load(R"(job: extension
config:
  name: outer
  process:
    - model: {arch: tiny-dit}
      datasets: [{folder_path: /x, resolution: 256}]
    - model: {arch: tiny-flux}
meta:
  name: "[name]"
)");
  ASSERT_TRUE(r.ok()) << all_messages(r);
  EXPECT_EQ(r.config->name, "outer");
  EXPECT_EQ(r.config->model.arch, "tiny-dit");
  EXPECT_EQ(r.config->datasets[0].resolution, std::vector<int>{256});  // scalar -> list
  EXPECT_TRUE(r.diagnostics.mentions("gclab runs the first"));
  EXPECT_NE(r.config->meta_yaml.find("outer"), std::string::npos);
}

TEST(ConfigLoader, GradientCheckpointingFalseMapsToOff) {
  const auto r = load(kMinimal, {"train.gradient_checkpointing=false"});
  ASSERT_TRUE(r.ok()) << all_messages(r);
  EXPECT_EQ(r.config->train.policy().to_string(), "off");
  EXPECT_FALSE(r.config->train.gradient_checkpointing);
}

TEST(ConfigLoader, ExplicitCheckpointPolicyWinsAndTheContradictionIsSaid) {
  const auto r = load(kMinimal, {"train.gradient_checkpointing=false", "train.checkpoint_policy=every:2"});
  ASSERT_TRUE(r.ok()) << all_messages(r);
  EXPECT_EQ(r.config->train.policy().to_string(), "every:2");
  EXPECT_TRUE(r.config->train.gradient_checkpointing);
  EXPECT_TRUE(r.diagnostics.mentions("overrides train.gradient_checkpointing"));
}

TEST(ConfigLoader, OverridesTakeYamlValuesAndBothIndexSpellings) {
  const auto r = load(kMinimal, {"train.batch_size=4", "datasets.0.resolution=[512,1024]",
                                 "datasets[0].caption_ext=caption", "sample.width=768", "vram_cap=6GiB"});
  ASSERT_TRUE(r.ok()) << all_messages(r);
  EXPECT_EQ(r.config->train.batch_size, 4);
  EXPECT_EQ(r.config->datasets[0].resolution, (std::vector<int>{512, 1024}));
  EXPECT_EQ(r.config->datasets[0].caption_ext, ".caption");
  ASSERT_TRUE(r.config->sample.has_value());  // the block is created by the override
  EXPECT_EQ(r.config->sample->width, 768);
  EXPECT_EQ(r.config->vram_cap.bytes, 6LL << 30);
  EXPECT_EQ(r.config->source.where("train.batch_size"), "--set train.batch_size=4");
}

TEST(ConfigLoader, OverrideAppendsADatasetAtTheEndOfTheList) {
  const auto r = load(kMinimal, {"datasets.1={folder_path: /other, resolution: 256}"});
  ASSERT_TRUE(r.ok()) << all_messages(r);
  ASSERT_EQ(r.config->datasets.size(), 2u);
  EXPECT_EQ(*r.config->datasets[1].folder_path, "/other");
}

// Adafactor and Prodigy take their own optimizer_params as AI Toolkit passes them; what AI Toolkit's
// Adafactor itself refuses (relative_step with an lr, which AI Toolkit always passes) is an error here.
TEST(ConfigLoader, AdafactorAndProdigyTakeTheirOwnParameters) {
  const auto af = load(kMinimal, {"train.optimizer=adafactor", "train.optimizer_params.scale_parameter=true",
                                  "train.optimizer_params.beta1=0.9"});
  ASSERT_TRUE(af.ok()) << all_messages(af);
  EXPECT_EQ(af.config->train.optimizer, config::OptimizerKind::adafactor);
  EXPECT_EQ(af.config->train.optimizer_params.beta1, 0.9);
  EXPECT_TRUE(load(kMinimal, {"train.optimizer=adafactor", "train.optimizer_params.relative_step=true"})
                  .diagnostics.mentions("Cannot combine manual `lr` and `relative_step=True`"));
  const auto pr = load(kMinimal, {"train.optimizer=prodigy", "train.lr=1", "train.optimizer_params.d_coef=0.5"});
  ASSERT_TRUE(pr.ok()) << all_messages(pr);
  EXPECT_EQ(pr.config->train.optimizer_params.d_coef, 0.5);
  EXPECT_TRUE(load(kMinimal, {"train.optimizer=prodigy", "train.optimizer_params.scale_parameter=true"})
                  .diagnostics.mentions("is a parameter of adafactor, not of train.optimizer prodigy"));
}

// Inline flags in sample prompts, as AI Toolkit's GenerateImageConfig reads them: they set the item's
// size, seed, guidance, steps and negative prompt (over the sample block's), and leave the prompt without
// them — so a preview asked at --w 128 --h 192 runs at that size, the size that decides a preview's OOM.
TEST(ConfigLoader, SamplePromptFlagsSetTheItemAsInAiToolkit) {
  const auto r = load(kMinimal, {R"(sample={width: 512, height: 512, sample_steps: 20, guidance_scale: 4, samples: [
      {prompt: "a cat on a mat --w 128 --h 192 --seed 7 --cfg 2.5 --steps 3 --n blurry, dark"},
      {prompt: "a dog --d 11 --l 1.5 --s 4 --m 0.5 --frames 9 --ctrl_img pose.png --ctrl_idx 1"}, {prompt: "plain"}]})"});
  ASSERT_TRUE(r.ok()) << all_messages(r);
  const auto& items = r.config->sample->samples;
  ASSERT_EQ(items.size(), 3u);
  EXPECT_EQ(items[0].prompt, "a cat on a mat");
  EXPECT_EQ(items[0].width, 128);
  EXPECT_EQ(items[0].height, 192);
  EXPECT_EQ(items[0].prompt_seed, 7);
  EXPECT_FALSE(items[0].seed);
  EXPECT_EQ(items[0].guidance_scale, 2.5);
  EXPECT_EQ(items[0].sample_steps, 3);
  EXPECT_EQ(items[0].neg, "blurry, dark");
  EXPECT_EQ(items[1].prompt, "a dog");
  EXPECT_EQ(items[1].prompt_seed, 11);
  EXPECT_EQ(items[1].guidance_scale, 1.5);
  EXPECT_EQ(items[1].sample_steps, 4);
  EXPECT_EQ(items[1].network_multiplier, 0.5);
  EXPECT_EQ(items[1].width, 512);     // the block's
  EXPECT_EQ(items[1].num_frames, 9);  // --frames, as AI Toolkit reads it (config_modules.py:1446-1449)
  EXPECT_FALSE(items[0].num_frames);
  EXPECT_EQ(items[1].ctrl_img, "pose.png");
  EXPECT_EQ(items[1].ctrl_idx, 1);
  EXPECT_FALSE(items[0].ctrl_idx);
  EXPECT_EQ(items[2].prompt, "plain");
  EXPECT_TRUE(load(kMinimal, {R"(sample={samples: [{prompt: "x --w wide"}]})"})
                  .diagnostics.mentions("--w needs a number, got 'wide'"));
  // BaseSDTrainProcess.sample's seeds: an item's own seed carries to the items after it, a --seed flag
  // does not, and walk_seed restarts the walk at seed + i before an item's seed takes over.
  const auto seeds = load(kMinimal, {R"(sample={seed: 40, samples: [{prompt: "a"}, {prompt: "b", seed: 5},
      {prompt: "c"}, {prompt: "d --seed 9"}, {prompt: "e"}]})"});
  ASSERT_TRUE(seeds.ok()) << all_messages(seeds);
  EXPECT_EQ(seeds.config->sample->seeds(), (std::vector<std::int64_t>{40, 5, 5, 9, 5}));
  auto walked = *seeds.config->sample;
  walked.walk_seed = true;
  EXPECT_EQ(walked.seeds(), (std::vector<std::int64_t>{40, 5, 42, 9, 44}));
}

TEST(ConfigLoader, MalformedOverridesAreErrors) {
  EXPECT_TRUE(load(kMinimal, {"train.batch_size"}).diagnostics.mentions("expected PATH=VALUE"));
  EXPECT_TRUE(load(kMinimal, {"datasets.5.resolution=256"}).diagnostics.mentions("past the end"));
  EXPECT_TRUE(load(kMinimal, {"train..steps=3"}).diagnostics.mentions("not a field path"));
  EXPECT_TRUE(load(kMinimal, {"train.steps=[1"}).diagnostics.mentions("not valid YAML"));
  EXPECT_TRUE(load(kMinimal, {"train.steps.x=1"}).diagnostics.has_errors());
}

TEST(ConfigLoader, NameAndEnvironmentSubstitution) {
  ::setenv("GCLAB_TEST_DATA", "/data/set", 1);
  const auto r = load(std::string(kMinimal) + "training_folder: \"${GCLAB_TEST_DATA}/runs/[name]\"\n");
  ASSERT_TRUE(r.ok()) << all_messages(r);
  EXPECT_EQ(r.config->training_folder, "/data/set/runs/tiny_run");
}

TEST(ConfigLoader, UnsetEnvironmentVariableIsAnErrorAtItsLine) {
  ::unsetenv("GCLAB_SURELY_UNSET");
  const auto r = load(std::string(kMinimal) + "training_folder: ${GCLAB_SURELY_UNSET}/x\n");
  EXPECT_FALSE(r.ok());
  EXPECT_TRUE(r.diagnostics.mentions("training_folder (line 10): environment variable ${GCLAB_SURELY_UNSET}"))
      << all_messages(r);
}

TEST(ConfigLoader, TriggerPlaceholderIsLeftForCaptions) {
  const auto r = load(std::string(kMinimal) + "sample:\n  prompts: [\"[trigger] on a bike\"]\n");
  ASSERT_TRUE(r.ok()) << all_messages(r);
  EXPECT_EQ(r.config->sample->samples[0].prompt, "[trigger] on a bike");
  // With a trigger_word, AI Toolkit's sample() puts it in place of [trigger], adds it nowhere.
  const auto t = load(std::string(kMinimal) + "trigger_word: p3rs0n\nsample:\n  prompts: [\"[trigger] on a bike\", " +
                      "\"[name] and [trigger] --w 64\", \"a bike\"]\n");
  ASSERT_TRUE(t.ok()) << all_messages(t);
  EXPECT_EQ(t.config->sample->samples[0].prompt, "p3rs0n on a bike");
  EXPECT_EQ(t.config->sample->samples[1].prompt, "tiny_run and p3rs0n");  // [name]: the config's name
  EXPECT_EQ(t.config->sample->samples[1].width, 64);
  EXPECT_EQ(t.config->sample->samples[2].prompt, "a bike");
}

TEST(ConfigLoader, UnknownKeysWarnWithTheNearestKnownKey) {
  const auto r = load(std::string(kMinimal) + "sample:\n  sample_evry: 50\n  zzzzzzzzzz: 1\n");
  ASSERT_TRUE(r.ok()) << all_messages(r);
  EXPECT_TRUE(
      r.diagnostics.mentions("sample.sample_evry (line 11): unknown key, ignored (did you mean 'sample_every'?)"))
      << all_messages(r);
  EXPECT_TRUE(r.diagnostics.mentions("sample.zzzzzzzzzz (line 12): unknown key, ignored"));
}

TEST(ConfigLoader, AitkKeysGclabDoesNotActOnAreListedOnce) {
  const auto r = load(std::string(kMinimal) + "save:\n  push_to_hub: false\n");
  ASSERT_TRUE(r.ok()) << all_messages(r);
  ASSERT_EQ(r.ignored.size(), 1u);
  EXPECT_EQ(r.ignored[0], "save.push_to_hub");
  EXPECT_TRUE(r.diagnostics.warnings().empty()) << all_messages(r);
}

// text_encoder_bits is read (AI Toolkit's 16 / 8 / 4), and a value other than 16 is said to do nothing for
// these families, as in AI Toolkit, where it reaches PixArt only.
TEST(ConfigLoader, TextEncoderBitsIsReadAndSaidToDoNothingHere) {
  const auto plain = load(kMinimal, {"model.text_encoder_bits=16"});
  ASSERT_TRUE(plain.ok()) << all_messages(plain);
  EXPECT_TRUE(plain.diagnostics.warnings().empty()) << all_messages(plain);
  const auto eight = load(kMinimal, {"model.text_encoder_bits=8"});
  ASSERT_TRUE(eight.ok()) << all_messages(eight);
  EXPECT_EQ(eight.config->model.text_encoder_bits, 8);
  EXPECT_TRUE(eight.diagnostics.mentions("PixArt")) << all_messages(eight);
}

// AI Toolkit's ModelConfig turns qfloat8 into float8 under layer_offloading (toolkit/config_modules.py:
// 713-717), for the transformer and the text encoders alike; without offloading qfloat8 stays.
TEST(ConfigLoader, LayerOffloadingTurnsQfloat8IntoFloat8AsAiToolkitsModelConfig) {
  const std::vector<std::string> lora = {"network.type=lora", "network.linear=4", "model.quantize=true"};
  const auto plain = load(kMinimal, lora);
  ASSERT_TRUE(plain.ok()) << all_messages(plain);
  EXPECT_EQ(plain.config->model.qtype, QType::qfloat8);
  std::vector<std::string> offloaded = lora;
  offloaded.push_back("model.layer_offloading=true");
  const auto r = load(kMinimal, offloaded);
  ASSERT_TRUE(r.ok()) << all_messages(r);
  EXPECT_EQ(r.config->model.qtype, QType::float8);
  EXPECT_EQ(r.config->model.qtype_te, QType::float8);
  EXPECT_TRUE(r.diagnostics.mentions("becomes float8")) << all_messages(r);
}

// AI Toolkit's cosine is torch's CosineAnnealingLR with lr_scheduler_params as its keywords
// (toolkit/scheduler.py:11-15): a warm-up there is a TypeError before the first step, so it is refused
// here; constant_with_warmup takes it.
TEST(ConfigLoader, CosineTakesNoWarmUpAsTorchsCosineAnnealingLr) {
  for (const char* key : {"num_warmup_steps=10", "cosine_decay_steps=100"}) {
    const auto r = load(kMinimal, {"train.lr_scheduler=cosine", std::string("train.lr_scheduler_params.") + key});
    EXPECT_FALSE(r.ok()) << key;
    EXPECT_TRUE(r.diagnostics.mentions("CosineAnnealingLR")) << all_messages(r);
  }
  EXPECT_TRUE(load(kMinimal, {"train.lr_scheduler=cosine", "train.lr_scheduler_params.eta_min=1e-6"}).ok());
  EXPECT_TRUE(
      load(kMinimal, {"train.lr_scheduler=constant_with_warmup", "train.lr_scheduler_params.num_warmup_steps=10"})
          .ok());
  EXPECT_TRUE(load(kMinimal, {"train.lr_scheduler=linear", "train.lr_scheduler_params.start_factor=0.5"}).ok());
  // Any other key is a TypeError of that scheduler there.
  EXPECT_FALSE(load(kMinimal, {"train.lr_scheduler=cosine", "train.lr_scheduler_params.start_factor=0.5"}).ok());
  EXPECT_FALSE(load(kMinimal, {"train.lr_scheduler=linear", "train.lr_scheduler_params.eta_min=0"}).ok());
  EXPECT_FALSE(load(kMinimal, {"train.lr_scheduler_params.num_warmup_steps=10"}).ok());  // constant
}

// One dataset caching its text embeddings and another not is AI Toolkit's ValueError
// (toolkit/config_modules.py:1494-1500); every one, or train.cache_text_embeddings, is fine.
TEST(ConfigLoader, MixedTextEmbeddingCachingAcrossDatasetsIsRefusedAsAiToolkitRefusesIt) {
  const std::string two = "datasets.1={folder_path: /tmp, resolution: [256]}";
  const auto mixed = load(kMinimal, {two, "datasets.1.cache_text_embeddings=true"});
  EXPECT_FALSE(mixed.ok());
  EXPECT_TRUE(mixed.diagnostics.mentions("datasets[0].cache_text_embeddings")) << all_messages(mixed);
  EXPECT_TRUE(
      load(kMinimal, {two, "datasets.0.cache_text_embeddings=true", "datasets.1.cache_text_embeddings=true"}).ok());
  EXPECT_TRUE(load(kMinimal, {two, "datasets.1.cache_text_embeddings=true", "train.cache_text_embeddings=true"}).ok());
}

// On out of memory AI Toolkit skips the batch (BaseSDTrainProcess.py:2619-2647): skip is the default.
TEST(ConfigLoader, OutOfMemorySkipsTheBatchByDefaultAsAiToolkit) {
  const auto r = load(kMinimal);
  ASSERT_TRUE(r.ok()) << all_messages(r);
  EXPECT_EQ(r.config->train.oom_policy, OomPolicy::skip);
}

// Z-Image with an assistant adapter: its model class merges the adapter into the full-precision weights and
// quantizes after, turning qfloat8 into float8 first (extensions_built_in/diffusion_models/z_image/
// z_image.py:224-228); FLUX.1 (toolkit/assistant_lora.py) keeps qfloat8; so does Z-Image without one.
TEST(ConfigLoader, ZImagesAssistantAdapterTurnsQfloat8IntoFloat8) {
  const std::vector<std::string> quantized = {"network.type=lora", "network.linear=4", "model.quantize=true"};
  auto qtype = [&](const std::string& arch, bool assistant) {
    std::vector<std::string> o = quantized;
    o.push_back("model.arch=" + arch);
    if (assistant) o.push_back("model.assistant_lora_path=/nowhere/adapter.safetensors");
    const auto r = load(kMinimal, o);
    EXPECT_TRUE(r.ok()) << all_messages(r);
    return r.ok() ? r.config->model.qtype : QType::uint8;
  };
  EXPECT_EQ(qtype("tiny-zimage", true), QType::float8);
  EXPECT_EQ(qtype("tiny-zimage", false), QType::qfloat8);
  EXPECT_EQ(qtype("tiny-flux", true), QType::qfloat8);
}

struct BadValue {
  std::string override_text;
  std::string expected;  // text the diagnostic must contain
};

class ConfigValidation : public ::testing::TestWithParam<BadValue> {};

TEST_P(ConfigValidation, RejectsWithFieldAndOrigin) {
  const auto r = load(kMinimal, {GetParam().override_text});
  EXPECT_FALSE(r.ok());
  EXPECT_TRUE(r.diagnostics.mentions(GetParam().expected)) << all_messages(r);
  EXPECT_TRUE(r.diagnostics.mentions("--set " + GetParam().override_text)) << all_messages(r);
}

INSTANTIATE_TEST_SUITE_P(
    ConfigLoader, ConfigValidation,
    ::testing::Values(
        BadValue{"train.batch_size=0", "train.batch_size (--set train.batch_size=0): must be at least 1, got 0"},
        BadValue{"train.batch_size=two", "expected a whole number, got 'two'"},
        BadValue{"train.batch_size=1.5", "expected a whole number"},
        BadValue{"train.steps=[1,2]", "expected a whole number, got a list"}, BadValue{"train.lr=0", "train.lr"},
        BadValue{"train.lr=fast", "expected a number"},
        BadValue{"train.gradient_checkpointing=maybe", "expected true or false"},
        BadValue{"train.dtype=fp8", "'fp8' is not supported; use one of: fp32, bf16, fp16"},
        BadValue{"train.optimizer=automagic", "'automagic' is not supported; use one of: adamw, adamw8bit"},
        BadValue{"train.optimizer_params.d_coef=2", "is a parameter of prodigy, not of train.optimizer adamw"},
        BadValue{"train.timestep_type=cubic", "use one of: sigmoid, linear, shift, weighted"},
        BadValue{"train.optimizer_params.betas=[0.9]", "train.optimizer_params.betas"},
        BadValue{"train.ema_config.ema_decay=1.5", "ema_decay"},
        BadValue{"train.train_text_encoder=true", "keeps the text encoders frozen"},
        BadValue{"model.qtype=orbit4", "is not supported; use one of: qfloat8, float8, int8, uint2"},
        BadValue{"model.qtype_te=orbit4|x.safetensors", "model.qtype_te"},
        BadValue{"model.qtype_te=uint4|x.safetensors", "applies to the transformer only"},
        BadValue{"model.qtype=uint4|", "names no adapter after '|'"},
        BadValue{"model.text_encoder_bits=6", "must be 16, 8 or 4"},
        BadValue{"datasets.0.resolution=[0]", "must be positive, got 0"},
        BadValue{"datasets.0.resolution=[-256]", "must be positive"},
        BadValue{"datasets.0.caption_dropout_rate=1.5", "must be between 0 and 1"},
        BadValue{"datasets.0.num_repeats=0", "datasets[0].num_repeats"},
        BadValue{"datasets.0.folder_path=null", "datasets[0].folder_path"},
        BadValue{"datasets.0=7", "expected a block of keys"},
        BadValue{"network={type: lokr, linear: 8}", "'lokr' is not supported; gclab trains LoRA networks (lora)"},
        BadValue{"network={type: lora}", "network.linear"},
        BadValue{"network={linear: 4, linear_alpha: -1}", "network.linear_alpha"},
        BadValue{"save.dtype=int4", "save.dtype"},
        BadValue{"save.save_format=ckpt", "use one of: safetensors, diffusers"},
        BadValue{"sample.sample_steps=0", "sample.sample_steps"},
        BadValue{"sample.samples=[{prompt: a, width: 0}]", "sample.samples[0].width"},
        BadValue{"model.arch=omnigen2", "architecture 'omnigen2' is not modelled by gclab yet"},
        BadValue{"train.switch_boundary_every=-1", "train.switch_boundary_every"}, BadValue{"model=null", "model.arch"},
        BadValue{"vram_cap=lots", "expected a size such as 24GiB"}, BadValue{"name=\"\"", "name"}),
    [](const ::testing::TestParamInfo<BadValue>& info) {
      std::string name = std::to_string(info.index) + "_";
      for (char c : info.param.override_text) name += std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
      return name;
    });

TEST(ConfigLoader, AccumulationSpellingsAreMutuallyExclusive) {
  const auto r = load(kMinimal, {"train.gradient_accumulation=4", "train.gradient_accumulation_steps=2"});
  EXPECT_FALSE(r.ok());
  EXPECT_TRUE(r.diagnostics.mentions("mutually exclusive")) << all_messages(r);
}

TEST(ConfigLoader, ErrorsInTheFileNameTheirLine) {
  const auto r = load(R"(name: x
model: {arch: tiny-flux}
datasets:
  - folder_path: /x
    resolution: [256, -300]
train:
  batch_size: -3
)");
  EXPECT_FALSE(r.ok());
  EXPECT_TRUE(r.diagnostics.mentions("train.batch_size (line 7): must be at least 1, got -3")) << all_messages(r);
  EXPECT_TRUE(r.diagnostics.mentions("datasets[0].resolution (line 5): must be positive, got -300")) << all_messages(r);
}

TEST(ConfigLoader, ArchIsInferredFromTheSwitchesAndTheModelName) {
  EXPECT_EQ(load(kMinimal, {"model={is_flux: true, name_or_path: x}"}).config->model.arch, "flux");
  EXPECT_EQ(load(kMinimal, {"model={name_or_path: Qwen/Qwen-Image-Edit-2509}"}).config->model.arch,
            "qwen_image_edit_plus");
  EXPECT_EQ(load(kMinimal, {"model={arch: \"zimage:turbo\", name_or_path: x}"}).config->model.arch, "zimage");
  const auto sd1 = load(kMinimal, {"model={name_or_path: runwayml/stable-diffusion-v1-5}"});
  EXPECT_TRUE(sd1.diagnostics.mentions("AI Toolkit would assume sd1"));
}

TEST(ConfigLoader, NetworkRankAndAlphaFollowAitk) {
  const auto r = load(kMinimal, {"network={type: lora, rank: 8, alpha: 4}"});
  ASSERT_TRUE(r.ok()) << all_messages(r);
  EXPECT_EQ(r.config->network->linear, 8);
  EXPECT_DOUBLE_EQ(*r.config->network->linear_alpha, 4.0);
}

TEST(ConfigLoader, VramCapMayStandAtTheTopOfAnAitkFile) {
  const auto r = load(R"(job: extension
vram_cap: 24GB
config:
  name: capped
  process:
    - model: {arch: tiny-dit}
      datasets: [{folder_path: /x}]
)");
  ASSERT_TRUE(r.ok()) << all_messages(r);
  EXPECT_EQ(r.config->vram_cap.bytes, 24000000000LL);
}

TEST(ConfigLoader, ResolvedYamlRoundTrips) {
  const auto r = load(std::string(kMinimal) +
                      "network: {type: lora, linear: 4}\nsample:\n  samples: [{prompt: \"a \\\"quoted\\\" cat\"}]\n");
  ASSERT_TRUE(r.ok()) << all_messages(r);
  const std::string yaml = to_yaml(*r.config);
  const auto again = model::load_config_text(yaml, "resolved");
  ASSERT_TRUE(again.ok()) << all_messages(again) << yaml;
  EXPECT_EQ(to_yaml(*again.config), yaml);
  EXPECT_EQ(again.config->sample->samples[0].prompt, "a \"quoted\" cat");
  EXPECT_DOUBLE_EQ(again.config->train.lr, 1e-4);
}

TEST(ConfigLoader, DatasetFolderThatIsNotThereIsAWarningForCheck) {
  const auto r = load(kMinimal, {"datasets.0.folder_path=/no/such/images"});
  ASSERT_TRUE(r.ok()) << all_messages(r);
  EXPECT_TRUE(r.diagnostics.mentions("'/no/such/images' is not a folder here")) << all_messages(r);
}

TEST(ConfigLoader, MissingFileIsAClearError) {
  const auto r = model::load_config_file("/no/such/dir/config.yaml");
  EXPECT_FALSE(r.ok());
  EXPECT_TRUE(r.diagnostics.mentions("cannot be opened"));
}

}  // namespace
}  // namespace gclab::config
