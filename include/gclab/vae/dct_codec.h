// The stand-in for an autoencoder (model.vae: dct): a fixed, deterministic linear codec with the family's
// latent channels and downsampling f (8, FLUX.2's 16). Each f x f RGB patch (3 f² values) is projected onto the
// `channels` lowest-frequency orthonormal 2-D DCT basis functions (per colour, frequencies in order of u + v),
// scaled to about unit variance. decode is the transpose: encode(decode(z)) == z exactly, and decode(encode(x)) is
// x's projection — a blocky low-pass image, so a tiny model trained from scratch previews pictures with the
// right colours and layout, where a random autoencoder would give noise. It holds no weights.
#pragma once

#include <torch/types.h>

#include "gclab/vae/codec.h"

namespace gclab::vae {

class DctCodec : public ImageCodec {
 public:
  // Its basis on `device` (the CPU: it encodes on the loader's thread; meta: a walk of its encode or decode).
  explicit DctCodec(int64_t channels, torch::Device device = torch::kCPU, int64_t downsampling = 8);
  // One frame [B, 3, 1, H, W] in [-1, 1], H and W multiples of f -> [B, channels, H/f, W/f] (on the
  // frames' device): an image family's stand-in (a video family's run needs its autoencoder).
  torch::Tensor encode(const torch::Tensor& frames, uint64_t draw = 0) override;
  // [B, channels, h, w] -> [B, 3, 1, f h, f w] (not clamped)
  torch::Tensor decode(const torch::Tensor& latents) override;
  bool encodes_on_loader_thread() const override { return true; }
  int64_t resident_bytes() const override { return 0; }
  int64_t channels() const { return basis_.size(0); }

 private:
  int64_t f_;
  torch::Tensor basis_;  // [channels, 3 f²], orthonormal rows, patch order (colour, y, x)
};

}  // namespace gclab::vae
