// Flex.2's training inputs beside the latents (flex2_condition.cpp): an inpainting latent, its mask and a
// control latent, [B, 2C + 1, h, w] for clean latents [B, C, h, w].
#pragma once

#include <torch/torch.h>

#include <vector>

#include "gclab/config/config.h"

namespace gclab::model::flux {

// AI Toolkit's Flex2.condition_noisy_latents for a batch with clean latents `x0` (in the compute dtype), the
// encoded latents of its control images, one per control folder (empty: none), and its inpainting mask
// `keep` ([B, 1, H, W] at the image's size, 1 where the image is kept; undefined: none), under model_kwargs `k`.
torch::Tensor flex2_condition(const config::ModelKwargs& k, const torch::Tensor& x0,
                              const std::vector<torch::Tensor>& controls, const torch::Tensor& keep);

}  // namespace gclab::model::flux
