// A family's flow-matching noise schedule, as AI Toolkit configures diffusers' FlowMatchEulerDiscreteScheduler
// for it: the training scheduler (toolkit/samplers/custom_flowmatch_sampler.py, set_train_timesteps) and the
// preview pipelines (get_generation_pipeline passes the same scheduler) shift their sigmas by it.
#pragma once

#include <torch/types.h>

#include "gclab/config/choices.h"
#include "gclab/model/family_id.h"

namespace gclab::model {

struct FlowSchedule {
  double shift = 3.0;    // the static shift s: sigma' = s sigma / (1 + (s - 1) sigma)
  bool dynamic = false;  // use_dynamic_shifting: sigma' = e^mu / (e^mu + 1/sigma - 1), mu from the image's tokens
  double base_shift = 0.5, max_shift = 1.15;      // mu at base_seq_len and at max_seq_len tokens (a line)
  double base_seq_len = 256, max_seq_len = 4096;  // calculate_shift's two points
  double shift_terminal = 0;                      // > 0: stretch so the last sigma is this (diffusers)
  int64_t num_train_timesteps = 1000;
  // The preview pipeline passes no sigmas (StableDiffusion3Pipeline): the scheduler's set_timesteps lays
  // out linspace(t(sigma_max), t(sigma_min), steps) / 1000 and shifts it (a second time: its sigma range is
  // already shifted). The FLUX, Qwen-Image and Z-Image pipelines pass linspace(1, 1/steps, steps).
  bool preview_from_scheduler = false;

  // calculate_shift: mu for an image of `image_tokens` tokens (h w / patch^2 of the latent).
  double mu(int64_t image_tokens) const;
  // Descending sigmas in (0, 1] shifted as set_timesteps / set_train_timesteps do: the dynamic or static
  // shift, then the stretch to shift_terminal. float64 in, float64 out.
  torch::Tensor shift_sigmas(const torch::Tensor& sigmas, int64_t image_tokens) const;
  // The scheduler's sigma range after its __init__ (1000 sigmas 1.0 ... 0.001, statically shifted when not
  // dynamic): the ends set_train_timesteps spans for the shift types.
  double sigma_max() const;
  double sigma_min() const;
  // A preview's `steps` + 1 sigmas, as the pipelines build them: linspace(1, 1/steps, steps) shifted (the
  // FLUX / Qwen-Image / Z-Image pipelines), or the scheduler's own (preview_from_scheduler), then 0.
  torch::Tensor preview_sigmas(int steps, int64_t image_tokens) const;
};

// The schedule AI Toolkit trains and previews each family with:
//   FLUX.1 / Flex   toolkit/sampler.py flux_config: dynamic, mu 0.5 at 256 tokens to 1.15 at 4096
//   Qwen-Image(-Edit)  qwen_image.py scheduler_config: dynamic, mu 0.5 at 256 to 0.9 at 8192, shift_terminal 0.02
//   Z-Image        z_image.py scheduler_config: static shift 3.0
//   SD3            the legacy path, get_sampler("flowmatch", arch="sd") (BaseSDTrainProcess.py:1773-1786 for
//                  training, stable_diffusion_model.py:1212-1224 for previews): sd_flow_config, static
//                  shift 3.0 (toolkit/sampler.py:90-100, 166-167); StableDiffusion3Pipeline passes no sigmas
//   DiT            gclab's own (not in AI Toolkit): flux_config
FlowSchedule flow_schedule(const Family& family);
// The schedule of `spec`'s model class (its family's flow_schedule(spec), registry.h): what a run uses.
struct ModelSpec;
FlowSchedule flow_schedule(const ModelSpec& spec);

}  // namespace gclab::model
