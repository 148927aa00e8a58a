// gclab's C++ transformers against a Python reference of the same architectures
// (tests/reference/dit_models.py, written from diffusers / DiT in plain PyTorch), from identical weights
// and inputs exchanged as safetensors: `gclab forward` (the CLI, as a user runs it) must give the
// reference's prediction within 1e-5, and gradients taken through gclab's checkpoint wrapper must equal
// the reference's plain autograd gradients.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "../support/test_util.h"
#include "gclab/io/safetensors.h"
#include "gclab/model/forward.h"
#include "gclab/model/lora.h"
#include "gclab/train/checkpointing.h"

namespace fs = std::filesystem;

namespace gclab::model {
namespace {

int run(const std::string& command) { return std::system((command + " > /dev/null").c_str()); }

double max_rel(const torch::Tensor& a, const torch::Tensor& b) {
  return ((a - b).abs().max() / b.abs().max().clamp_min(1e-30)).item<double>();
}

class ReferenceParity : public ::testing::TestWithParam<std::string> {};

TEST_P(ReferenceParity, ForwardAndCheckpointedGradientsMatchThePythonReference) {
  const std::string preset = GetParam();
  const fs::path dir = fs::temp_directory_path() / ("gclab_parity_" + preset + "_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);

  torch::manual_seed(3);
  const ModelSpec spec = spec_by_preset(preset);
  auto model = build_transformer(spec);
  ModelInputs in =
      model->example_inputs({2, 1, 128, 96}, spec.family == model::Family("zimage") ? 20 : 0);  // Z-Image pads 20 to 32
  if (spec.family == model::Family("qwen_image"))
    in.reference_latents = {torch::randn({2, spec.latent_channels, 8, 8})};
  io::save_safetensors(dir / "weights.safetensors", weights_state(*model, torch::kFloat), spec_metadata(spec));
  io::save_safetensors(dir / "inputs.safetensors", model_inputs_state(in));
  std::ofstream(dir / "config.yaml") << "job: extension\nconfig:\n  name: parity\n  process:\n"
                                     << "    - type: sd_trainer\n      device: cpu\n      model:\n        arch: "
                                     << preset << "\n";

  const std::string gclab = std::string("\"") + GCLAB_EXE + "\"";
  ASSERT_EQ(run(gclab + " forward \"" + (dir / "config.yaml").string() + "\" --weights \"" +
                (dir / "weights.safetensors").string() + "\" --inputs \"" + (dir / "inputs.safetensors").string() +
                "\" --out \"" + (dir / "cpp.safetensors").string() + "\""),
            0);
  ASSERT_EQ(run(std::string("\"") + GCLAB_PYTHON + "\" \"" + GCLAB_SOURCE_DIR +
                "/tests/reference/dit_models.py\" forward \"" + (dir / "weights.safetensors").string() + "\" \"" +
                (dir / "inputs.safetensors").string() + "\" \"" + (dir / "python.safetensors").string() + "\" --grads"),
            0);
  const auto cpp = io::SafetensorsFile::open(dir / "cpp.safetensors");
  const auto py = io::SafetensorsFile::open(dir / "python.safetensors");
  const torch::Tensor ours = cpp.tensor("prediction"), ref = py.tensor("prediction");
  ASSERT_EQ(ours.sizes(), ref.sizes());
  EXPECT_TRUE(torch::allclose(ours, ref, 1e-5, 1e-5)) << "max |diff| " << (ours - ref).abs().max().item<double>();

  // Gradients of mean(prediction^2), every block checkpointed, against the reference's plain autograd.
  train::ModelCheckpointing ckpt(*model);
  ckpt.apply(ckpt::CheckpointPolicy::parse("full"));
  model->forward(in).pow(2).mean().backward();
  int compared = 0;
  for (const auto& p : model->named_parameters()) {
    const std::string name = "grad." + p.key();
    ASSERT_TRUE(py.contains(name)) << name;
    const torch::Tensor g = p.value().grad().defined() ? p.value().grad() : torch::zeros_like(p.value());
    const torch::Tensor r = py.tensor(name);
    if (r.abs().max().item<double>() == 0.0) {
      EXPECT_EQ(g.abs().max().item<double>(), 0.0) << name;
      continue;
    }
    EXPECT_LT(max_rel(g, r), 1e-4) << name;
    ++compared;
  }
  EXPECT_GT(compared, 10);
  fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(TinyPresets, ReferenceParity,
                         ::testing::Values("tiny-flux", "tiny-qwen-image", "tiny-zimage", "tiny-sd3", "tiny-dit"),
                         [](const auto& info) { return gclab::testing::test_name(info.param); });

}  // namespace
}  // namespace gclab::model
