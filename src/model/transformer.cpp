#include "gclab/model/transformer.h"

#include "gclab/model/experts.h"
#include "gclab/model/registry.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <stdexcept>

#include <unistd.h>

namespace gclab::model {

torch::Tensor per_token_timesteps(const ModelSpec& spec, const torch::Tensor& t, at::IntArrayRef latent_shape,
                                  int64_t clean_frames) {
  TORCH_CHECK(latent_shape.size() == 5, "per-token timesteps take video latents [B, C, F, h, w]");
  const int64_t frames = latent_shape[2] / spec.patch_frames;
  const int64_t cells = (latent_shape[3] / spec.patch) * (latent_shape[4] / spec.patch);
  torch::Tensor mask = torch::ones({frames, cells}, t.options().dtype(torch::kFloat));
  if (clean_frames > 0) mask.narrow(0, 0, clean_frames / spec.patch_frames).zero_();
  return mask.flatten().unsqueeze(0) * t.to(torch::kFloat).view({-1, 1});
}

ModelInputs DiffusionTransformer::example_inputs(const SampleShape& shape, int64_t n_text,
                                                 const torch::TensorOptions& options) const {
  ModelInputs in;
  const torch::TensorOptions f = options.has_dtype() ? options : options.dtype(torch::kFloat);
  const int64_t batch = shape.batch;
  in.latents = torch::randn(latent_shape(spec_, shape), f);
  in.timestep = torch::rand({batch}, f);
  if (spec_.text_dim) {
    const int64_t t = n_text > 0 ? n_text : encoder_tokens(spec_, 16);
    in.text = torch::randn({batch, t, spec_.text_dim}, f);
  }
  if (spec_.pooled_dim) in.pooled = torch::randn({batch, spec_.pooled_dim}, f);
  if (spec_.guidance_embed) in.guidance = torch::full({batch}, 3.5, f);
  if (spec_.num_classes) in.class_labels = torch::randint(spec_.num_classes, {batch}, f.dtype(torch::kLong));
  if (spec_.condition_input_channels) {
    std::vector<int64_t> s = latent_shape(spec_, shape);
    s[1] = spec_.condition_input_channels;
    in.condition_channels = torch::randn(s, f);
  }
  if (spec_.image_embed_dim)
    in.image_embeds = torch::randn({batch, spec_.image_embed_tokens, spec_.image_embed_dim}, f);
  return in;
}

void DiffusionTransformer::adopt_blocks(const std::string& prefix, DiffusionTransformer& inner) {
  const size_t offset = blocks_.size();
  for (size_t i = 0; i < inner.blocks_.size(); ++i) {
    blocks_.push_back(inner.blocks_[i]);
    block_names_.push_back(prefix + inner.block_names_[i]);
  }
  inner.set_block_caller(
      [this, offset](size_t index, const Tensors& inputs) { return call_block(offset + index, inputs); });
}

std::shared_ptr<DiffusionTransformer> build_transformer(const ModelSpec& spec, const torch::TensorOptions& options) {
  if (!spec.expert_boundaries.empty()) return build_experts(spec, options);
  return family_of(spec.family).build_transformer(spec, options);
}

void check_fits_in_host_memory(const ModelSpec& spec, const std::string& what) {
  const int64_t params = parameter_count(*build_transformer(spec, torch::TensorOptions().device(torch::kMeta)));
  const int64_t bytes = 4 * params;  // built in float32 before any conversion
  const int64_t physical = static_cast<int64_t>(sysconf(_SC_PHYS_PAGES)) * static_cast<int64_t>(sysconf(_SC_PAGESIZE));
  if (physical > 0 && bytes > physical / 2)
    throw std::invalid_argument(what + ": " + spec.preset + " (" + std::to_string(params) + " parameters, " +
                                std::to_string(bytes >> 30) + " GiB in float32) does not fit this machine's memory (" +
                                std::to_string(physical >> 30) +
                                " GiB); run it on a GPU (device: cuda), or use a tiny-* "
                                "preset; `gclab estimate` predicts its memory without building it");
}

int64_t parameter_count(const torch::nn::Module& model) {
  int64_t n = 0;
  for (const auto& p : model.parameters()) n += p.numel();
  return n;
}

int64_t trainable_parameter_count(const torch::nn::Module& model) {
  int64_t n = 0;
  for (const auto& p : model.parameters())
    if (p.requires_grad()) n += p.numel();
  return n;
}

}  // namespace gclab::model
