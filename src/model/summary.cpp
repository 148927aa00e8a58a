#include "gclab/model/summary.h"

#include "gclab/data/dataset.h"

#include "gclab/model/lora.h"
#include "gclab/model/quantize.h"

namespace gclab::model {

ModelSummary summarize_model(const config::ProcessConfig& config) {
  ModelSummary s;
  s.spec = spec_for(config);
  const auto local = local_model(config.model);
  s.weights_from = local && !local->weights.empty() ? local->weights.string()
                   : local                          ? "random: " + local->config.string() + " has no weights beside it"
                   : config.model.name_or_path      ? "random: name_or_path is not a local folder (the preset's shape)"
                                                    : "random (the preset's shape)";
  // Base weights in bf16, as AI Toolkit loads these models, quantized as model.qtype asks.
  auto model = build_transformer(s.spec, torch::TensorOptions().device(torch::kMeta).dtype(torch::kBFloat16));
  s.parameters = parameter_count(*model);
  s.weight_storage = "bf16";
  if (config.model.quantize) s.weight_storage = describe(quantize_base(*model, config.model), config.model);
  s.weight_bytes = nn::module_bytes(*model);
  if (config.network) {
    s.lora_modules = apply_lora(*model, lora_options(*config.network));
    s.trainable_parameters = trainable_parameter_count(*model);
  } else {
    s.trainable_parameters = s.parameters;
  }
  const int64_t prompt_tokens = kNominalCaptionTokens;
  const int controls = s.spec.reference_tokens ? 1 : 0;
  for (size_t d = 0; d < config.datasets.size(); ++d) {
    const auto& dataset = config.datasets[d];  // auto_frame_count: its longest clip
    const int frames = data::most_frames(dataset, static_cast<int>(d), static_cast<int>(s.spec.latent_temporal))
                           .value_or(dataset.num_frames);
    for (int r : dataset.resolution)
      s.tokens.push_back({"datasets[" + std::to_string(d) + "]", r, r, image_tokens(s.spec, {1, frames, r, r}),
                          text_tokens(s.spec, prompt_tokens), reference_tokens(s.spec, controls, r, r)});
  }
  if (config.sample)
    s.tokens.push_back(
        {"sample", config.sample->width, config.sample->height,
         image_tokens(s.spec, {1, config.sample->num_frames, config.sample->height, config.sample->width}),
         text_tokens(s.spec, prompt_tokens),
         preview_reference_tokens(s.spec, controls, config.sample->height, config.sample->width)});
  return s;
}

}  // namespace gclab::model
