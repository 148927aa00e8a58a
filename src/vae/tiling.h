// Tiled decoding as diffusers does it for both autoencoders (AutoencoderKL.tiled_decode and
// AutoencoderKLQwenImage.tiled_decode), private to the vae library: the latents cut into tiles of a
// quarter's overlap, each decoded alone, the seams blended linearly.
#pragma once

#include <torch/torch.h>

#include <algorithm>
#include <functional>
#include <vector>

namespace gclab::vae {

// The tile grid for tiles of `tile_sample_size` pixels at `factor` pixels per latent: a stride of three
// quarters of a tile (AutoencoderKL: tile_overlap_factor 0.25; Qwen-Image: tile_sample_stride 192 for
// its 256-pixel tile), a blend over the remaining quarter, each tile cropped to the stride.
struct TileGrid {
  int64_t tile_latent, stride_latent, blend, keep;  // blend and keep in pixels
  TileGrid(int64_t tile_sample_size, int64_t factor)
      : tile_latent(tile_sample_size / factor),
        stride_latent(static_cast<int64_t>(static_cast<double>(tile_latent) * 0.75)),
        blend(static_cast<int64_t>(static_cast<double>(tile_sample_size) * 0.25)),
        keep(tile_sample_size - blend) {}
  // Whether latents of h x w need more than one tile.
  bool tiles(int64_t h, int64_t w) const { return h > tile_latent || w > tile_latent; }
};

// Decodes z (height and width its last two axes) tile by tile with `decode_tile`, blends each tile in place
// with the one above and the one to its left (already blended), as diffusers' blend_v / blend_h do, crops
// each to the stride and concatenates; the result is cropped to the latents' size times `factor`.
inline torch::Tensor tiled_decode(const torch::Tensor& z, const TileGrid& g, int64_t factor,
                                  const std::function<torch::Tensor(const torch::Tensor&)>& decode_tile) {
  const int64_t hd = z.dim() - 2, wd = z.dim() - 1;
  std::vector<std::vector<torch::Tensor>> rows;
  for (int64_t i = 0; i < z.size(hd); i += g.stride_latent) {
    rows.emplace_back();
    for (int64_t j = 0; j < z.size(wd); j += g.stride_latent)
      rows.back().push_back(decode_tile(z.slice(hd, i, i + g.tile_latent).slice(wd, j, j + g.tile_latent)));
  }
  auto blend = [](const torch::Tensor& a, torch::Tensor& b, int64_t dim, int64_t extent) {
    extent = std::min({a.size(dim), b.size(dim), extent});
    for (int64_t k = 0; k < extent; ++k) {
      const double w = static_cast<double>(k) / static_cast<double>(extent);
      b.select(dim, k).copy_(a.select(dim, a.size(dim) - extent + k) * (1 - w) + b.select(dim, k) * w);
    }
  };
  std::vector<torch::Tensor> result_rows;
  for (size_t i = 0; i < rows.size(); ++i) {
    std::vector<torch::Tensor> row;
    for (size_t j = 0; j < rows[i].size(); ++j) {
      torch::Tensor& tile = rows[i][j];
      if (i > 0) blend(rows[i - 1][j], tile, hd, g.blend);
      if (j > 0) blend(rows[i][j - 1], tile, wd, g.blend);
      row.push_back(tile.slice(hd, 0, g.keep).slice(wd, 0, g.keep));
    }
    result_rows.push_back(torch::cat(row, wd));
  }
  return torch::cat(result_rows, hd).slice(hd, 0, z.size(hd) * factor).slice(wd, 0, z.size(wd) * factor);
}

}  // namespace gclab::vae
