// Flex.2's training inputs beside the latents (flex2_condition.cpp): an inpainting latent, its mask and a
// control latent, [B, 2C + 1, h, w] for clean latents [B, C, h, w].
#pragma once

#include <torch/torch.h>

#include <filesystem>
#include <functional>
#include <vector>

#include "gclab/config/config.h"

namespace gclab::model::flux {

// AI Toolkit's Flex2.condition_noisy_latents for a batch with clean latents `x0` (in the compute dtype), the
// encoded latents of its control images, one per control folder (empty: none), and its inpainting mask
// `keep` ([B, 1, H, W] at the image's size, 1 where the image is kept; undefined: none), under model_kwargs `k`.
torch::Tensor flex2_condition(const config::ModelKwargs& k, const torch::Tensor& x0,
                              const std::vector<torch::Tensor>& controls, const torch::Tensor& keep);

// Flex.2's preview with a ctrl_img (flex2.py:223-255 and its Flex2Pipeline, extensions_built_in/flex2/
// pipeline.py:182-290): an image named "*.inpaint.*" must be RGBA and is the inpainting input (slot 0), any
// other the control (slot 1, its alpha dropped); `index` (ctrl_idx, 0 by default) must name that slot, or
// the transformer gets the wrong width (AI Toolkit fails at the preview). Throws UserError saying so.
void check_flex2_preview_control(const std::filesystem::path& file, int index);
// The channels beside the preview's latents: the no-input default (zeros, a mask of ones, zeros) with slot
// `index` replaced by the image resized to width x height and encoded — for an inpainting image, the
// latents times its alpha (bilinear at the latents' size) and 1 - alpha.
torch::Tensor flex2_preview_condition(const std::filesystem::path& file, int index, int width, int height,
                                      const std::function<torch::Tensor(const torch::Tensor&)>& encode);

}  // namespace gclab::model::flux
