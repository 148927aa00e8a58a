// diffusers' AutoencoderKLQwenImage (models/autoencoders/autoencoder_kl_qwenimage.py): the Wan 2.1 video
// VAE that Qwen-Image decodes with. Causal 3-D convolutions (padded with two past frames, none from the
// future), RMS norms over the channels, single-head attention per frame in the mid blocks, 2x spatial
// down/up-sampling per stage and 2x temporal where `temperal_downsample` says so (4x over the network: a
// video of 1 + 4k frames has 1 + k latent frames). Frames go through the network in chunks — the first
// frame alone, then 4 at a time when encoding, 1 at a time when decoding — each causal convolution keeping
// the last two frames it saw in a cache for the next chunk, exactly as the reference does to bound memory.
// Images are videos of one frame. Parameters carry diffusers' names, so a `vae/` folder loads unchanged.
//
// The Wan 2.2 VAE (diffusers' AutoencoderKLWan with is_residual, Wan2.2-TI2V-5B's vae/) is the same code with
// three differences its config switches on: residual down / up blocks whose shortcuts have no parameters
// (AvgDown3D averages channel groups of the space-to-channel folded input, DupUp3D repeats and unfolds them),
// the frames patchified 2 x 2 into 12 channels before the encoder and back after the decoder (16x spatially
// over all), and a decoder of its own width.
//
// Latents are normalised as the Qwen-Image pipelines do: z = (mean - latents_mean) / latents_std per channel
// after encoding, z / (1 / latents_std) + latents_mean before decoding; decoded frames are clamped to [-1, 1]
// (when decoded in tiles only as AutoencoderKLWan: clamps_tiles).
#pragma once

#include <algorithm>

#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "gclab/vae/autoencoder.h"

namespace gclab::vae {

// AutoencoderKLQwenImage.enable_tiling()'s default tile: tile_sample_min_height / width = 256 pixels.
constexpr int64_t kQwenImageDefaultTile = 256;

struct QwenImageVaeConfig {
  int64_t base_dim = 96, z_dim = 16;
  std::vector<int64_t> dim_mult = {1, 2, 4, 4};
  int64_t num_res_blocks = 2;
  std::vector<bool> temperal_downsample = {false, true, true};  // diffusers' spelling
  int64_t input_channels = 3;
  std::vector<double> latents_mean = {-0.7571, -0.7089, -0.9113, 0.1075,  -0.1745, 0.9653,  -0.1517, 1.5508,
                                      0.4134,  -0.0715, 0.5517,  -0.3632, -0.1922, -0.9497, 0.2503,  -0.2921};
  std::vector<double> latents_std = {2.8184, 1.4541, 2.3275, 2.6558, 1.2196, 1.7708, 2.6052, 2.0743,
                                     3.2687, 2.1526, 2.8652, 1.5579, 1.6382, 1.1253, 2.8251, 1.9160};
  // The Wan 2.2 VAE's switches: residual blocks, the patch folded into the channels (input_channels is then
  // the network's, 3 x patch²), the decoder's base width (0: base_dim).
  bool is_residual = false;
  int64_t patch_size = 1;
  int64_t decoder_base_dim = 0;
  // Decoded tiles clamped to [-1, 1] as well: AutoencoderKLWan's tiled_decode clamps, AutoencoderKLQwenImage's
  // does not (both clamp a whole decode).
  bool clamps_tiles = false;

  // Qwen-Image's (Qwen/Qwen-Image vae/config.json: diffusers' defaults).
  static QwenImageVaeConfig preset() { return {}; }
  // The same code at CPU-test size, for the tiny-qwen transformer preset: 16 latent channels, 8x spatial and
  // 4x temporal down-sampling, 32 base channels throughout (16 after an up-sampler halves them: a whole
  // oneDNN block), one residual block per stage.
  static QwenImageVaeConfig tiny();
  // The Wan 2.2 VAE, a residual 16x one (diffusers' convert_wan_to_diffusers.py vae22_diffusers_config: base 160,
  // decoder 256, z 48, residual, patch 2, 12 channels; its 48 latent means and deviations), and at CPU-test size.
  static QwenImageVaeConfig residual_16x();
  static QwenImageVaeConfig residual_16x_tiny();
  // A diffusers config.json (AutoencoderKLQwenImage, or AutoencoderKLWan — the Wan 2.1 VAE, the same network and
  // state dict, or with is_residual / patch_size the Wan 2.2 VAE); throws std::runtime_error naming what it
  // cannot use.
  static QwenImageVaeConfig from_json_file(const std::filesystem::path& path);
  int64_t downsampling() const { return (int64_t{1} << temperal_downsample.size()) * patch_size; }
  int64_t image_channels() const { return input_channels / (patch_size * patch_size); }
  // Frames per latent frame after the first: 2 for each stage that also halves time (4 for Qwen-Image's).
  int64_t temporal_downsampling() const {
    return int64_t{1} << std::count(temperal_downsample.begin(), temperal_downsample.end(), true);
  }
};

class QwenImageVaeImpl : public AutoencoderBase {
 public:
  // `options` places the weights (torch::kMeta: the memory model's walk, vae/memory.h).
  explicit QwenImageVaeImpl(QwenImageVaeConfig config, const torch::TensorOptions& options = {});

  // Videos [B, 3, T, H, W] (or images [B, 3, H, W], one frame) in [-1, 1] -> normalised latents
  // [B, z, 1 + (T-1)/4, H/8, W/8] ([B, z, H/8, W/8] for images).
  torch::Tensor encode(const torch::Tensor& video, Posterior posterior = Posterior::sample,
                       std::optional<at::Generator> generator = std::nullopt) override;
  // Normalised latents -> frames in [-1, 1], the shape encode took.
  torch::Tensor decode(const torch::Tensor& latents) override;
  // diffusers' enable_tiling(tile_sample_min = S, tile_sample_stride = 3S/4) (its default tile: 256 pixels,
  // stride 192): each tile decoded alone, frame by frame with its own cache.
  void enable_tiling(int64_t tile_sample_size = 0) override {
    tile_sample_size_ = tile_sample_size > 0 ? tile_sample_size : kQwenImageDefaultTile;
  }
  void disable_tiling() override { tile_sample_size_ = 0; }
  int64_t image_channels() const override { return config_.image_channels(); }
  int64_t latent_channels() const override { return config_.z_dim; }
  int64_t downsampling() const override { return config_.downsampling(); }
  bool takes_video() const override { return true; }
  int64_t temporal_downsampling() const override { return config_.temporal_downsampling(); }
  // The encoder's moments [B, 2z, T', h, w] (mean, then log-variance), before normalising.
  torch::Tensor moments(const torch::Tensor& video);
  const QwenImageVaeConfig& config() const { return config_; }

 private:
  QwenImageVaeConfig config_;
  std::shared_ptr<torch::nn::Module> encoder_, decoder_, quant_conv_, post_quant_conv_;
  int64_t tile_sample_size_ = 0;  // 0: tiling off
  // post_quant_conv, then the decoder one latent frame at a time with one cache (diffusers' _decode loop).
  torch::Tensor decode_frames(const torch::Tensor& z);
};
TORCH_MODULE(QwenImageVae);

// Loads a diffusers AutoencoderKLQwenImage's weights by their names (a .safetensors file, or a folder
// holding diffusion_pytorch_model.safetensors); throws std::runtime_error naming the first missing or
// misshapen tensor. Returns the names in the file the model does not use.
std::vector<std::string> load_qwen_image_vae_weights(QwenImageVaeImpl& vae, const std::filesystem::path& path);

}  // namespace gclab::vae
