// The model a training run (or a bench) trains, built the way AI Toolkit loads it: with a LoRA network in
// bf16, the frozen base is stored in bf16 (float8 blocks with model.quantize) and only the adapters are
// float32; without a network every weight is a float32 master copy.
#pragma once

#include <memory>

#include "gclab/config/config.h"
#include "gclab/model/lora.h"

namespace gclab::train {

struct TrainingModel {
  std::shared_ptr<model::DiffusionTransformer> model;
  model::LoraOptions lora;
  int lora_modules = 0;
};

// Builds from the current global seed, on `device`, in training mode.
TrainingModel build_training_model(const config::ProcessConfig& config, const model::ModelSpec& spec,
                                   const torch::Device& device);

}  // namespace gclab::train
