// What the families' transformers share beyond blocks.h and nn/layers.h: small embedders, position ids
// and the output norm (private to gclab_model; the family folders include it as "model/transformer_parts.h").
#pragma once

#include <array>
#include <cmath>
#include <string>
#include <vector>

#include "gclab/model/transformer.h"

namespace gclab::model {

// Two Linears with a SiLU between them (diffusers TimestepEmbedding / PixArtAlphaTextProjection with
// act_fn="silu", DiT's and Z-Image's t_embedder.mlp), registered at first_path and second_path.
struct TwoLayerMlp {
  Linear first{nullptr}, second{nullptr};
  TwoLayerMlp() = default;
  TwoLayerMlp(torch::nn::Module& owner, const std::string& first_path, const std::string& second_path, int64_t in,
              int64_t mid, int64_t out, const torch::TensorOptions& options)
      : first(register_at(owner, first_path, Linear(LinearOptions(in, mid).tensor_options(options)))),
        second(register_at(owner, second_path, Linear(LinearOptions(mid, out).tensor_options(options)))) {}
  torch::Tensor operator()(const torch::Tensor& x) { return second(torch::silu(first(x))); }
};

// A conv patch embedding (SD3 PatchEmbed.proj, DiT x_embedder.proj): a p x p kernel at stride p.
struct PatchConv {
  torch::Tensor weight, bias;
  int64_t patch = 2;
  PatchConv() = default;
  PatchConv(torch::nn::Module& owner, const std::string& path, int64_t in, int64_t out, int64_t p,
            const torch::TensorOptions& options)
      : patch(p) {
    auto& holder = holder_at(owner, path);
    const double bound = 1.0 / std::sqrt(static_cast<double>(in * p * p));
    weight = holder.register_parameter("weight", nn::uniform_parameter({out, in, p, p}, bound, options));
    bias = holder.register_parameter("bias", nn::uniform_parameter({out}, bound, options));
  }
  // [B, C, H, W] -> [B, (H/p)(W/p), D]: the convolution as the matmul it is at stride p, on the latents cut
  // into patches (c, i, j order, the kernel's) — the same sums, and one path on every device (the meta
  // device's included: LibTorch's C++ has no meta convolution, and the CPU's convolution allocates by
  // backend and batch, mkldnn or im2col).
  torch::Tensor operator()(const torch::Tensor& latents) {
    const torch::Tensor w = weight.scalar_type() == latents.scalar_type() ? weight : weight.to(latents.scalar_type());
    const torch::Tensor b = bias.scalar_type() == latents.scalar_type() ? bias : bias.to(latents.scalar_type());
    return torch::nn::functional::linear(nn::patchify(latents, patch, /*channels_last=*/false),
                                         w.reshape({w.size(0), -1}), b);
  }
};

inline torch::Tensor ids_tensor(const std::vector<std::array<int64_t, 3>>& rows, const torch::Device& device) {
  torch::Tensor t = torch::empty({static_cast<int64_t>(rows.size()), 3}, torch::kLong);
  auto a = t.accessor<int64_t, 2>();
  for (size_t i = 0; i < rows.size(); ++i)
    for (int j = 0; j < 3; ++j) a[static_cast<int64_t>(i)][j] = rows[i][j];
  return t.to(device);
}

// Image token positions on a (frame, row, column) grid of h x w patches.
inline void add_image_ids(std::vector<std::array<int64_t, 3>>& ids, int64_t frame, int64_t h, int64_t w,
                          int64_t row0 = 0, int64_t col0 = 0) {
  for (int64_t r = 0; r < h; ++r)
    for (int64_t c = 0; c < w; ++c) ids.push_back({frame, row0 + r, col0 + c});
}

// AdaLayerNormContinuous as the output norm: LN(x) * (1 + scale) + shift, emb = Linear(SiLU(c)) = [scale | shift].
inline torch::Tensor norm_out(Linear& linear, const torch::Tensor& x, const torch::Tensor& c) {
  const auto ss = linear(torch::silu(c)).chunk(2, 1);
  return modulate(layer_norm(x), ss[1], ss[0]);
}

}  // namespace gclab::model
