// The stand-in for a VAE: a fixed, deterministic linear codec with the family's latent channels and 8x
// downsampling. Each 8x8 RGB patch (192 values) is projected onto the `channels` lowest-frequency
// orthonormal 2-D DCT basis functions (per colour, frequencies in order of u + v), scaled to about unit
// variance. decode is the transpose: encode(decode(z)) == z exactly, and decode(encode(x)) is x's
// projection — a blocky low-pass image, so samples decode to pictures with the right colours and layout.
#pragma once

#include <torch/torch.h>

namespace gclab::data {

class LatentCodec {
 public:
  explicit LatentCodec(int64_t channels);
  // [B, 3, H, W] in [-1, 1], H and W multiples of 8 -> [B, channels, H/8, W/8]
  torch::Tensor encode(const torch::Tensor& images) const;
  // [B, channels, h, w] -> [B, 3, 8h, 8w] (not clamped)
  torch::Tensor decode(const torch::Tensor& latents) const;
  int64_t channels() const { return basis_.size(0); }

 private:
  torch::Tensor basis_;  // [channels, 192], orthonormal rows, patch order (colour, y, x)
};

// uint8 [H, W, 3] <-> float [3, H, W] in [-1, 1]
torch::Tensor to_unit_range(const torch::Tensor& rgb_hwc);
torch::Tensor to_rgb_uint8(const torch::Tensor& image_chw);

}  // namespace gclab::data
