// A family that lives in the test tree (tests/families/toy/, registered by its own last line) is a family
// like the shipped ones: config validation knows its arch, and the run — data, text encoder, checkpoint
// policy, LoRA, previews, saves, estimate — works on it with nothing in src/ naming it (issue 30).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>

#include "../support/test_util.h"
#include "gclab/config/loader.h"
#include "gclab/data/synth.h"
#include "gclab/io/safetensors.h"
#include "gclab/model/registry.h"
#include "gclab/train/checkpointing.h"
#include "gclab/train/predict.h"
#include "gclab/train/session.h"
#include "gclab/train/trainer.h"

namespace fs = std::filesystem;

namespace gclab {
namespace {

config::ProcessConfig toy_config(const fs::path& dir, const std::string& name, std::vector<std::string> extra = {}) {
  if (!fs::exists(dir / "data")) {
    data::SynthOptions o;
    o.count = 4;
    o.sizes = {{64, 64}, {80, 64}};
    data::write_synthetic_dataset(dir / "data", o);
  }
  const std::string yaml = "name: " + name + "\ntraining_folder: " + dir.string() +
                           "\ndevice: cpu\ntraining_seed: 5\n"
                           "save: {dtype: float32, save_every: 1000}\n"
                           "datasets:\n  - folder_path: " +
                           (dir / "data").string() +
                           "\n    resolution: [64]\n"
                           "train: {batch_size: 2, steps: 4, lr: 1e-3, optimizer: adamw, dtype: fp32, "
                           "gradient_checkpointing: true, skip_first_sample: true}\n"
                           "sample: {sample_every: 1000, width: 64, height: 64, sample_steps: 2, guidance_scale: 2, "
                           "prompts: [a red circle], format: png}\n"
                           "model: {arch: tiny-toy}\n";
  config::LoadOptions options;
  options.overrides = std::move(extra);
  auto r = model::load_config_text(yaml, "toy.yaml", options);
  if (!r.ok()) throw std::runtime_error("toy config refused: " + r.diagnostics.all().front().format());
  return *r.config;
}

TEST(FamilyFolder, TheTestTreesFamilyIsRegisteredBesideTheShippedOnes) {
  const model::ArchFacts* arch = model::find_arch("tiny-toy");
  ASSERT_NE(arch, nullptr) << model::supported_arch_list();
  EXPECT_EQ(arch->family, model::Family("toy"));
  const auto& all = model::families();
  const auto toy = std::find_if(all.begin(), all.end(), [](const auto* f) { return f->id() == model::Family("toy"); });
  ASSERT_NE(toy, all.end());
  EXPECT_EQ(&model::family_of(model::Family("toy")), *toy);
  const auto flux =
      std::find_if(all.begin(), all.end(), [](const auto* f) { return f->id() == model::Family("flux"); });
  EXPECT_LT(flux, toy) << "after the shipped families";
  EXPECT_NE(model::find_arch("tiny-flux"), nullptr);  // the shipped ones still there
  EXPECT_THROW(model::register_family(*model::families().back()), std::logic_error);
  const model::ModelSpec spec = model::spec_by_preset("tiny-toy");
  EXPECT_EQ(spec.family, model::Family("toy"));
  EXPECT_EQ(model::family_of(spec.family).describe_blocks(spec), "3 toy");
  // Its names in a name_or_path pick its arch, as the shipped families' do; AI Toolkit's unmodelled ones
  // are still told apart.
  EXPECT_EQ(model::infer_arch_from_name("someone/Toy-Image-1.0")->arch, "tiny-toy");
  EXPECT_EQ(model::infer_arch_from_name("black-forest-labs/FLUX.1-dev")->arch, "flux");
  EXPECT_EQ(model::infer_arch_from_name("Qwen/Qwen-Image-Edit-2509")->arch, "qwen_image_edit_plus");
  EXPECT_EQ(model::infer_arch_from_name("Wan-AI/Wan2.1-T2V-1.3B")->arch, "wan21");
  auto r = model::load_config_text(
      "name: t\ndevice: cpu\ndatasets: [{folder_path: /tmp}]\nmodel: {name_or_path: someone/Toy-Image}\n", "t.yaml");
  ASSERT_TRUE(r.ok()) << r.diagnostics.all().front().format();
  EXPECT_EQ(r.config->model.arch, "tiny-toy");
}

// The run's generic parts on the new family: a full fine-tune trains (checkpointing changes nothing, to
// the bit), a preview and the weights are written, and the weights hold the family's own tensors.
TEST(FamilyFolder, ItTrainsPreviewsAndSavesWithCheckpointingExact) {
  const fs::path dir = testing::fresh_dir("toy_family");
  const train::TrainSummary on = train::train(toy_config(dir, "on"), {});
  const train::TrainSummary off = train::train(toy_config(dir, "off", {"train.gradient_checkpointing=false"}), {});
  ASSERT_EQ(on.losses.size(), 4u);
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_TRUE(std::isfinite(on.losses[i]));
    EXPECT_EQ(on.losses[i], off.losses[i]) << "step " << i + 1;
  }
  ASSERT_EQ(on.samples.size(), 1u);
  EXPECT_GT(fs::file_size(on.samples[0]), 100u);
  const auto saved = io::SafetensorsFile::open(dir / "on" / "on.safetensors");
  EXPECT_TRUE(saved.contains("text_proj.weight"));
  EXPECT_TRUE(saved.contains("blocks.2.ff.net.2.weight"));
  // Trained: the saved weights moved from the seed's.
  torch::manual_seed(5);
  const auto fresh = model::build_transformer(model::spec_by_preset("tiny-toy"));
  EXPECT_FALSE(torch::equal(saved.tensor("text_proj.weight"), fresh->named_parameters()["text_proj.weight"]));
  fs::remove_all(dir);
}

// A LoRA on its Linears, and the estimate's walk of its blocks: what they keep, walked on the meta device,
// is what a probe forward measures — with no ledger written for them.
TEST(FamilyFolder, ItTakesALoraAndItsEstimateSeesItsBlocks) {
  const fs::path dir = testing::fresh_dir("toy_family_lora");
  const config::ProcessConfig c = toy_config(dir, "lora", {"network.type=lora", "network.linear=4"});
  {
    train::Session session(c, train::SessionOptions{/*meta=*/true});
    EXPECT_GT(session.lora_modules(), 3 * 6);  // to_q/k/v/out, net.0, net.2 (and adaLN) in each of 3 blocks
  }
  for (const auto& extra : std::vector<std::vector<std::string>>{{}, {"network.type=lora", "network.linear=4"}}) {
    train::Session session(toy_config(dir, "probe", extra));
    const auto [measured, walked] = session.probe_block_activations();
    EXPECT_GT(measured.total_off_bytes, 0);
    EXPECT_EQ(walked.total_off_bytes, measured.total_off_bytes);
  }
  const train::MemoryEstimate e = train::estimate_memory(c);
  ASSERT_EQ(e.resolutions.size(), 1u);
  EXPECT_EQ(e.resolutions[0].resolution, 64);
  EXPECT_GT(e.resolutions[0].gc_off.activation_bytes, e.resolutions[0].gc_full.activation_bytes);
  const train::TrainSummary run = train::train(c, {});
  EXPECT_EQ(run.losses.size(), 4u);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace gclab
