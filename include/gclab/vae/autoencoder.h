// What every autoencoder gclab builds offers a run (AutoencoderKL, AutoencoderKLQwenImage): encode images into
// the family's scaled latents, decode them back, optionally in tiles. The codec (vae/codec.h) and
// `gclab forward` hold an autoencoder through this interface, whichever network it is.
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <filesystem>
#include <optional>
#include <string>
#include <vector>

namespace gclab::vae {

// How encode turns the posterior into latents: its mean (deterministic), or a sample mean + std N(0, 1)
// (what AI Toolkit's encode_images takes: latent_dist.sample()).
enum class Posterior { mean, sample };

class AutoencoderBase : public torch::nn::Module {
 public:
  // Images [B, 3, H, W] in [-1, 1] (a video autoencoder also takes [B, 3, T, H, W]) -> latents scaled as the
  // family's pipeline scales them. `generator` draws the posterior's sample (default: the global one).
  virtual torch::Tensor encode(const torch::Tensor& images, Posterior posterior = Posterior::sample,
                               std::optional<at::Generator> generator = std::nullopt) = 0;
  // Scaled latents -> images, the shape encode took.
  virtual torch::Tensor decode(const torch::Tensor& latents) = 0;
  // Decoding in overlapping tiles of `tile_sample_size` pixels (0: the network's default tile) blended at
  // the seams, as diffusers' enable_tiling: the decoder's activations are then a tile's, whatever the size.
  virtual void enable_tiling(int64_t tile_sample_size = 0) = 0;
  virtual void disable_tiling() = 0;
  virtual int64_t image_channels() const = 0;
  virtual int64_t latent_channels() const = 0;
  virtual int64_t downsampling() const = 0;           // pixels per latent, each side
  virtual bool takes_video() const { return false; }  // encode / decode also [B, C, T, H, W]
  // Frames per latent frame after the first (a causal video autoencoder's 1 + 4k -> 1 + k); 1: images.
  virtual int64_t temporal_downsampling() const { return 1; }
};

// What an autoencoder takes of a batch of frames [B, 3, F, H, W] (model/sample_shape.h): all of them when
// the family's latents carry frames (`video`), else its one frame as an image [B, 3, H, W]. The one place a
// sample's frames become an image: an image autoencoder never sees the frame axis, and no caller outside the
// autoencoders and the codec drops it.
torch::Tensor autoencoder_input(const torch::Tensor& frames, bool video);
// An autoencoder's output as frames [B, 3, F, H, W] (an image's [B, 3, H, W] is one frame).
torch::Tensor as_frames(const torch::Tensor& decoded);

// The rule every autoencoder loads by: each parameter of `module` by its name from the file (or the folder's
// diffusion_pytorch_model.safetensors, sharded or not), shapes checked; throws std::runtime_error naming the
// first missing or misshapen tensor. Returns the names in the file the module does not use.
std::vector<std::string> load_diffusers_weights(torch::nn::Module& module, const std::filesystem::path& path);

}  // namespace gclab::vae
