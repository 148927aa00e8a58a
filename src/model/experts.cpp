#include "gclab/model/experts.h"

#include <torch/torch.h>

#include "gclab/model/registry.h"

namespace gclab::model {

size_t expert_at(const ModelSpec& spec, double t, bool inclusive) {
  const auto& b = spec.expert_boundaries;
  // In AI Toolkit's scale (timesteps 0..1000 against boundary_ratio x 1000), where the boundary is exact.
  const double step = t * 1000.0;
  for (size_t i = 0; i + 1 < b.size(); ++i)
    if (inclusive ? step >= b[i] * 1000.0 : step > b[i] * 1000.0) return i;
  return b.empty() ? 0 : b.size() - 1;
}

std::string expert_name(size_t i) { return "transformer_" + std::to_string(i + 1); }
std::string expert_folder(size_t i) { return i == 0 ? "transformer" : "transformer_" + std::to_string(i + 1); }

ExpertTransformers::ExpertTransformers(const ModelSpec& spec,
                                       std::vector<std::shared_ptr<DiffusionTransformer>> experts)
    : DiffusionTransformer(spec), experts_(std::move(experts)) {
  for (size_t i = 0; i < experts_.size(); ++i) {
    register_module(expert_name(i), experts_[i]);
    adopt_blocks(expert_name(i) + ".", *experts_[i]);
  }
}

torch::Tensor ExpertTransformers::forward(const ModelInputs& in) {
  if (in.expert >= 0) {
    active_ = static_cast<size_t>(in.expert);
  } else if (!in.timestep.is_meta()) {
    const double mean = in.timestep.detach().to(torch::kDouble).mean().item<double>();
    active_ = expert_at(spec_, mean, /*inclusive=*/false);
  }
  TORCH_CHECK(active_ < experts_.size(), "expert ", active_, " of ", experts_.size());
  if (router_) router_(active_);
  return experts_[active_]->forward(in);
}

std::shared_ptr<DiffusionTransformer> build_experts(const ModelSpec& spec, const torch::TensorOptions& options,
                                                    const std::function<void(DiffusionTransformer&)>& loaded) {
  ModelSpec one = spec;
  one.expert_boundaries.clear();
  std::vector<std::shared_ptr<DiffusionTransformer>> experts;
  for (size_t i = 0; i < spec.expert_boundaries.size(); ++i) {
    experts.push_back(family_of(spec.family).build_transformer(one, options));
    if (loaded) loaded(*experts.back());
  }
  return std::make_shared<ExpertTransformers>(spec, std::move(experts));
}

}  // namespace gclab::model
