#include "gclab/train/flow.h"

#include "gclab/ckpt/autocast.h"

#include <cmath>
#include <stdexcept>

namespace gclab::train {

torch::Tensor sample_timesteps(config::TimestepType type, int64_t batch, const torch::Device& device,
                               int64_t image_tokens) {
  using config::TimestepType;
  const auto f = torch::TensorOptions().dtype(torch::kFloat);
  torch::Tensor t;
  switch (type) {
    case TimestepType::sigmoid:
      t = torch::sigmoid(torch::randn({batch}, f));
      break;
    case TimestepType::linear:
    case TimestepType::weighted:
      t = torch::rand({batch}, f);
      break;
    case TimestepType::shift: {
      const torch::Tensor u = torch::rand({batch}, f);
      t = 3 * u / (1 + 2 * u);
      break;
    }
    case TimestepType::flux_shift:
    case TimestepType::lumina2_shift: {
      // ostris/ai-toolkit toolkit/samplers/custom_flowmatch_sampler.py (calculate_shift) with
      // toolkit/sampler.py's flux_config (base 0.5 at 256 tokens, max 1.15 at 4096).
      const double mu = 0.5 + (static_cast<double>(image_tokens) - 256.0) * (1.15 - 0.5) / (4096.0 - 256.0);
      const torch::Tensor u = torch::rand({batch}, f).clamp_min(1e-3);
      t = std::exp(mu) / (std::exp(mu) + (1 / u - 1));
      break;
    }
    case TimestepType::lognorm_blend: {
      // The same file's lognorm_blend branch: 75% log-normal towards the start, 25% linear.
      const torch::Tensor x = torch::exp(torch::randn({750}, f) * 0.333);
      const torch::Tensor pool = torch::cat({1 - x / x.max(), torch::linspace(1.0, 0.001, 250, f)});
      t = pool.index_select(0, torch::randint(pool.size(0), {batch}, f.dtype(torch::kLong)));
      break;
    }
  }
  // Keep away from the ends, where x_t is pure data or pure noise.
  return t.clamp(1e-4, 1 - 1e-4).to(device);
}

torch::Tensor timestep_weights(config::TimestepType type, const torch::Tensor& t) {
  if (type != config::TimestepType::weighted) return torch::ones_like(t);
  // exp(-2 ((t - 0.5) / 0.5)^2), normalised to mean 1 over U(0, 1) (its integral is 0.5981...).
  return torch::exp(-2 * torch::square((t - 0.5) / 0.5)) / 0.598144;
}

torch::Tensor flow_matching_loss(model::DiffusionTransformer& model, const MicroBatch& b, const StepOptions& o) {
  model::ModelInputs in = b.conditioning;
  const torch::Tensor t4 = b.t.view({-1, 1, 1, 1});
  in.latents = (1 - t4) * b.x0 + t4 * b.noise;
  in.timestep = b.t;
  const torch::Tensor target = b.noise - b.x0;
  torch::Tensor pred;
  {
    const auto state = o.autocast_bf16 ? ckpt::AutocastState::enabled_for(b.x0.device().type(), at::kBFloat16)
                                       : ckpt::AutocastState::capture();
    ckpt::AutocastScope autocast(state);  // restored on exit, also when forward throws
    pred = model.forward(in);
  }
  // DiT also predicts a variance: only the first channels are the velocity.
  pred = pred.narrow(1, 0, target.size(1)).to(torch::kFloat);
  const torch::Tensor per_sample = (pred - target).square().mean({1, 2, 3});
  return (per_sample * timestep_weights(o.timestep_type, b.t)).mean();
}

double flow_matching_step(model::DiffusionTransformer& model, const MicroBatch& b, const StepOptions& o) {
  const torch::Tensor loss = flow_matching_loss(model, b, o);
  (loss * o.loss_scale).backward();
  return loss.item<double>();
}

}  // namespace gclab::train
