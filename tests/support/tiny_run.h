// The tiny training run the train tests share: a LoRA (rank 4) on tiny-flux over six synthetic 64x64 and
// 96x64 captioned images, 20 steps; `extra` overrides by path (--set syntax), e.g. {"device=cuda"}.
#pragma once

#include <filesystem>
#include <stdexcept>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "gclab/data/synth.h"
#include "gclab/model/family.h"

namespace gclab::testing {

inline config::ProcessConfig tiny_config(const std::filesystem::path& dir, const std::string& name,
                                         std::vector<std::string> extra = {}) {
  if (!std::filesystem::exists(dir / "data")) {
    data::SynthOptions o;
    o.count = 6;
    o.sizes = {{64, 64}, {96, 64}};
    data::write_synthetic_dataset(dir / "data", o);
  }
  const std::string yaml = "name: " + name + "\ntraining_folder: " + dir.string() +
                           "\ndevice: cpu\ntraining_seed: 7\n"
                           "network: {type: lora, linear: 4, linear_alpha: 4}\n"
                           "save: {dtype: float32, save_every: 1000, max_step_saves_to_keep: 3}\n"
                           "datasets:\n  - folder_path: " +
                           (dir / "data").string() +
                           "\n    caption_dropout_rate: 0.2\n    resolution: [64]\n"
                           "train: {batch_size: 2, steps: 20, lr: 1e-3, optimizer: adamw, dtype: fp32, "
                           "gradient_checkpointing: true, skip_first_sample: true}\n"
                           "model: {arch: tiny-flux}\n";
  config::LoadOptions options;
  options.overrides = std::move(extra);
  auto r = model::load_config_text(yaml, "test.yaml", options);
  if (!r.ok()) throw std::runtime_error("test config refused: " + r.diagnostics.all().front().format());
  return *r.config;
}

// Two runs' losses, step for step: `steps` of each, bitwise equal.
inline void expect_same_losses(const std::vector<double>& a, const std::vector<double>& b, size_t steps) {
  ASSERT_EQ(a.size(), steps);
  ASSERT_EQ(b.size(), steps);
  for (size_t i = 0; i < steps; ++i) EXPECT_EQ(a[i], b[i]) << "step " << i + 1;
}

}  // namespace gclab::testing
