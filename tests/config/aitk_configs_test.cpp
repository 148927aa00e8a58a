// Every real AI Toolkit example config (shared/aitk-configs, unmodified) either loads with the values the
// file says, or is refused with a message naming the architecture gclab does not model.
#include <gtest/gtest.h>

#include <filesystem>

#include "../support/test_util.h"
#include "gclab/config/loader.h"
#include "gclab/data/synth.h"
#include "gclab/model/family.h"
#include "gclab/model/flow_schedule.h"
#include "gclab/model/quantize.h"
#include "gclab/model/registry.h"
#include "gclab/model/summary.h"
#include "gclab/model/transformer.h"
#include "gclab/train/plan.h"
#include "gclab/train/predict.h"
#include "gclab/train/session.h"

namespace gclab::config {
namespace {

std::string aitk(const std::string& file) { return std::string(GCLAB_SHARED_DIR) + "/aitk-configs/" + file; }

ProcessConfig load_ok(const std::string& file) {
  const auto result = model::load_config_file(aitk(file));
  std::string messages;
  for (const auto& d : result.diagnostics.all()) messages += d.format() + "\n";
  EXPECT_TRUE(result.ok()) << file << ":\n" << messages;
  if (!result.config) return {};
  return *result.config;
}

TEST(AitkConfigs, SharedFolderIsPresent) {
  ASSERT_TRUE(std::filesystem::exists(aitk("train_lora_flux_24gb.yaml")))
      << "tests read ../shared/aitk-configs; run them from a checkout that has shared/ beside it";
}

TEST(AitkConfigs, FluxDevResolvesEveryBlockAsWritten) {
  const ProcessConfig c = load_ok("train_lora_flux_24gb.yaml");
  EXPECT_EQ(c.name, "my_first_flux_lora_v1");
  EXPECT_EQ(c.training_folder, "output");
  EXPECT_EQ(c.device, "cuda:0");
  EXPECT_FALSE(c.trigger_word.has_value());  // commented out in the file
  ASSERT_TRUE(c.network.has_value());
  EXPECT_EQ(c.network->type, "lora");
  EXPECT_EQ(c.network->linear, 16);
  EXPECT_DOUBLE_EQ(*c.network->linear_alpha, 16.0);
  EXPECT_EQ(c.save.dtype, config::DType::fp16);
  EXPECT_EQ(c.save.save_every, 250);
  EXPECT_EQ(c.save.max_step_saves_to_keep, 4);
  ASSERT_EQ(c.datasets.size(), 1u);
  EXPECT_EQ(*c.datasets[0].folder_path, "/path/to/images/folder");
  EXPECT_EQ(c.datasets[0].caption_ext, ".txt");  // AI Toolkit adds the dot
  EXPECT_DOUBLE_EQ(c.datasets[0].caption_dropout_rate, 0.05);
  EXPECT_FALSE(c.datasets[0].shuffle_tokens);
  EXPECT_TRUE(c.datasets[0].cache_latents_to_disk);
  EXPECT_EQ(c.datasets[0].resolution, (std::vector<int>{512, 768, 1024}));
  EXPECT_EQ(c.train.batch_size, 1);
  EXPECT_EQ(c.train.steps, 2000);
  EXPECT_EQ(c.train.gradient_accumulation_steps, 1);
  EXPECT_TRUE(c.train.gradient_checkpointing);
  EXPECT_EQ(c.train.policy().to_string(), "full");
  EXPECT_EQ(c.train.noise_scheduler, "flowmatch");
  EXPECT_EQ(c.train.optimizer, config::OptimizerKind::adamw8bit);
  EXPECT_DOUBLE_EQ(c.train.lr, 1e-4);
  EXPECT_TRUE(c.train.ema_config.use_ema);
  EXPECT_DOUBLE_EQ(c.train.ema_config.ema_decay, 0.99);
  EXPECT_EQ(c.train.dtype, config::DType::bf16);
  EXPECT_EQ(c.train.timestep_type, config::TimestepType::sigmoid);  // AI Toolkit's default, not in the file
  EXPECT_DOUBLE_EQ(c.train.max_grad_norm, 1.0);
  EXPECT_EQ(*c.model.name_or_path, "black-forest-labs/FLUX.1-dev");
  EXPECT_EQ(c.model.arch, "flux");  // from is_flux
  EXPECT_TRUE(c.model.quantize);
  EXPECT_EQ(c.model.quantize_te, std::nullopt);
  ASSERT_TRUE(c.sample.has_value());
  EXPECT_EQ(c.sample->sample_every, 250);
  EXPECT_EQ(c.sample->width, 1024);
  EXPECT_EQ(c.sample->height, 1024);
  EXPECT_DOUBLE_EQ(c.sample->guidance_scale, 4.0);
  EXPECT_EQ(c.sample->sample_steps, 20);
  EXPECT_EQ(c.sample->seed, 42);
  EXPECT_TRUE(c.sample->walk_seed);
  ASSERT_EQ(c.sample->samples.size(), 10u);  // prompts become sample items
  EXPECT_EQ(c.sample->samples[4].prompt, "a bear building a log cabin in the snow covered mountains");
  EXPECT_EQ(c.sample->samples[0].width, 1024);
  EXPECT_EQ(c.sample->samples[0].sample_steps, 20);
  EXPECT_NE(c.meta_yaml.find("my_first_flux_lora_v1"), std::string::npos);  // meta's [name] substituted
  EXPECT_EQ(c.source.where("train.optimizer"), "line 48");
}

TEST(AitkConfigs, FluxSchnellAndFlexKeepTheirSettings) {
  const ProcessConfig schnell = load_ok("train_lora_flux_schnell_24gb.yaml");
  EXPECT_EQ(schnell.model.arch, "flux");
  EXPECT_EQ(*schnell.model.name_or_path, "black-forest-labs/FLUX.1-schnell");
  ASSERT_TRUE(schnell.sample.has_value());
  EXPECT_DOUBLE_EQ(schnell.sample->guidance_scale, 1.0);
  EXPECT_EQ(schnell.sample->sample_steps, 4);

  const ProcessConfig flex = load_ok("train_lora_flex_24gb.yaml");
  // is_flux with Flex.1's name: AI Toolkit loads Flex.1 (8 double blocks), so the arch is flex1 (was
  // FLUX.1-dev's preset, 11.9 B parameters instead of 8.16 B).
  EXPECT_EQ(flex.model.arch, "flex1");
  EXPECT_EQ(*flex.model.name_or_path, "ostris/Flex.1-alpha");

  const ProcessConfig flex2 = load_ok("train_lora_flex2_24gb.yaml");
  EXPECT_EQ(flex2.model.arch, "flex2");
  EXPECT_EQ(flex2.network->linear, 32);
  EXPECT_EQ(flex2.train.timestep_type, config::TimestepType::shift);
  EXPECT_EQ(flex2.train.gradient_accumulation, 1);
  EXPECT_DOUBLE_EQ(flex2.train.optimizer_params.weight_decay, 1e-5);
  EXPECT_FALSE(flex2.train.ema_config.use_ema);
  EXPECT_EQ(flex2.model.quantize_te, true);
}

TEST(AitkConfigs, QwenImageFamilies) {
  const ProcessConfig qwen = load_ok("train_lora_qwen_image_24gb.yaml");
  EXPECT_EQ(qwen.model.arch, "qwen_image");
  EXPECT_TRUE(qwen.model.low_vram);
  EXPECT_TRUE(qwen.model.quantize);
  // "uint3|ostris/...safetensors": AI Toolkit's ModelConfig splits the adapter off the qtype.
  EXPECT_EQ(qwen.model.qtype, QType::uint3);
  EXPECT_EQ(qwen.model.accuracy_recovery_adapter.value_or(""),
            "ostris/accuracy_recovery_adapters/qwen_image_torchao_uint3.safetensors");

  const ProcessConfig edit = load_ok("train_lora_qwen_image_edit_32gb.yaml");
  EXPECT_EQ(edit.model.arch, "qwen_image_edit");

  const ProcessConfig plus = load_ok("train_lora_qwen_image_edit_2509_32gb.yaml");
  EXPECT_EQ(plus.model.arch, "qwen_image_edit_plus");
  EXPECT_TRUE(plus.train.cache_text_embeddings);
  EXPECT_EQ(plus.train.timestep_type, config::TimestepType::weighted);
  EXPECT_EQ(plus.datasets[0].control_path.size(), 3u);
  EXPECT_EQ(plus.model.qtype_te, QType::qfloat8);
  ASSERT_TRUE(plus.sample.has_value());
  ASSERT_EQ(plus.sample->samples.size(), 5u);
  EXPECT_EQ(*plus.sample->samples[0].ctrl_img_2, "/path/to/image2.png");
  EXPECT_DOUBLE_EQ(*plus.sample->samples[0].guidance_scale, 3.0);
  EXPECT_EQ(*plus.sample->samples[0].sample_steps, 25);
}

// AI Toolkit's Wan 2.1 1.3B example (arch wan21 for both sizes; the 1.3B by name_or_path), as written: its
// resolution 632 ("around 480p") is the buckets' target area — a square image trains at 624 x 640 (Wan's buckets
// are multiples of 16) — UMT5 quantized (quantize_te), a 40-frame preview at 15 fps.
TEST(AitkConfigs, Wan21ExampleLoadsAsWritten) {
  const ProcessConfig wan = load_ok("train_lora_wan21_1b_24gb.yaml");
  EXPECT_EQ(wan.model.arch, "wan21");
  EXPECT_TRUE(wan.model.quantize_te.value_or(false));
  ASSERT_EQ(wan.datasets.size(), 1u);
  EXPECT_EQ(wan.datasets[0].resolution, std::vector<int>{632});
  const std::vector<train::StepCell> cells = train::step_cells(wan);
  ASSERT_EQ(cells.size(), 1u);
  EXPECT_EQ(cells[0].resolution, 632);
  EXPECT_EQ(cells[0].shape().width, 624);
  EXPECT_EQ(cells[0].shape().height, 640);  // 624 x 640 is closer to 632² than 624², within it
  ASSERT_TRUE(wan.sample.has_value());
  EXPECT_EQ(wan.sample->num_frames, 40);
  EXPECT_EQ(wan.sample->fps, 15);
}

// AI Toolkit's 14B example (config/examples/train_lora_wan21_14b_24gb.yaml at 27a03a9, not in ../shared: its
// model block and dataset written here as it sets them): the 14B preset by its name_or_path, the exact count,
// the UI's low_vram load under 24 GiB (quantized blocks parked while UMT5 loads).
TEST(AitkConfigs, Wan21The14bExampleResolvesToThe14b) {
  const std::string yaml =
      "job: extension\nconfig:\n  name: my_first_wan21_14b_lora_v1\n  process:\n    - type: sd_trainer\n"
      "      device: cuda:0\n      network: {type: lora, linear: 32, linear_alpha: 32}\n"
      "      datasets: [{folder_path: /path/to/images/folder, caption_ext: txt, cache_latents_to_disk: true, "
      "resolution: [632]}]\n"
      "      train: {batch_size: 1, steps: 2000, gradient_checkpointing: true, noise_scheduler: flowmatch, "
      "timestep_type: sigmoid, optimizer: adamw8bit, lr: 1e-4, dtype: bf16, unload_text_encoder: true, "
      "ema_config: {use_ema: true, ema_decay: 0.99}}\n"
      "      model: {name_or_path: Wan-AI/Wan2.1-T2V-14B-Diffusers, arch: wan21, quantize: true, quantize_te: true, "
      "low_vram: true}\n"
      "      sample: {sampler: flowmatch, sample_every: 250, width: 832, height: 480, num_frames: 40, fps: 15, "
      "prompts: [woman playing the guitar]}\n";
  const auto r = model::load_config_text(yaml, "train_lora_wan21_14b_24gb.yaml");
  ASSERT_TRUE(r.ok()) << r.diagnostics.all().front().format();
  const auto plan = train::plan_run(*r.config, train::PlanOptions{/*meta=*/true});
  EXPECT_EQ(plan.spec.preset, "wan21-14b");
  EXPECT_EQ(model::parameter_count(*model::build_transformer(plan.spec, torch::TensorOptions().device(torch::kMeta))),
            14288491584);
  EXPECT_TRUE(plan.load.after_text_encoders);
  EXPECT_TRUE(plan.load.quantized_on_host);
  EXPECT_LT(train::predicted_load_peak(*r.config), int64_t{24} << 30);
}

// A job as AI Toolkit's UI writes it (one sd_trainer process on cuda:0, a rank-32 LoRA) with `rest` after the
// network, and a folder holding one synthetic image for its dataset.
std::filesystem::path ui_dataset(const std::string& name) {
  const std::filesystem::path dir = gclab::testing::fresh_dir(name);
  data::SynthOptions o;
  o.count = 1, o.sizes = {{64, 64}};
  data::write_synthetic_dataset(dir, o);
  return dir;
}
std::string ui_job(const std::string& name, const std::string& rest) {
  return "job: extension\nconfig:\n  name: " + name +
         "\n  process:\n    - type: sd_trainer\n      device: cuda:0\n"
         "      network: {type: lora, linear: 32, linear_alpha: 32}\n" +
         rest;
}

// FLUX.1 Kontext: AI Toolkit's example (config/examples/train_lora_flux_kontext_24gb.yaml at 27a03a9, its keys
// written here: rank 16, a control_path, cached latents, 512 and 768, adamw8bit, weighted timesteps, quantize,
// 1024² previews each with a --ctrl_img) and the UI's flux_kontext preset (options.tsx:119-135: quantize and
// quantize_te on, weighted timesteps, control_path and ctrl_img sections) resolve to FLUX.1-dev's transformer
// with reference tokens at the image's size, buckets of 16, the control image's latents encoded in every step.
TEST(AitkConfigs, FluxKontextTheExampleAndTheUisPresetResolveToKontext) {
  namespace fs = std::filesystem;
  const fs::path dir = ui_dataset("aitk_flux_kontext");
  const fs::path controls = ui_dataset("aitk_flux_kontext_controls");
  const std::string control = (controls / "synth_0000.png").string();
  const std::string example = ui_job(
      "my_first_flux_kontext_lora_v1",
      "      datasets: [{folder_path: " + dir.string() + ", control_path: " + controls.string() +
          ", caption_ext: txt, caption_dropout_rate: 0.05, shuffle_tokens: false, cache_latents_to_disk: true, "
          "resolution: [512, 768]}]\n"
          "      train: {batch_size: 1, steps: 3000, gradient_accumulation_steps: 1, train_unet: true, "
          "train_text_encoder: false, gradient_checkpointing: true, noise_scheduler: flowmatch, optimizer: adamw8bit, "
          "lr: 1e-4, timestep_type: weighted, dtype: bf16}\n"
          "      model: {name_or_path: black-forest-labs/FLUX.1-Kontext-dev, arch: flux_kontext, quantize: true}\n"
          "      sample: {sampler: flowmatch, sample_every: 250, width: 1024, height: 1024, neg: '', seed: 42, "
          "walk_seed: true, guidance_scale: 4, sample_steps: 20, prompts: ['make the person smile  --ctrl_img " +
          control + "']}\n");
  const std::string ui = ui_job(
      "kontext_ui",
      "      datasets: [{folder_path: " + dir.string() + ", control_path: [" + controls.string() +
          "], caption_ext: txt, cache_latents_to_disk: false, resolution: [512, 768, 1024]}]\n"
          "      train: {batch_size: 1, steps: 3000, gradient_checkpointing: true, noise_scheduler: flowmatch, "
          "timestep_type: weighted, optimizer: adamw8bit, lr: 1e-4, dtype: bf16}\n"
          "      model: {name_or_path: black-forest-labs/FLUX.1-Kontext-dev, arch: flux_kontext, quantize: true, "
          "quantize_te: true}\n"
          "      sample: {sampler: flowmatch, sample_every: 250, width: 1024, height: 1024, prompts: ['a --ctrl_img " +
          control + "']}\n");
  for (const auto& [name, yaml] : {std::pair{"example", example}, {"ui", ui}}) {
    SCOPED_TRACE(name);
    const auto r = model::load_config_text(yaml, std::string(name) + ".yaml");
    ASSERT_TRUE(r.ok()) << r.diagnostics.all().front().format();
    const auto plan = train::plan_run(*r.config, train::PlanOptions{/*meta=*/true});
    EXPECT_EQ(plan.spec.preset, "flux-kontext");
    EXPECT_EQ(model::parameter_count(*model::build_transformer(plan.spec, torch::TensorOptions().device(torch::kMeta))),
              11901408320);
    EXPECT_TRUE(model::trains_references_at_image_size(plan.spec));
    EXPECT_EQ(plan.spec.divisibility, 16);
    EXPECT_TRUE(plan.vae_in_steps);  // the control image encoded every step, latents cached or not
    EXPECT_EQ(plan.family->base_model_version(r.config->model.arch), "flux.1_kontext");
    EXPECT_EQ(plan.load.loading, model::TransformerLoading::on_device);
    ASSERT_EQ(plan.preview_controls.size(), 1u);
    EXPECT_EQ(plan.preview_controls[0].size(), 1u);
    // A 768 resolution holds the image's 48 x 48 tokens and as many of its reference (4608).
    EXPECT_EQ(model::step_tokens(plan.spec, {1, 1, 768, 768}).image, 2 * 48 * 48);
    // Its trainer shifts by the latents' h·w (patch_size 1: not is_flux), FLUX.1-dev's by the packed tokens.
    EXPECT_EQ(plan.family->shift_tokens(plan.spec, {1, 1, 768, 768}), 96 * 96);
    EXPECT_EQ(plan.family->shift_tokens(model::spec_by_preset("flux-dev"), {1, 1, 768, 768}), 48 * 48);
  }
  fs::remove_all(dir);
  fs::remove_all(controls);
}

// Chroma: AI Toolkit's example (config/examples/train_lora_chroma_24gb.yaml at 27a03a9, its keys written here:
// lodestones/Chroma, rank 16, 512 / 768 / 1024, adamw8bit, EMA, quantize, 1024² previews at guidance 4) and the
// UI's chroma preset (options.tsx:179-192: lodestones/Chroma1-Base, quantize and quantize_te on; the rest
// jobConfig.ts's defaults, qfloat8, sigmoid timesteps) resolve to Chroma's transformer at diffusers' count,
// T5 alone quantized as model.qtype, buckets of 32, loaded whole on the device, the shift types counting the
// latents' h·w (its FakeConfig's patch_size 1), and its previews' CFG in two forwards above guidance 1.00001.
TEST(AitkConfigs, ChromaTheExampleAndTheUisPresetResolveToChroma) {
  namespace fs = std::filesystem;
  const fs::path dir = ui_dataset("aitk_chroma");
  const std::string example = ui_job(
      "my_first_chroma_lora_v1",
      "      datasets: [{folder_path: " + dir.string() +
          ", caption_ext: txt, caption_dropout_rate: 0.05, shuffle_tokens: false, cache_latents_to_disk: true, "
          "resolution: [512, 768, 1024]}]\n"
          "      train: {batch_size: 1, steps: 2000, gradient_accumulation: 1, train_unet: true, "
          "train_text_encoder: false, gradient_checkpointing: true, noise_scheduler: flowmatch, optimizer: adamw8bit, "
          "lr: 1e-4, ema_config: {use_ema: true, ema_decay: 0.99}, dtype: bf16}\n"
          "      model: {name_or_path: lodestones/Chroma, arch: chroma, quantize: true}\n"
          "      sample: {sampler: flowmatch, sample_every: 250, width: 1024, height: 1024, neg: '', seed: 42, "
          "walk_seed: true, guidance_scale: 4, sample_steps: 25, prompts: ['a bear building a log cabin']}\n");
  const std::string ui = ui_job(
      "chroma_ui",
      "      datasets: [{folder_path: " + dir.string() +
          ", caption_ext: txt, cache_latents_to_disk: false, resolution: [512, 768, 1024]}]\n"
          "      train: {batch_size: 1, steps: 3000, gradient_checkpointing: true, noise_scheduler: flowmatch, "
          "timestep_type: sigmoid, optimizer: adamw8bit, lr: 1e-4, dtype: bf16}\n"
          "      model: {name_or_path: lodestones/Chroma1-Base, arch: chroma, quantize: true, quantize_te: true, "
          "qtype: qfloat8}\n"
          "      sample: {sampler: flowmatch, sample_every: 250, width: 1024, height: 1024, prompts: ['a']}\n");
  for (const auto& [name, yaml] : {std::pair{"example", example}, {"ui", ui}}) {
    SCOPED_TRACE(name);
    const auto r = model::load_config_text(yaml, std::string(name) + ".yaml");
    ASSERT_TRUE(r.ok()) << r.diagnostics.all().front().format();
    const auto plan = train::plan_run(*r.config, train::PlanOptions{/*meta=*/true});
    EXPECT_EQ(plan.spec.preset, "chroma");
    // diffusers' ChromaTransformer2DModel at its defaults, counted on the meta device: 8,899,983,424.
    EXPECT_EQ(model::parameter_count(*model::build_transformer(plan.spec, torch::TensorOptions().device(torch::kMeta))),
              8899983424);
    EXPECT_EQ(plan.spec.divisibility, 32);
    EXPECT_EQ(plan.family->base_model_version(r.config->model.arch), "chroma");
    EXPECT_EQ(plan.load.loading, model::TransformerLoading::on_device);
    EXPECT_EQ(model::text_encoders(plan.spec), std::vector<config::TextEncoderKind>{config::TextEncoderKind::t5_xxl});
    const auto storage = model::text_encoder_storage(r.config->model, plan.spec);
    ASSERT_EQ(storage.size(), 1u);
    EXPECT_TRUE(storage[0].has_value());  // T5 quantized, as model.qtype
    EXPECT_EQ(plan.family->shift_tokens(plan.spec, {1, 1, 1024, 1024}), 128 * 128);
    EXPECT_EQ(model::step_tokens(plan.spec, {1, 1, 1024, 1024}).image, 64 * 64);
    EXPECT_EQ(model::step_tokens(plan.spec, {1, 1, 1024, 1024}).text, 512);
    const auto cfg = plan.family->preview_guidance(plan.spec, true);
    EXPECT_TRUE(cfg->runs_cfg(4.0));
    EXPECT_FALSE(cfg->runs_cfg(1.00001));
    EXPECT_EQ(cfg->forward_batch(4.0), 1);
  }
  fs::remove_all(dir);
}

// FLUX.2 klein: the UI's flux2_klein_4b / _9b presets (options.tsx:1176-1206, 1226-1257; configs/aitk-ui/)
// resolve to BFL's klein transformers at diffusers' counts, Qwen3-4B / -8B quantized as qtype_te
// (flux2_klein_model.py:49-53), buckets of 16, quantized block by block and, under the UI's low_vram, on the
// device at first use; no reference tokens without control images, one raw reference's with a control_path.
// FLUX.2-dev as the UI sends it (options.tsx:626-657): Flux2Model's transformer, Mistral quantized under
// quantize_te as model.qtype (flux2_model.py:108-112), the guidance embedder trained at train.cfg_scale
// although the UI sends bypass_guidance_embedding: true (Flux2Model.get_noise_prediction has no such
// switch), previews with the scale embedded and no negative prompt.
TEST(AitkConfigs, Flux2DevTheUisPresetResolvesToDevWithItsGuidanceAndMistral) {
  namespace fs = std::filesystem;
  const fs::path dir = ui_dataset("aitk_flux2_dev");
  config::LoadOptions lo;
  lo.overrides = {"datasets.0.folder_path=" + dir.string(), "model.qtype=uint4", "model.qtype_te=qfloat8"};
  const auto r = model::load_config_file(std::string(GCLAB_SOURCE_DIR) + "/configs/aitk-ui/flux2.yaml", lo);
  ASSERT_TRUE(r.ok()) << r.diagnostics.all().front().format();
  const auto plan = train::plan_run(*r.config, train::PlanOptions{/*meta=*/true});
  EXPECT_EQ(plan.spec.preset, "flux2-dev");
  EXPECT_TRUE(plan.spec.guidance_embed);
  EXPECT_EQ(plan.spec.text_dim, 3 * 5120);
  EXPECT_EQ(plan.family->base_model_version(r.config->model.arch), "flux2");
  EXPECT_EQ(plan.load.loading, model::TransformerLoading::per_block);
  EXPECT_EQ(model::text_encoders(plan.spec), std::vector<config::TextEncoderKind>{config::TextEncoderKind::mistral3});
  const auto storage = model::text_encoder_storage(r.config->model, plan.spec);
  ASSERT_EQ(storage.size(), 1u);
  ASSERT_TRUE(storage[0].has_value());
  EXPECT_EQ(*storage[0], nn::WeightStorage::UInt4);  // model.qtype, not qtype_te
  // The UI's bypass_guidance_embedding: true is FLUX.1's switch; FLUX.2-dev trains its embedder at cfg_scale.
  EXPECT_TRUE(r.config->train.bypass_guidance_embedding);
  EXPECT_FALSE(model::training_bypasses_guidance(plan.spec, r.config->train));
  config::LoadOptions bypassed = lo;  // FLUX.1-dev's class reads it
  bypassed.overrides.push_back("train.bypass_guidance_embedding=true");
  const auto flux1 = model::load_config_file(std::string(GCLAB_SOURCE_DIR) + "/configs/aitk-ui/flux.yaml", bypassed);
  ASSERT_TRUE(flux1.ok());
  EXPECT_TRUE(model::training_bypasses_guidance(model::spec_for(flux1.config->model), flux1.config->train));
  const auto guidance = plan.family->preview_guidance(plan.spec, true);
  EXPECT_TRUE(guidance->embeds_scale());
  EXPECT_FALSE(guidance->runs_cfg(4.0));
  EXPECT_EQ(model::step_tokens(plan.spec, {1, 1, 1024, 1024}).text, 512);
  fs::remove_all(dir);
}

TEST(AitkConfigs, Flux2KleinTheUisPresetsResolveToKlein) {
  namespace fs = std::filesystem;
  const fs::path dir = ui_dataset("aitk_klein");
  for (const auto& [size, preset, count, width] :
       {std::tuple{"4b", "flux2-klein-4b", int64_t{3875544576}, int64_t{2560}},
        {"9b", "flux2-klein-9b", int64_t{9078581248}, int64_t{4096}}}) {
    SCOPED_TRACE(size);
    config::LoadOptions lo;
    lo.overrides = {"datasets.0.folder_path=" + dir.string()};
    const auto r =
        model::load_config_file(std::string(GCLAB_SOURCE_DIR) + "/configs/aitk-ui/flux2_klein_" + size + ".yaml", lo);
    ASSERT_TRUE(r.ok()) << r.diagnostics.all().front().format();
    const auto plan = train::plan_run(*r.config, train::PlanOptions{/*meta=*/true});
    EXPECT_EQ(plan.spec.preset, preset);
    EXPECT_EQ(model::parameter_count(*model::build_transformer(plan.spec, torch::TensorOptions().device(torch::kMeta))),
              count);
    EXPECT_EQ(plan.spec.divisibility, 16);
    EXPECT_EQ(plan.spec.text_dim, 3 * width);
    EXPECT_EQ(plan.family->base_model_version(r.config->model.arch), std::string("flux2_klein_") + size);
    EXPECT_EQ(plan.load.loading, model::TransformerLoading::per_block);
    EXPECT_TRUE(r.config->model.low_vram);
    const auto storage = model::text_encoder_storage(r.config->model, plan.spec);
    ASSERT_EQ(storage.size(), 1u);
    EXPECT_TRUE(storage[0].has_value());
    EXPECT_FALSE(plan.spec.reference_tokens);  // no control images: text-to-image
    EXPECT_EQ(model::step_tokens(plan.spec, {1, 1, 1024, 1024}).image, 64 * 64);
    EXPECT_EQ(model::step_tokens(plan.spec, {1, 1, 1024, 1024}).text, 512);
    auto with_controls = *r.config;
    with_controls.datasets[0].control_path = {dir.string()};
    const auto edit = train::plan_run(with_controls, train::PlanOptions{true});
    EXPECT_TRUE(edit.spec.reference_tokens);
    // A 1024² control image of a 1024² image: its own 4096 tokens beside the image's; a 1536² one capped at
    // 1024²; a 512² one kept at its size.
    EXPECT_EQ(model::step_tokens(edit.spec, {1, 1, 1024, 1024}).image, 2 * 64 * 64);
    EXPECT_EQ(model::step_tokens(edit.spec, {1, 1, 1536, 1536}).image, 96 * 96 + 64 * 64);
    EXPECT_EQ(model::step_tokens(edit.spec, {1, 1, 512, 512}).image, 2 * 32 * 32);
    EXPECT_FALSE(plan.family->preview_guidance(plan.spec, true)->one_batch());
  }
  fs::remove_all(dir);
}

// AI Toolkit's UI for Wan 2.1 I2V (ui/src/app/jobs/new/options.tsx:231-270 at 27a03a9: `wan21_i2v:14b480p`
// and `wan21_i2v:14b`, quantize and quantize_te on, timestep_type weighted, 41 frames at 16 fps, a ctrl_img
// per sample; the UI's datasets do not cache latents, jobConfig.ts:13): both tags resolve to the one I2V
// model, its exact count, CLIP ViT-H/14 beside it, and the plan conditions on the first frames.
TEST(AitkConfigs, Wan21I2vTheUisPresetsResolveToTheI2vModel) {
  namespace fs = std::filesystem;
  const fs::path dir = ui_dataset("aitk_wan21_i2v");
  for (const std::string arch : {"wan21_i2v:14b480p", "wan21_i2v:14b"}) {
    SCOPED_TRACE(arch);
    const std::string yaml = ui_job(
        "wan_i2v",
        "      datasets: [{folder_path: " + dir.string() +
            ", caption_ext: txt, cache_latents_to_disk: false, resolution: [512], num_frames: 41, fps: 16}]\n"
            "      train: {batch_size: 1, steps: 2000, gradient_checkpointing: true, noise_scheduler: flowmatch, "
            "timestep_type: weighted, optimizer: adamw8bit, lr: 1e-4, dtype: bf16}\n"
            "      model: {name_or_path: Wan-AI/Wan2.1-I2V-14B-480P-Diffusers, arch: '" +
            arch +
            "', quantize: true, quantize_te: true, low_vram: false}\n"
            "      sample: {sampler: flowmatch, sample_every: 250, width: 832, height: 480, num_frames: 41, fps: 16, "
            "samples: [{prompt: a woman waves, ctrl_img: " +
            (dir / "synth_0000.png").string() + "}]}\n");
    const auto r = model::load_config_text(yaml, "wan21_i2v.yaml");
    ASSERT_TRUE(r.ok()) << r.diagnostics.all().front().format();
    const auto plan = train::plan_run(*r.config, train::PlanOptions{/*meta=*/true});
    EXPECT_EQ(plan.spec.preset, "wan21-i2v-14b");
    EXPECT_EQ(plan.spec.condition_input_channels, 20);
    EXPECT_EQ(plan.spec.image_embed_tokens, 257);
    EXPECT_EQ(model::parameter_count(*model::build_transformer(plan.spec, torch::TensorOptions().device(torch::kMeta))),
              16394878784);
    ASSERT_TRUE(plan.first_frame.has_value());
    const auto conditioning = plan.family->frame_conditioning(plan.spec, *plan.first_frame);
    ASSERT_TRUE(conditioning && conditioning->image_encoder());
    EXPECT_EQ(model::parameter_count(*conditioning->image_encoder()), 630766080);  // ViT-H/14, bf16 on meta
    ASSERT_EQ(plan.preview_controls.size(), 1u);
    EXPECT_EQ(plan.preview_controls[0].size(), 1u);
  }
  // The name alone picks it, as AI Toolkit's UI does from its default repo.
  const auto guess = model::infer_arch_from_name("Wan-AI/Wan2.1-I2V-14B-720P-Diffusers");
  ASSERT_TRUE(guess.has_value());
  EXPECT_EQ(guess->arch, "wan21_i2v");
  fs::remove_all(dir);
}

// AI Toolkit's Wan 2.2 A14B example (config/examples/train_lora_wan22_14b_24gb.yaml at 27a03a9, its keys
// written here: uint4 with its accuracy recovery adapter, quantize_te qfloat8, low_vram, both experts,
// switch_boundary_every 10, adamw8bit, timestep_type linear, images of 512-1024) and its UI's presets
// (options.tsx:289-364: `wan22_14b:t2v` and `wan22_14b_i2v`, 41 frames at 16 fps, a ctrl_img for I2V): two
// experts of Wan 2.1 14B's shape, their exact count, the experts loaded in turn and brought to the device one
// at a time (low_vram), Wan 2.2's shift 5, the Wan 2.1 VAE, and `estimate` predicting the run on meta.
TEST(AitkConfigs, Wan22A14bTheExampleAndTheUisPresetsResolveToTheTwoExperts) {
  namespace fs = std::filesystem;
  const fs::path dir = ui_dataset("aitk_wan22_14b");
  const std::string example = ui_job(
      "my_first_wan22_14b_lora_v1",
      "      save: {dtype: float16, save_every: 250, max_step_saves_to_keep: 4}\n"
      "      datasets: [{folder_path: " +
          dir.string() +
          ", caption_ext: txt, caption_dropout_rate: 0.05, num_frames: 1, resolution: [512, 768, 1024]}]\n"
          "      train: {batch_size: 1, steps: 2000, gradient_accumulation: 1, train_unet: true, "
          "train_text_encoder: false, gradient_checkpointing: true, noise_scheduler: flowmatch, "
          "timestep_type: linear, optimizer: adamw8bit, lr: 1e-4, optimizer_params: {weight_decay: 1e-4}, "
          "dtype: bf16, switch_boundary_every: 10, cache_text_embeddings: true}\n"
          "      model: {name_or_path: ai-toolkit/Wan2.2-T2V-A14B-Diffusers-bf16, arch: wan22_14b, quantize: true, "
          "qtype: 'uint4|ostris/accuracy_recovery_adapters/wan22_14b_t2i_torchao_uint4.safetensors', "
          "quantize_te: true, qtype_te: qfloat8, low_vram: true, "
          "model_kwargs: {train_high_noise: true, train_low_noise: true}}\n"
          "      sample: {sampler: flowmatch, sample_every: 250, width: 1024, height: 1024, num_frames: 1, fps: 16, "
          "prompts: [a bear building a log cabin], neg: '', seed: 42, walk_seed: true, guidance_scale: 3.5, "
          "sample_steps: 25}\n");
  const auto r = model::load_config_text(example, "train_lora_wan22_14b_24gb.yaml");
  ASSERT_TRUE(r.ok()) << r.diagnostics.all().front().format();
  EXPECT_EQ(r.config->train.switch_boundary_every, 10);
  const auto plan = train::plan_run(*r.config, train::PlanOptions{/*meta=*/true});
  EXPECT_EQ(plan.spec.preset, "wan22-14b");
  EXPECT_EQ(plan.spec.expert_boundaries, (std::vector<double>{0.875, 0.0}));
  EXPECT_EQ(model::parameter_count(*model::build_transformer(plan.spec, torch::TensorOptions().device(torch::kMeta))),
            2 * int64_t{14288491584});
  EXPECT_EQ(plan.load.loading, model::TransformerLoading::experts_in_turn);
  EXPECT_TRUE(plan.load.at_first_use);  // low_vram: each expert in host memory until the forward that runs it
  EXPECT_DOUBLE_EQ(model::flow_schedule(plan.spec).shift, 5.0);
  EXPECT_EQ(std::string(vae::class_name(*plan.codec.autoencoder)), "AutoencoderKLWan");
  EXPECT_EQ(plan.spec.latent_channels, 16);
  EXPECT_EQ(plan.family->trained_experts(plan.spec, r.config->model.model_kwargs), (std::vector<size_t>{0, 1}));
  EXPECT_EQ(plan.family->base_model_version(r.config->model.arch), "wan_2.2_14b");
  // The estimate: under low_vram one expert's frozen weights on the device, the other's in host memory — the
  // two together what the device holds without low_vram.
  const train::MemoryEstimate low = train::estimate_memory(*r.config);
  config::ProcessConfig resident = *r.config;
  resident.model.low_vram = false;
  const train::MemoryEstimate both = train::estimate_memory(resident);
  EXPECT_GT(low.host_weight_bytes, both.weight_bytes / 3);
  EXPECT_EQ(low.weight_bytes + low.host_weight_bytes, both.weight_bytes);
  EXPECT_EQ(both.host_weight_bytes, 0);
  for (const std::string arch : {"wan22_14b:t2v", "wan22_14b_i2v"}) {
    SCOPED_TRACE(arch);
    const bool i2v = arch == "wan22_14b_i2v";
    const std::string yaml = ui_job(
        "wan22",
        "      datasets: [{folder_path: " + dir.string() +
            ", caption_ext: txt, cache_latents_to_disk: false, resolution: [512], num_frames: 41, fps: 16}]\n"
            "      train: {batch_size: 1, steps: 2000, gradient_checkpointing: true, noise_scheduler: flowmatch, "
            "timestep_type: linear, optimizer: adamw8bit, lr: 1e-4, dtype: bf16, switch_boundary_every: 1}\n"
            "      model: {name_or_path: ai-toolkit/Wan2.2-" +
            std::string(i2v ? "I2V" : "T2V") + "-A14B-Diffusers-bf16, arch: '" + arch +
            "', quantize: true, quantize_te: true, low_vram: true, model_kwargs: {train_high_noise: true, "
            "train_low_noise: true}}\n"
            "      sample: {sampler: flowmatch, sample_every: 250, width: 832, height: 480, num_frames: 41, fps: 16, "
            "samples: [{prompt: a woman waves, ctrl_img: " +
            (dir / "synth_0000.png").string() + "}]}\n");
    const auto ui = model::load_config_text(yaml, "wan22_14b.yaml");
    ASSERT_TRUE(ui.ok()) << ui.diagnostics.all().front().format();
    const auto p = train::plan_run(*ui.config, train::PlanOptions{/*meta=*/true});
    EXPECT_EQ(p.spec.preset, i2v ? "wan22-14b-i2v" : "wan22-14b");
    EXPECT_EQ(p.spec.condition_input_channels, i2v ? 20 : 0);
    EXPECT_EQ(p.spec.image_embed_dim, 0);  // Wan 2.2 I2V: no CLIP
    EXPECT_EQ(model::parameter_count(*model::build_transformer(p.spec, torch::TensorOptions().device(torch::kMeta))),
              2 * (i2v ? int64_t{14288901184} : int64_t{14288491584}));
    EXPECT_EQ(p.first_frame_in_steps, i2v);
    // The name alone picks the arch, as AI Toolkit's UI does from its default repo.
    const auto guess = model::infer_arch_from_name(*ui.config->model.name_or_path);
    ASSERT_TRUE(guess.has_value());
    EXPECT_EQ(guess->arch, i2v ? "wan22_14b_i2v" : "wan22_14b");
  }
  fs::remove_all(dir);
}

// AI Toolkit's UI for Wan 2.2 TI2V 5B (options.tsx:366-392 at 27a03a9: `wan22_5b`, quantize, quantize_te and
// low_vram on, 121 frames at 24 fps, 768², timestep_type weighted, the datasets' do_i2v on): the 5B, its exact
// count, the Wan 2.2 VAE, Wan 2.2's shift 5, buckets of 32, the embedders and proj_out left unquantized, and
// the steps conditioned on the first frames.
TEST(AitkConfigs, Wan22Ti2vTheUisPresetResolvesToThe5b) {
  namespace fs = std::filesystem;
  const fs::path dir = ui_dataset("aitk_wan22_5b");
  const std::string yaml = ui_job(
      "wan_5b",
      "      datasets: [{folder_path: " + dir.string() +
          ", caption_ext: txt, cache_latents_to_disk: false, resolution: [768], num_frames: 121, fps: 24, "
          "do_i2v: true}]\n"
          "      train: {batch_size: 1, steps: 2000, gradient_checkpointing: true, noise_scheduler: flowmatch, "
          "timestep_type: weighted, optimizer: adamw8bit, lr: 1e-4, dtype: bf16}\n"
          "      model: {name_or_path: Wan-AI/Wan2.2-TI2V-5B-Diffusers, arch: wan22_5b, quantize: true, "
          "quantize_te: true, low_vram: true}\n"
          "      sample: {sampler: flowmatch, sample_every: 250, width: 768, height: 768, num_frames: 121, fps: 24, "
          "prompts: [a woman waves]}\n");
  const auto r = model::load_config_text(yaml, "wan22_5b.yaml");
  ASSERT_TRUE(r.ok()) << r.diagnostics.all().front().format();
  EXPECT_TRUE(r.config->datasets.at(0).do_i2v);
  const auto plan = train::plan_run(*r.config, train::PlanOptions{/*meta=*/true});
  EXPECT_EQ(plan.spec.preset, "wan22-5b");
  EXPECT_EQ(model::parameter_count(*model::build_transformer(plan.spec, torch::TensorOptions().device(torch::kMeta))),
            4999787712);
  EXPECT_EQ(plan.spec.latent_channels, 48);
  EXPECT_EQ(plan.spec.latent_spatial, 16);
  EXPECT_EQ(plan.spec.divisibility, 32);
  EXPECT_DOUBLE_EQ(model::flow_schedule(plan.spec).shift, 5.0);
  EXPECT_EQ(std::string(vae::class_name(*plan.codec.autoencoder)), "AutoencoderKLWan");
  EXPECT_EQ(plan.codec.weight_bytes(), int64_t{704688668} * 2);
  const auto k = plan.family->quantization_filter(r.config->model);
  EXPECT_EQ(k.exclude, (std::vector<std::string>{"condition_embedder*", "proj_out*"}));
  EXPECT_TRUE(plan.first_frame_in_steps);
  EXPECT_TRUE(plan.first_frame_latents.empty());
  ASSERT_EQ(plan.preview_controls.size(), 1u);
  EXPECT_TRUE(plan.preview_controls[0].empty());  // its ctrl_img is optional
  // The UI's "Cache Latents" ticked: the clips' first frames' latents cached beside theirs, the steps' from there.
  config::ProcessConfig cached = *r.config;
  cached.datasets[0].cache_latents_to_disk = true;
  EXPECT_EQ(train::plan_run(cached, train::PlanOptions{/*meta=*/true}).first_frame_latents, (std::set<int>{0}));
  fs::remove_all(dir);
}

struct Refused {
  const char* file;
  const char* arch;
};

class UnmodelledArch : public ::testing::TestWithParam<Refused> {};

TEST_P(UnmodelledArch, IsRefusedWithTheArchitectureNamed) {
  const auto result = model::load_config_file(aitk(GetParam().file));
  EXPECT_FALSE(result.ok());
  EXPECT_TRUE(result.diagnostics.mentions(GetParam().arch)) << GetParam().file;
  EXPECT_TRUE(result.diagnostics.mentions("supported: flux"));
}

INSTANTIATE_TEST_SUITE_P(AitkConfigs, UnmodelledArch,
                         ::testing::Values(Refused{"train_lora_lumina.yaml", "lumina2"},
                                           // also has an unclosed quote on line 64: both are said
                                           Refused{"train_lora_omnigen2_24gb.yaml", "omnigen2"}),
                         [](const ::testing::TestParamInfo<Refused>& info) { return std::string(info.param.arch); });

TEST(AitkConfigs, BrokenYamlPointsAtTheLine) {
  const auto result = model::load_config_file(aitk("train_lora_omnigen2_24gb.yaml"));
  EXPECT_TRUE(result.diagnostics.mentions("not valid YAML"));
  EXPECT_TRUE(result.diagnostics.mentions("train_lora_omnigen2_24gb.yaml:6"));  // line 64/65
}

// Every config that loads — AI Toolkit's examples and jobs in the shape its web UI writes (configs/aitk-ui,
// one per modelled family) — resolves to its model's preset, with that model's exact parameter count.
TEST(AitkConfigs, EveryConfigResolvesToItsModelWithItsExactParameterCount) {
  struct Expected {
    const char* file;
    const char* preset;
    int64_t parameters;
  };
  const std::string shared = std::string(GCLAB_SHARED_DIR) + "/aitk-configs/",
                    ui = std::string(GCLAB_SOURCE_DIR) + "/configs/aitk-ui/";
  const int64_t flux_dev = 11901408320, flex1 = 8163264064, flex2 = flex1 + (196 - 64) * 3072, qwen = 20430401088;
  const Expected expected[] = {
      {"train_lora_flux_24gb.yaml", "flux-dev", flux_dev},
      {"train_lora_flux_schnell_24gb.yaml", "flux-schnell", flux_dev - 10229760},  // no guidance embedder
      {"train_lora_flex_24gb.yaml", "flex1", flex1},  // is_flux + Flex.1-alpha: 8 double blocks
      {"train_lora_flex2_24gb.yaml", "flex2", flex2},
      {"train_lora_qwen_image_24gb.yaml", "qwen-image", qwen},
      {"train_lora_qwen_image_edit_32gb.yaml", "qwen-image-edit", qwen},
      {"train_lora_qwen_image_edit_2509_32gb.yaml", "qwen-image-edit-2509", qwen},
      {"train_lora_wan21_1b_24gb.yaml", "wan21-1.3b", 1418996800},  // the 1.3B by its name_or_path
      {"ui:flux.yaml", "flux-dev", flux_dev},
      {"ui:flex1.yaml", "flex1", flex1},
      {"ui:flex2.yaml", "flex2", flex2},
      {"ui:qwen_image.yaml", "qwen-image", qwen},
      {"ui:qwen_image_edit.yaml", "qwen-image-edit", qwen},
      {"ui:qwen_image_edit_plus.yaml", "qwen-image-edit-2509", qwen},
      {"ui:qwen_image_edit_plus_2511.yaml", "qwen-image-edit-2511", qwen},  // the tag chooses 2511 (zero_cond_t)
      {"ui:zimage_turbo.yaml", "zimage-turbo", 6154908736},
      {"ui:chroma.yaml", "chroma", 8899983424},
      {"ui:flux2.yaml", "flux2-dev", 32223281152},
      {"ui:flux2_klein_4b.yaml", "flux2-klein-4b", 3875544576},
      {"ui:flux2_klein_9b.yaml", "flux2-klein-9b", 9078581248},
  };
  for (const auto& e : expected) {
    const std::string file = e.file;
    const std::string path = file.rfind("ui:", 0) == 0 ? ui + file.substr(3) : shared + file;
    const auto r = model::load_config_file(path);
    ASSERT_TRUE(r.ok()) << path << ": " << r.diagnostics.all().front().format();
    const auto summary = model::summarize_model(*r.config);
    EXPECT_EQ(summary.spec.preset, e.preset) << path;
    EXPECT_EQ(summary.parameters, e.parameters) << path;
  }
  int ui_configs = 0;
  for (const auto& entry : std::filesystem::directory_iterator(ui)) ui_configs += entry.path().extension() == ".yaml";
  EXPECT_EQ(ui_configs, 12);  // every UI-shaped config is in the table above
}

TEST(AitkConfigs, EveryExampleEitherLoadsOrIsRefusedCleanly) {
  int loaded = 0, refused = 0;
  for (const auto& entry : std::filesystem::directory_iterator(std::string(GCLAB_SHARED_DIR) + "/aitk-configs")) {
    if (entry.path().extension() != ".yaml") continue;
    const auto result = model::load_config_file(entry.path().string());
    if (result.ok()) {
      ++loaded;
      // Resolved output reads back to the same resolved output.
      const auto again = model::load_config_text(to_yaml(*result.config), "resolved");
      ASSERT_TRUE(again.ok()) << entry.path();
      EXPECT_EQ(to_yaml(*again.config), to_yaml(*result.config)) << entry.path();
    } else {
      ++refused;
      EXPECT_TRUE(result.diagnostics.mentions("not modelled by gclab") ||
                  result.diagnostics.mentions("does not model yet"))
          << entry.path();
    }
  }
  EXPECT_EQ(loaded, 8);
  EXPECT_EQ(refused, 2);
}

}  // namespace
}  // namespace gclab::config
