// What a run turns images into latents with and decodes its previews with (docs/training.md): the
// family's autoencoder (AutoencoderKL, or Qwen-Image's AutoencoderKLQwenImage), or the DCT stand-in when the
// config asks for it (model.vae: dct).
//
// CodecSpec is the choice as data — which network, its dtype, its weights, tiling — from which the memory
// it holds and its encode / decode peaks are predicted without building anything (gclab estimate);
// build_codec builds it on a device.
#pragma once

#include <torch/types.h>

#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "gclab/model/sample_shape.h"
#include "gclab/vae/autoencoder_kl.h"
#include "gclab/vae/qwen_image_vae.h"

namespace gclab::vae {

// Which autoencoder, as data.
using AutoencoderConfig = std::variant<AutoencoderKLConfig, QwenImageVaeConfig>;

int64_t latent_channels(const AutoencoderConfig& config);
int64_t downsampling(const AutoencoderConfig& config);  // pixels per latent cell, each side
// Frames per latent frame after the first (AutoencoderBase::temporal_downsampling): 1 for an image autoencoder.
int64_t temporal_downsampling(const AutoencoderConfig& config);
// "AutoencoderKL", "AutoencoderKLQwenImage": diffusers' class name.
const char* class_name(const AutoencoderConfig& config);
// The configuration to build for `weights` (a diffusers vae/ folder, a .safetensors file, or nothing): the
// folder's config.json (read as fallback's class) when it has one; a BFL-layout ae.safetensors: `fallback`
// with the decoder's widths its tensors have; else `fallback` (the family's preset).
// Throws std::runtime_error for a config.json it cannot use.
AutoencoderConfig autoencoder_config(const AutoencoderConfig& fallback, const std::filesystem::path& weights);

// An autoencoder as a run builds it: `config` with the weights in `weights` (a folder or a .safetensors
// file), or, with none, random weights (from the global generator). Throws std::runtime_error for weights
// that do not fit. With meta `options` its tensors are meta ones (no weights read).
struct LoadedAutoencoder {
  std::shared_ptr<AutoencoderBase> vae;
  bool random = false;              // no weights were loaded
  std::vector<std::string> unused;  // tensors in the folder's weights that are not the network's
};
// Whether `weights` names weights: a file, or a folder holding diffusers' diffusion_pytorch_model.safetensors
// (or its index). A folder of config.json alone is a shape: the autoencoder at it with random weights, as a
// transformer folder without weights is.
bool holds_weights(const std::filesystem::path& weights);
LoadedAutoencoder build_autoencoder(const AutoencoderConfig& config, const std::filesystem::path& weights,
                                    const torch::TensorOptions& options = {});

struct CodecSpec {
  std::optional<AutoencoderConfig> autoencoder;  // nullopt: the DCT stand-in
  int64_t latent_channels = 16;
  int64_t downsampling = 8;       // pixels per latent, each side (the DCT stand-in's patches: the family's)
  int64_t dtype_bytes = 4;        // the autoencoder's weights and activations (the run's dtype)
  std::filesystem::path weights;  // a diffusers vae/ folder; empty: random weights at the real shapes
  int64_t tile_sample_size = 0;   // previews decoded in tiles of this many pixels (0: whole)
  // The family's latents carry frames (model::takes_frames): the autoencoder takes a sample's frames whole;
  // otherwise its one frame as an image (autoencoder_input).
  bool video = false;

  // The weights' bytes (0 for the stand-in).
  int64_t weight_bytes() const;
  // Peak bytes above the live set of one decode (a preview's shape) and one encode (a batch's).
  int64_t decode_bytes(const model::SampleShape& shape, bool cpu) const;
  int64_t encode_bytes(const model::SampleShape& shape, bool cpu) const;
  // "FLUX.1's AutoencoderKL (83,819,683 parameters, random weights)", "the DCT stand-in (16 channels)".
  std::string describe() const;
};

class ImageCodec {
 public:
  virtual ~ImageCodec() = default;
  // Frames [B, 3, F, H, W] in [-1, 1] (an image: F = 1), any device -> the family's latents (model::
  // latent_shape: [B, C, H/8, W/8] for an image family) scaled as its pipeline scales them, float32, on the
  // codec's device. The autoencoder encodes a sample of its posterior (as AI
  // Toolkit's encode_images does), drawn from the codec's own generator seeded with the run's seed and
  // `draw` (the batch's index, a cached image's key): the training's random stream is the same whether
  // latents were encoded or read from a cache, and a resumed run encodes what an unbroken one would.
  virtual torch::Tensor encode(const torch::Tensor& images, uint64_t draw = 0) = 0;
  // The same with the posterior's mean (diffusers' retrieve_latents(sample_mode="argmax"), as pipelines
  // encode their conditioning images); the stand-in's encode is deterministic already.
  virtual torch::Tensor encode_mean(const torch::Tensor& images) { return encode(images); }
  // Scaled latents -> frames [B, 3, F, H, W] float32 (not clamped), tiled when the spec says so.
  virtual torch::Tensor decode(const torch::Tensor& latents) = 0;
  // A cheap, deterministic host computation the data loader's thread may run (the stand-in); the
  // autoencoder encodes on the run's device, in the step's `data` phase.
  virtual bool encodes_on_loader_thread() const = 0;
  // The weights leave the device (AI Toolkit: vae.to('cpu') once the latents are cached) into host memory
  // the device's meter does not count (on a CPU run: untracked buffers), and come back.
  virtual void offload() {}
  virtual void restore() {}
  virtual bool offloaded() const { return false; }
  // The weight bytes on the device now (0 while offloaded).
  virtual int64_t resident_bytes() const = 0;
  const CodecSpec& spec() const { return spec_; }

 protected:
  explicit ImageCodec(CodecSpec spec) : spec_(std::move(spec)) {}
  CodecSpec spec_;
};

// Builds the codec on `device` (float32, or bfloat16 when spec.dtype_bytes is 2); the autoencoder's weights
// from spec.weights (throws std::runtime_error for a folder it cannot use), else random from the global
// generator; its posterior samples from a host generator seeded with `seed`. On the meta device the
// autoencoder is built on meta tensors (its weights' sizes only): the codec a walk runs, its offloaded
// weights their shapes.
std::unique_ptr<ImageCodec> build_codec(const CodecSpec& spec, torch::Device device, uint64_t seed);

}  // namespace gclab::vae
