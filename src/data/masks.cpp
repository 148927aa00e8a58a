#include "gclab/data/masks.h"

#include "gclab/data/image.h"

namespace gclab::data {

torch::Tensor place_pixels(torch::Tensor hwc, const BucketPlacement& p, bool flip_x, bool flip_y) {
  if (flip_x) hwc = hwc.flip({1});
  if (flip_y) hwc = hwc.flip({0});
  return resize_pixels(hwc, p.scale_to_width, p.scale_to_height)
      .narrow(0, p.crop_y, p.bucket.height)
      .narrow(1, p.crop_x, p.bucket.width)
      .contiguous();
}

torch::Tensor load_inpaint_alpha(const std::filesystem::path& file, const BucketPlacement& placement, bool flip_x,
                                 bool flip_y) {
  const torch::Tensor alpha = decode_image_rgba(file).narrow(2, 3, 1);
  return place_pixels(alpha, placement, flip_x, flip_y).permute({2, 0, 1}).to(torch::kFloat).div(255.0);
}

torch::Tensor load_loss_mask(const std::filesystem::path& file, const config::DatasetConfig& dataset,
                             const BucketPlacement& placement, bool flip_x, bool flip_y, std::mt19937_64& rng) {
  torch::Tensor rgb = dataset.alpha_mask ? decode_image_rgba(file).narrow(2, 3, 1).expand({-1, -1, 3}).contiguous()
                                         : decode_image_rgb(file);
  if (dataset.invert_mask) rgb = 255 - rgb;  // ImageOps.invert
  if (flip_x) rgb = rgb.flip({1});
  if (flip_y) rgb = rgb.flip({0});
  // "randomly apply a blur up to 0.5% of the size of the min (width, height)"
  const auto min_size = static_cast<double>(std::min(rgb.size(0), rgb.size(1)));
  const int radius = static_cast<int>(min_size * std::generate_canonical<double, 53>(rng) * 0.005);
  const torch::Tensor grey = pil_luminance(pil_gaussian_blur(rgb.contiguous(), radius));
  const torch::Tensor unit = place_pixels(grey, placement, false, false).permute({2, 0, 1}).to(torch::kFloat) / 255.0;
  return unit * (1.0 - dataset.mask_min_value) + dataset.mask_min_value;  // value_map(x, 0, 1, min, 1)
}

}  // namespace gclab::data
