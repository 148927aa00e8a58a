// An image-to-video model's conditioning on a sample's first frame (Wan 2.1 I2V: CLIP's image tokens and the
// first frame encoded as channels beside the noisy latents): what it holds on the device (its image encoder)
// and what it adds to the transformer's inputs in a training step. A family that trains on first frames
// builds one (its frame_conditioning hook, registry.h); the Session holds it beside the autoencoder, runs
// it in each step's forward phase, and the memory model walks the same call on the meta device.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "gclab/model/transformer.h"

namespace gclab::model {

// Where a family's frame conditioning comes from: the device and dtype its encoder runs in, the folders of
// a user's files (empty: random weights at the preset's shape, drawn from `seed`).
struct FrameConditioningSource {
  torch::Device device = torch::Device(torch::kCPU);
  torch::ScalarType dtype = torch::kFloat;
  std::filesystem::path image_encoder;    // a transformers image_encoder/ folder (config.json, weights)
  std::filesystem::path image_processor;  // its image_processor/ folder (preprocessor_config.json)
  bool encoder_in_host_memory = false;    // the encoder built in host memory (the caller moves it later)
  uint64_t seed = 42;
};

enum class PreviewFirstFrame { none, optional, required };

// A batch's first frames as a training step gets them: their pixels ([B, 3, H, W] in [-1, 1], host memory),
// or their latents ([B, C, 1, h, w], scaled) from the latent cache where the family caches them
// (caches_first_frame_latents, registry.h) — one of the two defined for clips (a batch of images may have
// neither, its latents cached).
struct FirstFrames {
  torch::Tensor pixels;
  torch::Tensor latents;
  bool clips = true;  // the samples are clips (AI Toolkit's 5-D batch), not images
};

class FrameConditioning {
 public:
  // Frames [B, 3, F, H, W] in [-1, 1] -> the family's scaled latents on the device (the run's autoencoder: a
  // sample of the posterior, or its mean where a preview asks for it).
  using Encode = std::function<torch::Tensor(const torch::Tensor&)>;
  virtual ~FrameConditioning() = default;
  // The image encoder whose weights it holds (nullptr: none).
  virtual torch::nn::Module* image_encoder() = 0;
  // "a CLIP vision tower (630766080 parameters, random weights)".
  virtual std::string describe() const = 0;
  // A training step's inputs from each sample's first frame `first` (any device) and the clean latents `x0`:
  // sets in.condition_channels and in.image_embeds (Wan 2.1 I2V) or in.clean_latent_frames and
  // in.per_token_timesteps (Wan 2.2 TI2V), without gradients; `encode` runs only on pixels.
  virtual void condition(ModelInputs& in, const FirstFrames& first, const torch::Tensor& x0, const Encode& encode) = 0;
  // A preview's inputs from its control image `file` (sample.ctrl_img; empty: none) for latents of
  // `latent_shape` ([1, C, F', h, w]), as the family's preview pipeline computes them; `mean` encodes to the
  // posterior's mean, `sample` draws from it.
  virtual void preview_condition(ModelInputs& in, const std::filesystem::path& file,
                                 const std::vector<int64_t>& latent_shape, const Encode& mean,
                                 const Encode& sample) = 0;
};

}  // namespace gclab::model
