#include "gclab/vae/dct_codec.h"

#include <cmath>
#include <optional>
#include <utility>
#include <vector>

namespace gclab::vae {

namespace {
// Latents = DCT coefficients x 0.25: a [-1, 1] patch's DC coefficient spans [-8, 8].
constexpr double kScale = 0.25;
}  // namespace

DctCodec::DctCodec(int64_t channels, torch::Device device)
    : ImageCodec([channels] {
        CodecSpec s;
        s.latent_channels = channels;
        return s;
      }()) {
  TORCH_CHECK(channels >= 1 && channels <= 192, "latent channels must be in [1, 192], got ", channels);
  // Frequencies (u, v) ordered by u + v, then u; each taken for red, green, blue before the next.
  std::vector<std::pair<int, int>> freqs;
  for (int sum = 0; sum <= 14; ++sum)
    for (int u = 0; u <= sum; ++u)
      if (u < 8 && sum - u < 8) freqs.emplace_back(u, sum - u);
  const double pi = std::acos(-1.0);
  auto alpha = [](int k) { return k == 0 ? std::sqrt(1.0 / 8) : std::sqrt(2.0 / 8); };
  basis_ = torch::zeros({channels, 192}, torch::kDouble);
  auto b = basis_.accessor<double, 2>();
  for (int64_t c = 0; c < channels; ++c) {
    const auto [u, v] = freqs[static_cast<size_t>(c / 3)];
    const int colour = static_cast<int>(c % 3);
    for (int y = 0; y < 8; ++y)
      for (int x = 0; x < 8; ++x)
        b[c][colour * 64 + y * 8 + x] =
            alpha(u) * alpha(v) * std::cos((2 * y + 1) * u * pi / 16) * std::cos((2 * x + 1) * v * pi / 16);
  }
  basis_ = basis_.to(device, torch::kFloat);
}

torch::Tensor DctCodec::encode(const torch::Tensor& frames, uint64_t /*draw: deterministic*/) {
  const torch::Tensor images = autoencoder_input(frames, /*video=*/false);
  const int64_t b = images.size(0), h = images.size(2) / 8, w = images.size(3) / 8;
  TORCH_CHECK(images.size(1) == 3 && images.size(2) % 8 == 0 && images.size(3) % 8 == 0,
              "encode needs [B, 3, H, W] with H and W multiples of 8, got ", images.sizes());
  const torch::Tensor patches =
      images.to(torch::kFloat).reshape({b, 3, h, 8, w, 8}).permute({0, 2, 4, 1, 3, 5}).reshape({b, h, w, 192});
  const torch::Tensor z = torch::matmul(patches, basis_.to(images.device()).t()) * kScale;
  return z.permute({0, 3, 1, 2}).contiguous();
}

torch::Tensor DctCodec::decode(const torch::Tensor& latents) {
  const int64_t b = latents.size(0), h = latents.size(2), w = latents.size(3);
  const torch::Tensor z = latents.to(torch::kFloat).permute({0, 2, 3, 1}) / kScale;
  const torch::Tensor patches = torch::matmul(z, basis_.to(latents.device()));  // [b, h, w, 192]
  return patches.reshape({b, h, w, 3, 8, 8}).permute({0, 3, 1, 4, 2, 5}).reshape({b, 3, 1, h * 8, w * 8}).contiguous();
}

}  // namespace gclab::vae
