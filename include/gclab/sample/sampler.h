// Sampling previews during training: the Euler integrator of the flow from noise (t = 1) to data
// (t = 0), with guidance as each family does it.
#pragma once

#include <torch/types.h>

#include <memory>

#include "gclab/model/guidance.h"
#include "gclab/model/transformer.h"

namespace gclab::sample {

struct SampleOptions {
  int64_t height = 256, width = 256;  // the preview's pixels (the latents: the family's latent_shape)
  int64_t frames = 1;                 // a video family's frames
  int steps = 20;
  double guidance_scale = 4.0;
  int64_t seed = 42;  // noise from its own generator: sampling never moves the training RNG
  // The model's compute dtype (train.dtype): the latents between steps and the model's inputs are in it, as
  // AI Toolkit's pipelines keep them; no autocast.
  torch::ScalarType dtype = torch::kFloat;
  // The family's guidance rule (the family's preview_guidance in model/registry.h with sample.do_cfg_norm); unset: the
  // family's with do_cfg_norm on.
  std::shared_ptr<const model::Guidance> guidance;
};

// `cond` and `uncond` hold one sample's conditioning (text, pooled, class_labels); uncond is used for CFG.
// Returns the final latents (float32), one sample of the family's latent_shape.
torch::Tensor euler_sample(model::DiffusionTransformer& model, const model::ModelInputs& cond,
                           const model::ModelInputs& uncond, const SampleOptions& options);

}  // namespace gclab::sample
