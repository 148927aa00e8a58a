// A model of several experts: whole transformers of one shape, one of which runs a forward, picked by the
// flow time — Wan 2.2 A14B's high- and low-noise transformers as AI Toolkit holds them
// (DualWanTransformer3DModel, extensions_built_in/diffusion_models/wan22/wan22_14b_model.py:69-161). A
// family asks for it with ModelSpec::expert_boundaries; build_transformer builds it.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "gclab/model/transformer.h"

namespace gclab::model {

// The expert that runs at flow time t: the first whose boundary t is above — at or above with `inclusive`
// (WanPipeline's `t >= boundary_timestep` in sampling; the wrapper's training forward compares with `>`).
size_t expert_at(const ModelSpec& spec, double t, bool inclusive);
// Expert i's name in the state dict and in module paths: "transformer_1", "transformer_2", ... — the
// wrapper's attributes, and the pipeline's transformer/ and transformer_2/ folders (expert_folder).
std::string expert_name(size_t i);
std::string expert_folder(size_t i);

class ExpertTransformers final : public DiffusionTransformer {
 public:
  // Called before each forward with the expert that runs (a session moves the experts' weights there).
  using Router = std::function<void(size_t expert)>;
  ExpertTransformers(const ModelSpec& spec, std::vector<std::shared_ptr<DiffusionTransformer>> experts);
  // The expert ModelInputs::expert names, else the one the batch's mean timestep picks (the wrapper's
  // `timestep.float().mean().item() > boundary`); a timestep that cannot be read (the memory walk's, on
  // the meta device) keeps the expert that ran last — every expert has the one shape.
  torch::Tensor forward(const ModelInputs& in) override;
  size_t expert_count() const override { return experts_.size(); }
  DiffusionTransformer& expert(size_t i) { return *experts_.at(i); }
  size_t active() const { return active_; }
  void set_router(Router router) { router_ = std::move(router); }

 private:
  std::vector<std::shared_ptr<DiffusionTransformer>> experts_;
  size_t active_ = 0;  // the wrapper's first: transformer_1
  Router router_;
};

// spec's experts, each built by its family as a one-transformer spec, in one ExpertTransformers; `loaded`
// runs on each as soon as it is built, before the next is (a load that quantizes and places them in turn).
std::shared_ptr<DiffusionTransformer> build_experts(const ModelSpec& spec, const torch::TensorOptions& options,
                                                    const std::function<void(DiffusionTransformer&)>& loaded = {});

}  // namespace gclab::model
