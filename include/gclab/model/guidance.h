// How a family's preview pipeline guides with scale g (the family's preview_guidance in model/registry.h): the sampler
// asks the rule whether to run the unconditional prompt, whether the two prompts share one forward, whether g is a
// model input, and how the two predictions combine. The base is classifier-free guidance as the SD3 and DiT
// pipelines do it: when g > 1, u + g (c - u), the prompts one batch of two. A family's own rule lives in its
// folder.
#pragma once

#include <torch/types.h>

namespace gclab::model {

class Guidance {
 public:
  virtual ~Guidance() = default;
  // Whether the unconditional prompt runs at scale g.
  virtual bool runs_cfg(double g) const { return g > 1; }
  // Both prompts in one forward (a batch of two); false: two forwards of one (half the activations' peak).
  virtual bool one_batch() const { return true; }
  // g is a model input (distilled guidance), not CFG.
  virtual bool embeds_scale() const { return false; }
  // The guided velocity from the conditional and the unconditional one.
  virtual torch::Tensor combine(const torch::Tensor& cond, const torch::Tensor& uncond, double g) const {
    return uncond + g * (cond - uncond);
  }
  // The forwards' batch at scale g: 2 where both prompts run as one batch, else 1.
  int forward_batch(double g) const { return runs_cfg(g) && one_batch() ? 2 : 1; }
};

// No classifier-free guidance (a distilled model; with embeds_scale, one whose scale is an input).
class NoGuidance : public Guidance {
 public:
  explicit NoGuidance(bool embeds_scale = false) : embeds_(embeds_scale) {}
  bool runs_cfg(double) const override { return false; }
  bool embeds_scale() const override { return embeds_; }

 private:
  bool embeds_;
};

}  // namespace gclab::model
