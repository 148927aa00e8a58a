// The flow-matching objective (docs/training.md): x_t = (1 - t) x0 + t noise, the model predicts the
// velocity noise - x0, mean squared (or absolute: loss_type mae) error, weighted per sample (timesteps and weights:
// train/timesteps.h).
#pragma once

#include <torch/types.h>

#include <string>

#include "gclab/config/choices.h"
#include "gclab/model/transformer.h"

namespace gclab::train {

// One micro-batch: clean latents, the noise and timesteps drawn for them, and the conditioning.
struct MicroBatch {
  torch::Tensor x0, noise, t;
  torch::Tensor weight;  // per-sample loss weights (train/timesteps.h); undefined: all 1
  // Per-element loss weights from the loss masks (loss_mask_multiplier), as x0; undefined: none.
  torch::Tensor loss_mask;
  // timestep_type next_sample (SDTrainer's next_sample branch): a no-grad prediction at t steps x_t to next_t
  // (Euler), the noise that step implies becomes the target's, and the loss trains at next_t.
  torch::Tensor next_t;
  model::ModelInputs conditioning;  // text, pooled, guidance, class_labels (latents/timestep are set here)
};

struct StepOptions {
  config::LossType loss_type = config::LossType::mse;
  double loss_scale = 1.0;  // applied to the loss before backward
  // The model's compute dtype (train.dtype). AI Toolkit runs no autocast (its Accelerator has no
  // mixed_precision): the latents and noise in this dtype, the noisy latents made in float32 and cast to it,
  // the text embeddings cast to it, the loss in float32 (BaseSDTrainProcess.py:1106, 1327; SDTrainer.py:646,
  // 916; stable_diffusion_model.py predict_noise).
  torch::ScalarType dtype = torch::kFloat;
};

// SDTrainer's mask_multiplier (SDTrainer.py:1484-1504) from the batch's loss masks ([B, 1, H, W] on the
// device): in float16 brought to the latents' size (nearest), expanded over their channels, cast to `dtype`
// and divided by its mean.
torch::Tensor loss_mask_multiplier(const torch::Tensor& masks, const torch::Tensor& x0, torch::ScalarType dtype);

// The micro-batch's loss (forward only; call backward on it). loss_scale is not applied.
torch::Tensor flow_matching_loss(model::DiffusionTransformer& model, const MicroBatch& batch,
                                 const StepOptions& options);
// Forward and backward of one micro-batch; gradients accumulate into the parameters. Returns the loss
// (before loss_scale).
double flow_matching_step(model::DiffusionTransformer& model, const MicroBatch& batch, const StepOptions& options);

}  // namespace gclab::train
