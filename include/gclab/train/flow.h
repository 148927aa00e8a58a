// The flow-matching objective (DESIGN.md section 6): x_t = (1 - t) x0 + t noise, the model predicts the
// velocity noise - x0, mean squared error. Timesteps as AI Toolkit's `timestep_type` samples them.
#pragma once

#include <torch/torch.h>

#include <string>

#include "gclab/config/choices.h"
#include "gclab/model/transformer.h"

namespace gclab::train {

// t in (0, 1) per sample, drawn from the global generator:
//   sigmoid  sigmoid(N(0, 1))                        (logit-normal, SD3's default)
//   linear   U(0, 1)
//   shift    U(0, 1) shifted by 3: 3t / (1 + 2t)      (more weight on high noise, FLUX-style)
//   weighted U(0, 1), the loss weighted by a bell around t = 0.5 (mean weight 1)
//   flux_shift, lumina2_shift  U(0, 1) through FLUX's resolution-dependent shift, as AI Toolkit's flow-match
//            scheduler does with its FLUX config (use_dynamic_shifting): mu = 0.5 + (tokens - 256) *
//            (1.15 - 0.5) / (4096 - 256), t' = e^mu / (e^mu + 1/t - 1); `image_tokens` is the batch's
//   lognorm_blend  AI Toolkit's pool of 1000: 750 draws of 1 - x / max(x), x ~ LogNormal(0, 0.333), and 250
//            evenly spaced, one picked at random per sample
torch::Tensor sample_timesteps(config::TimestepType type, int64_t batch, const torch::Device& device,
                               int64_t image_tokens = 4096);
torch::Tensor timestep_weights(config::TimestepType type, const torch::Tensor& t);

// One micro-batch: clean latents, the noise and timesteps drawn for them, and the conditioning.
struct MicroBatch {
  torch::Tensor x0, noise, t;
  model::ModelInputs conditioning;  // text, pooled, guidance, class_labels (latents/timestep are set here)
};

struct StepOptions {
  config::TimestepType timestep_type = config::TimestepType::sigmoid;
  double loss_scale = 1.0;  // 1 / gradient accumulation
  bool autocast_bf16 = false;
};

// The micro-batch's loss (forward only; call backward on it). loss_scale is not applied.
torch::Tensor flow_matching_loss(model::DiffusionTransformer& model, const MicroBatch& batch,
                                 const StepOptions& options);
// Forward and backward of one micro-batch; gradients accumulate into the parameters. Returns the loss
// (before loss_scale).
double flow_matching_step(model::DiffusionTransformer& model, const MicroBatch& batch, const StepOptions& options);

}  // namespace gclab::train
