#include "gclab/model/flow_schedule.h"

#include <cmath>

#include "gclab/model/registry.h"

namespace gclab::model {

double FlowSchedule::mu(int64_t image_tokens) const {
  const double m = (max_shift - base_shift) / (max_seq_len - base_seq_len);
  return static_cast<double>(image_tokens) * m + (base_shift - m * base_seq_len);
}

torch::Tensor FlowSchedule::shift_sigmas(const torch::Tensor& sigmas, int64_t image_tokens) const {
  torch::Tensor s = sigmas.to(torch::kDouble);
  if (dynamic)
    s = std::exp(mu(image_tokens)) / (std::exp(mu(image_tokens)) + (1 / s - 1));
  else
    s = shift * s / (1 + (shift - 1) * s);
  // diffusers' stretch_shift_to_terminal; a lone sigma of 1 (a one-step preview) has nothing to stretch
  // (diffusers divides by zero there).
  const double last = s.numel() > 0 ? 1 - s[-1].item<double>() : 0;
  if (shift_terminal > 0 && last > 0) s = 1 - (1 - s) / (last / (1 - shift_terminal));
  return s;
}

double FlowSchedule::sigma_max() const { return 1.0; }

double FlowSchedule::sigma_min() const {
  // diffusers builds the init sigmas in float32: t / 1000 for t = 1 ... 1000, shifted (not when dynamic).
  const float s = 1.0f / static_cast<float>(num_train_timesteps);
  if (dynamic) return s;
  const float k = static_cast<float>(shift);
  return k * s / (1 + (k - 1) * s);
}

torch::Tensor FlowSchedule::preview_sigmas(int steps, int64_t image_tokens) const {
  // The pipelines pass np.linspace(1, 1/steps, steps) as float32; the scheduler shifts them in float64.
  // Where the pipeline passes none, set_timesteps lays out its own: linspace over the t of its (already
  // shifted) sigma range in float64, shifted once more.
  const torch::Tensor base = preview_from_scheduler ? torch::linspace(sigma_max(), sigma_min(), steps, torch::kDouble)
                                                    : torch::linspace(1.0, 1.0 / steps, steps, torch::kFloat);
  return torch::cat(
      {shift_sigmas(base, image_tokens).to(torch::kFloat).to(torch::kDouble), torch::zeros({1}, torch::kDouble)});
}

FlowSchedule flow_schedule(const Family& family) { return family_of(family).flow_schedule(); }
FlowSchedule flow_schedule(const ModelSpec& spec) { return family_of(spec.family).flow_schedule(spec); }

}  // namespace gclab::model
