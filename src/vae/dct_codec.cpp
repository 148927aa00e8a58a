#include "gclab/vae/dct_codec.h"

#include <cmath>
#include <optional>
#include <utility>
#include <vector>

namespace gclab::vae {

DctCodec::DctCodec(int64_t channels, torch::Device device, int64_t downsampling)
    : ImageCodec([channels] {
        CodecSpec s;
        s.latent_channels = channels;
        return s;
      }()),
      f_(downsampling) {
  const int f = static_cast<int>(f_), area = f * f;
  TORCH_CHECK(channels >= 1 && channels <= 3 * area, "latent channels must be in [1, ", 3 * area, "], got ", channels);
  // Frequencies (u, v) ordered by u + v, then u; each taken for red, green, blue before the next.
  std::vector<std::pair<int, int>> freqs;
  for (int sum = 0; sum <= 2 * (f - 1); ++sum)
    for (int u = 0; u <= sum; ++u)
      if (u < f && sum - u < f) freqs.emplace_back(u, sum - u);
  const double pi = std::acos(-1.0);
  auto alpha = [f](int k) { return std::sqrt((k == 0 ? 1.0 : 2.0) / f); };
  basis_ = torch::zeros({channels, 3 * area}, torch::kDouble);
  auto b = basis_.accessor<double, 2>();
  for (int64_t c = 0; c < channels; ++c) {
    const auto [u, v] = freqs[static_cast<size_t>(c / 3)];
    const int colour = static_cast<int>(c % 3);
    for (int y = 0; y < f; ++y)
      for (int x = 0; x < f; ++x)
        b[c][colour * area + y * f + x] =
            alpha(u) * alpha(v) * std::cos((2 * y + 1) * u * pi / (2 * f)) * std::cos((2 * x + 1) * v * pi / (2 * f));
  }
  basis_ = basis_.to(device, torch::kFloat);
}

namespace {
// Latents = DCT coefficients x 2 / f: a [-1, 1] patch's DC coefficient spans [-f, f] (f = 8: x 0.25).
double scale(int64_t f) { return 2.0 / static_cast<double>(f); }
}  // namespace

torch::Tensor DctCodec::encode(const torch::Tensor& frames, uint64_t /*draw: deterministic*/) {
  const torch::Tensor images = autoencoder_input(frames, /*video=*/false);
  const int64_t f = f_, b = images.size(0), h = images.size(2) / f, w = images.size(3) / f;
  TORCH_CHECK(images.size(1) == 3 && images.size(2) % f == 0 && images.size(3) % f == 0,
              "encode needs [B, 3, H, W] with H and W multiples of ", f, ", got ", images.sizes());
  const torch::Tensor patches =
      images.to(torch::kFloat).reshape({b, 3, h, f, w, f}).permute({0, 2, 4, 1, 3, 5}).reshape({b, h, w, 3 * f * f});
  const torch::Tensor z = torch::matmul(patches, basis_.to(images.device()).t()) * scale(f);
  return z.permute({0, 3, 1, 2}).contiguous();
}

torch::Tensor DctCodec::decode(const torch::Tensor& latents) {
  const int64_t f = f_, b = latents.size(0), h = latents.size(2), w = latents.size(3);
  const torch::Tensor z = latents.to(torch::kFloat).permute({0, 2, 3, 1}) / scale(f);
  const torch::Tensor patches = torch::matmul(z, basis_.to(latents.device()));  // [b, h, w, 3 f²]
  return patches.reshape({b, h, w, 3, f, f}).permute({0, 3, 1, 4, 2, 5}).reshape({b, 3, 1, h * f, w * f}).contiguous();
}

}  // namespace gclab::vae
