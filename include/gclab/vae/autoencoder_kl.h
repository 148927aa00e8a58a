// diffusers' AutoencoderKL (models/autoencoders/autoencoder_kl.py with vae.py's Encoder and Decoder): ResNet
// blocks of GroupNorm + SiLU + 3x3 convolutions, one single-head self-attention in each mid block, 2x
// down-sampling by a stride-2 convolution (padded right and bottom), 2x nearest up-sampling followed by a
// convolution, and quant_conv / post_quant_conv where the config has them. Parameters carry diffusers' names,
// so a diffusers `vae/` folder loads unchanged.
//
// Latents are scaled as the families' pipelines (and AI Toolkit's encode_images) scale them:
//   z = scaling_factor (x - shift_factor) after encoding, and the inverse before decoding.
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "gclab/nn/layers.h"
#include "gclab/vae/autoencoder.h"

namespace gclab::vae {

struct AutoencoderKLConfig {
  int64_t in_channels = 3, out_channels = 3, latent_channels = 16;
  std::vector<int64_t> block_out_channels = {128, 256, 512, 512};
  // The decoder's widths where they differ (diffusers' decoder_block_out_channels: FLUX.2's small decoder,
  // BFL's AutoEncoderSmallDecoderParams at 96 x [1, 2, 4, 4]); empty: block_out_channels.
  std::vector<int64_t> decoder_block_out_channels;
  int64_t layers_per_block = 2, norm_num_groups = 32;
  bool use_quant_conv = false, use_post_quant_conv = false, mid_block_add_attention = true;
  double scaling_factor = 0.3611, shift_factor = 0.1159;
  int64_t sample_size = 1024;  // the tile size tiled decoding uses unless told another
  // FLUX.2's autoencoder (diffusers' AutoencoderKLFlux2; BFL's flux2/src/autoencoder.py AutoEncoder.encode /
  // decode): the latents are the posterior's mean (encode takes no sample), 2 x 2 patches folded into the
  // channels ("c (i 2) (j 2) -> (c 2 2) i j") and normalized by a BatchNorm's running statistics,
  // (z - running_mean) / sqrt(running_var + batch_norm_eps), in place of the scaling and shift. patch 1 and
  // batch_norm_eps 0: none of it (the scaling and shift, a sampled posterior where asked).
  int64_t patch = 1;
  double batch_norm_eps = 0;

  // diffusers' AutoencoderKLFlux2 at its defaults (FLUX.2's: 84,046,115 parameters and 256 statistics).
  static AutoencoderKLConfig batch_normed();

  // The defaults are FLUX.1's config.json (also Flex's and Z-Image's: 83,819,683 parameters); each family
  // that decodes with another AutoencoderKL sets its own in its folder (the family's autoencoder in model/registry.h).
  // The same code at CPU-test size, for the tiny-* transformer presets: this config's latent channels,
  // scaling and 8x down-sampling, with 16 channels (a whole oneDNN block), one resnet per block, GroupNorms
  // of 4 groups.
  AutoencoderKLConfig shrunk() const;
  // A diffusers config.json (AutoencoderKL); throws std::runtime_error naming what it cannot use.
  static AutoencoderKLConfig from_json_file(const std::filesystem::path& path);
  const std::vector<int64_t>& decoder_channels() const {
    return decoder_block_out_channels.empty() ? block_out_channels : decoder_block_out_channels;
  }
  int64_t network_downsampling() const { return int64_t{1} << (block_out_channels.size() - 1); }
  int64_t downsampling() const { return network_downsampling() * patch; }   // pixels per latent, after the patches
  int64_t latent_width() const { return latent_channels * patch * patch; }  // the channels encode returns
};

class AutoencoderKLImpl : public AutoencoderBase {
 public:
  // `options` places the weights (torch::kMeta: the memory model's walk, vae/memory.h).
  explicit AutoencoderKLImpl(AutoencoderKLConfig config, const torch::TensorOptions& options = {});

  // [B, 3, H, W] in [-1, 1] -> scaled latents [B, C, H/f, W/f]. `generator` draws the sample (default: the
  // global one).
  torch::Tensor encode(const torch::Tensor& images, Posterior posterior = Posterior::sample,
                       std::optional<at::Generator> generator = std::nullopt) override;
  // Scaled latents -> images [B, 3, H, W] (not clamped).
  torch::Tensor decode(const torch::Tensor& latents) override;
  // The encoder's moments [B, 2C, h, w] (mean, then log-variance), before scaling: what diffusers'
  // latent_dist holds.
  torch::Tensor moments(const torch::Tensor& images);
  // Unscaled latents -> images (diffusers' AutoencoderKL.decode), tiled when tiling is on and the latents
  // are larger than a tile.
  torch::Tensor decode_unscaled(const torch::Tensor& z);

  // diffusers' enable_tiling / tiled_decode: the latents cut into tiles of tile_sample_size / f (default
  // the config's sample_size) overlapping by a quarter, each decoded alone, and the seams blended linearly
  // over a quarter tile; the decoder's activations are then a tile's, whatever the image's size.
  void enable_tiling(int64_t tile_sample_size = 0) override;
  void disable_tiling() override { tile_sample_size_ = 0; }
  int64_t image_channels() const override { return config_.in_channels; }
  int64_t latent_channels() const override { return config_.latent_width(); }
  int64_t downsampling() const override { return config_.downsampling(); }

  const AutoencoderKLConfig& config() const { return config_; }

 private:
  torch::Tensor patchify_latents(const torch::Tensor& z) const;
  torch::Tensor unpatchify_latents(const torch::Tensor& z) const;
  torch::Tensor normalize(const torch::Tensor& z) const;
  torch::Tensor denormalize(const torch::Tensor& z) const;

  AutoencoderKLConfig config_;
  std::shared_ptr<torch::nn::Module> encoder_, decoder_;  // diffusers' Encoder and Decoder (the .cpp)
  gclab::nn::Conv quant_conv_{nullptr}, post_quant_conv_{nullptr};
  torch::Tensor bn_mean_, bn_var_;  // FLUX.2: the BatchNorm's running statistics (bn.running_mean / _var)
  int64_t tile_sample_size_ = 0;    // 0: tiling off
};
TORCH_MODULE(AutoencoderKL);

// Loads a diffusers AutoencoderKL's weights (a .safetensors file, or a folder holding
// diffusion_pytorch_model.safetensors) by their names, or a Black Forest Labs autoencoder file (FLUX.2's
// ae.safetensors, the original LDM layout: bfl_autoencoder_name) by its own; throws std::runtime_error naming
// the first missing or misshapen tensor. Returns the names in the file the model does not use.
std::vector<std::string> load_autoencoder_weights(AutoencoderKLImpl& vae, const std::filesystem::path& path);

// The name a diffusers AutoencoderKL parameter has in BFL's autoencoder (flux2/src/autoencoder.py):
// down_blocks.i.resnets.j -> down.i.block.j, downsamplers.0 -> downsample, mid_block.resnets.0 / 1 ->
// mid.block_1 / block_2, mid_block.attentions.0.{group_norm, to_q, to_k, to_v, to_out.0} -> mid.attn_1.{norm,
// q, k, v, proj_out} (1 x 1 convolutions there), conv_norm_out -> norm_out, conv_shortcut -> nin_shortcut,
// up_blocks.i -> up.(levels - 1 - i) (BFL numbers the decoder's levels from the full resolution), upsamplers.0
// -> upsample, quant_conv / post_quant_conv -> encoder.quant_conv / decoder.post_quant_conv.
std::string bfl_autoencoder_name(const std::string& name, int64_t levels);
// Whether a weights file is in BFL's layout (it holds encoder.down.0.block.0.conv1.weight).
bool bfl_autoencoder_file(const std::filesystem::path& path);
// A KL config for a BFL-layout file: `preset` with the decoder's widths the file's tensors have (AI Toolkit's
// Flux2Model loads the small decoder where decoder.up.0.block.0.conv1.bias has 96 channels).
AutoencoderKLConfig bfl_autoencoder_config(const AutoencoderKLConfig& preset, const std::filesystem::path& path);

}  // namespace gclab::vae
