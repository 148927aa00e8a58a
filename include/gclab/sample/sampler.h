// Sampling previews during training: the Euler integrator of the flow from noise (t = 1) to data
// (t = 0), with guidance as each family does it.
#pragma once

#include <torch/types.h>

#include "gclab/model/transformer.h"

namespace gclab::sample {

struct SampleOptions {
  int64_t height = 256, width = 256;  // the preview's pixels (the latents: the family's latent_shape)
  int64_t frames = 1;                 // a video family's frames
  int steps = 20;
  double guidance_scale = 4.0;
  int64_t seed = 42;           // noise from its own generator: sampling never moves the training RNG
  bool autocast_bf16 = false;  // run the model under bf16 autocast, as the training step does
};

// `cond` and `uncond` hold one sample's conditioning (text, pooled, class_labels); uncond is used for CFG.
// Returns the final latents, one sample of the family's latent_shape.
torch::Tensor euler_sample(model::DiffusionTransformer& model, const model::ModelInputs& cond,
                           const model::ModelInputs& uncond, const SampleOptions& options);

}  // namespace gclab::sample
