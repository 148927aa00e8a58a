// The images AI Toolkit reads beside a training image, placed as the image is: Flex.2's inpainting image
// (a dataset's inpaint_path) and the loss mask (mask_path, or alpha_mask: the image's own alpha).
#pragma once

#include <torch/types.h>

#include <filesystem>
#include <random>

#include "gclab/config/config.h"
#include "gclab/data/buckets.h"

namespace gclab::data {

// uint8 [H, W, C] flipped, scaled to the placement's scale_to size and cut to its bucket: the order of AI
// Toolkit's load_and_process_image, load_inpaint_image and load_mask_image (flip, resize, crop;
// toolkit/dataloader_mixins.py:920-939, 1034-1050, 1621-1645).
torch::Tensor place_pixels(torch::Tensor hwc, const BucketPlacement& placement, bool flip_x, bool flip_y);

// load_inpaint_image (dataloader_mixins.py:1015-1064): an RGBA .png / .webp placed as the image; only its
// alpha is read by Flex.2 (flex2.py:407-409): [1, H, W] float32 in [0, 1], 0 where the model inpaints.
// Throws ImageError for a file that does not decode or is not RGBA (AI Toolkit then has none for the image).
torch::Tensor load_inpaint_alpha(const std::filesystem::path& file, const BucketPlacement& placement, bool flip_x,
                                 bool flip_y);

// load_mask_image (dataloader_mixins.py:1582-1657): the mask file as RGB (with alpha_mask, the image's alpha
// in every channel), inverted with invert_mask, flipped, blurred by PIL's GaussianBlur of radius
// int(min(w, h) * random() * 0.005) (drawn from `rng`), made grey (convert('L')), placed, and mapped from
// [0, 1] to [mask_min_value, 1]: [1, H, W] float32, 1 where the loss counts fully.
torch::Tensor load_loss_mask(const std::filesystem::path& file, const config::DatasetConfig& dataset,
                             const BucketPlacement& placement, bool flip_x, bool flip_y, std::mt19937_64& rng);

}  // namespace gclab::data
