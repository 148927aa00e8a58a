// The diffusion transformers: one class per family, built from a ModelSpec, with random weights (or a
// user's, loaded by name), on any device including `meta` (a full-size model without memory).
//
// The model exposes its blocks (in call order, with their state-dict names) and calls each one in exactly
// one place, call_block(), which a caller may route elsewhere with set_block_caller — the way gclab's
// training applies a checkpoint policy without the model knowing about it.
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "gclab/model/blocks.h"
#include "gclab/model/spec.h"

namespace gclab::model {

// What one forward pass reads. Shapes: latents as the family's latent_shape gives them ([B, C, H/8, W/8] for
// an image family, [B, C, F', H/8, W/8] for a video one); timestep [B] in [0, 1] (the flow
// time, sigma); text [B, T, text_dim]; pooled [B, pooled_dim] (FLUX, SD3); guidance [B] (FLUX-dev);
// class_labels [B] int64 (DiT); reference_latents: the edit models' control images, each [B, C, h, w].
struct ModelInputs {
  torch::Tensor latents, timestep, text, pooled, guidance, class_labels;
  // [B, T]: 1 on the rows of the prompt's tokens (its tokenizer's attention mask), 0 on padding; undefined:
  // every row a token. Read by a transformer that masks padded text (Chroma).
  torch::Tensor text_mask;
  std::vector<torch::Tensor> reference_latents;
  // Channels concatenated on the latents before patchifying, [B, C', H', W'] (Flex.2's inpainting latent,
  // its mask and a control latent: the family's training_condition, registry.h); undefined: the model's default.
  torch::Tensor condition_channels;
  // Image tokens cross-attended beside the text, [B, N, spec.image_embed_dim] (Wan 2.1 I2V: CLIP's hidden
  // states of the first frame); undefined where the model takes none.
  torch::Tensor image_embeds;
  // The leading latent frames given clean, [B, C, k, h, w] (Wan 2.2 TI2V's first frame): the flow objective
  // and the sampler put them in place of the noisy ones, their tokens at t = 0 and outside the loss. With
  // per_token_timesteps the timestep is [B, S], one per token (Wan 2.2 TI2V's expand_timesteps), clean frames
  // or not. The transformer reads neither.
  torch::Tensor clean_latent_frames;
  bool per_token_timesteps = false;
  // FLUX/Flex: leave the guidance embedder out of the conditioning (AI Toolkit's bypass_guidance_embedding,
  // which Flex trains with); `guidance` is then not needed.
  bool bypass_guidance = false;
  // A model of several experts (experts.h): the one to run; -1, the one the timestep picks.
  int expert = -1;
};

class DiffusionTransformer : public torch::nn::Module {
 public:
  using BlockCaller = std::function<Tensors(size_t index, const Tensors& inputs)>;

  explicit DiffusionTransformer(ModelSpec spec) : spec_(std::move(spec)) {}
  // The predicted velocity, shaped like `latents` (DiT: 2x the channels, the learned variance last).
  virtual torch::Tensor forward(const ModelInputs& in) = 0;

  const ModelSpec& spec() const { return spec_; }
  const std::vector<std::shared_ptr<TransformerBlock>>& blocks() const { return blocks_; }
  const std::vector<std::string>& block_names() const { return block_names_; }
  // Routes every block call through `caller` (empty: call the block directly).
  void set_block_caller(BlockCaller caller) { caller_ = std::move(caller); }
  // How many whole transformers it holds, one of which runs a forward (experts.h); ModelInputs::expert picks.
  virtual size_t expert_count() const { return 1; }

  // Random inputs of the right shapes for samples of `shape` and `text_tokens` text tokens (0: the family's
  // count for a short prompt).
  ModelInputs example_inputs(const SampleShape& shape, int64_t text_tokens = 0,
                             const torch::TensorOptions& options = {}) const;

 protected:
  Tensors call_block(size_t index, const Tensors& inputs) {
    return caller_ ? caller_(index, inputs) : blocks_[index]->forward(inputs);
  }
  template <class B>
  std::shared_ptr<B> add_block(const std::string& name, std::shared_ptr<B> block) {
    register_at(*this, name, block);
    blocks_.push_back(block);
    block_names_.push_back(name);
    return block;
  }
  // A model made of others (experts.h): `inner`'s blocks become its own, named `prefix` + their names, and
  // `inner` calls them through this model's caller.
  void adopt_blocks(const std::string& prefix, DiffusionTransformer& inner);

  ModelSpec spec_;

 private:
  std::vector<std::shared_ptr<TransformerBlock>> blocks_;
  std::vector<std::string> block_names_;
  BlockCaller caller_;
};

// Per-token timesteps [B, S] for latents of `latent_shape` [B, C, F', h, w] (S = F' (h/p) (w/p)): each sample's
// t ([B]) on every token, 0 on the tokens of the first `clean_frames` latent frames (Wan 2.2 TI2V's
// expand_timesteps: (mask[0][0][:, ::p, ::p] * t).flatten()).
torch::Tensor per_token_timesteps(const ModelSpec& spec, const torch::Tensor& t, at::IntArrayRef latent_shape,
                                  int64_t clean_frames);

// Builds the family's transformer for `spec`; `options` places and types the weights (kMeta: no memory).
std::shared_ptr<DiffusionTransformer> build_transformer(const ModelSpec& spec,
                                                        const torch::TensorOptions& options = {});

// Throws std::invalid_argument when building `spec` in float32 on the CPU would take more than the
// machine's memory can give (most of its physical RAM), naming the sizes: a full-size preset is for a GPU,
// or for the meta device.
void check_fits_in_host_memory(const ModelSpec& spec, const std::string& what);

// Parameter counts, from the built model.
int64_t parameter_count(const torch::nn::Module& model);
int64_t trainable_parameter_count(const torch::nn::Module& model);

}  // namespace gclab::model
