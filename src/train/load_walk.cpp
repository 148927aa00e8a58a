#include "gclab/model/quantize.h"
#include "gclab/train/loading.h"
#include "gclab/train/offload.h"

namespace gclab::train {

LoadMemory predict_load(const RunPlan& plan) {
  const config::ModelConfig& m = plan.config.model;
  const torch::Device meta(torch::kMeta);
  LoadMemory load;
  load.quantized_on_host = plan.load.quantized_on_host;
  const Residence built_in = load.quantized_on_host ? Residence::host : Residence::device;
  auto model = plan.family->build_transformer(plan.spec, torch::TensorOptions().device(meta).dtype(plan.base_dtype));
  if (plan.load.staged) load.staged(largest_parameter_bytes(*model));
  load.built(built_in, nn::module_bytes(*model));
  if (m.quantize) load.quantized(built_in, model::quantize_base(*model, m).memory);
  const int64_t transformer_bytes = nn::module_bytes(*model);
  model.reset();
  auto transformer_to_device = [&] {
    if (load.quantized_on_host) load.moved(Residence::device, transformer_bytes);
  };
  if (!plan.load.after_text_encoders) transformer_to_device();

  text::PromptEncoderOptions o = plan.prompts;
  o.options = o.options.device(meta);
  text::PromptEncoder prompts(o);
  for (const auto& step : prompts.load_steps()) {
    load.built(Residence::device, step.built_bytes);
    load.quantized(Residence::device, step.quantized);
  }
  if (m.layer_offloading && m.layer_offloading_text_encoder_percent > 0)
    for (size_t i = 0; i < prompts.slots(); ++i)
      load.moved(Residence::host, offload_layers(prompts.encoder(i), m.layer_offloading_text_encoder_percent,
                                                 plan.seed + 1 + i, meta, nn::make_offload_rings())
                                      .host_bytes);
  load.at_first_use = plan.load.at_first_use && load.quantized_on_host;
  if (plan.load.after_text_encoders && !load.at_first_use) transformer_to_device();
  return load;
}

}  // namespace gclab::train
