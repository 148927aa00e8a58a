#include "gclab/train/model_setup.h"

namespace gclab::train {

TrainingModel build_training_model(const config::ProcessConfig& config, const model::ModelSpec& spec,
                                   const torch::Device& device) {
  TrainingModel t;
  t.model = model::build_transformer(spec);
  if (config.network) {
    t.lora.rank = config.network->linear.value_or(16);
    t.lora.alpha = config.network->linear_alpha.value_or(static_cast<double>(t.lora.rank));
    t.lora.dropout = config.network->dropout.value_or(0.0);
    if (config.train.dtype == "bf16") t.model->to(torch::kBFloat16);  // the frozen base, as AI Toolkit loads it
  }
  if (config.model.quantize) model::set_base_weight_storage(*t.model, model::WeightStorage::Float8PerTensor);
  if (config.network) t.lora_modules = model::apply_lora(*t.model, t.lora);  // float32 adapters
  t.model->to(device);
  t.model->train();
  return t;
}

}  // namespace gclab::train
