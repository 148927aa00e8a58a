#include "gclab/train/flow.h"

namespace gclab::train {

namespace {

// Per-sample values broadcast over a latent of any rank (the family's latent_shape: images 4-D, video 5-D).
torch::Tensor per_sample(const torch::Tensor& t, const torch::Tensor& like) {
  std::vector<int64_t> shape(static_cast<size_t>(like.dim()), 1);
  shape[0] = -1;
  return t.view(shape);
}

// Every dimension but the batch's.
std::vector<int64_t> sample_dims(const torch::Tensor& x) {
  std::vector<int64_t> dims;
  for (int64_t d = 1; d < x.dim(); ++d) dims.push_back(d);
  return dims;
}

}  // namespace

torch::Tensor loss_mask_multiplier(const torch::Tensor& masks, const torch::Tensor& x0, torch::ScalarType dtype) {
  namespace F = torch::nn::functional;
  torch::NoGradGuard no_grad;
  // [B, 1, H, W] to the latents' height and width, then over their channels (and frames: one mask a sample).
  torch::Tensor m = F::interpolate(
      masks.to(torch::kHalf),
      F::InterpolateFuncOptions().size(std::vector<int64_t>{x0.size(-2), x0.size(-1)}).mode(torch::kNearest));
  while (m.dim() < x0.dim()) m = m.unsqueeze(2);
  std::vector<int64_t> over(static_cast<size_t>(x0.dim()), -1);
  for (int64_t d = 1; d < x0.dim() - 2; ++d) over[static_cast<size_t>(d)] = x0.size(d);
  m = m.expand(over).to(dtype);
  return m / m.mean();
}

torch::Tensor flow_matching_loss(model::DiffusionTransformer& model, const MicroBatch& b, const StepOptions& o) {
  model::ModelInputs in = b.conditioning;
  for (torch::Tensor* t : {&in.text, &in.pooled, &in.condition_channels})
    if (t->defined()) *t = t->to(o.dtype);
  for (auto& r : in.reference_latents) r = r.to(o.dtype);
  // Latents and noise in the compute dtype; add_noise multiplies them by the float32 timesteps, which
  // promotes to float32 (custom_flowmatch_sampler.py:97-99); the model's input is cast back.
  const torch::Tensor x0 = b.x0.to(o.dtype), noise = b.noise.to(o.dtype);
  const torch::Tensor t4 = per_sample(b.t, b.x0);
  const torch::Tensor x0f = x0.to(torch::kFloat);
  torch::Tensor noisy = (1 - t4) * x0f + t4 * noise.to(torch::kFloat);
  in.latents = noisy.to(o.dtype);
  in.timestep = b.t;
  // Leading latent frames given clean (Wan 2.2 TI2V's first frame: add_first_frame_conditioning_v22 on a clone
  // of the noisy latents): their tokens at t = 0, and the loss kept off them, renormalised (scale_loss).
  const int64_t clean = in.clean_latent_frames.defined() ? in.clean_latent_frames.size(2) : 0;
  torch::Tensor keep;
  if (clean > 0) {
    in.latents = in.latents.clone();
    in.latents.narrow(2, 0, clean).copy_(in.clean_latent_frames.to(o.dtype));
    keep = torch::ones({x0.size(0), 1, x0.size(2), x0.size(3), x0.size(4)}, x0.options().dtype(torch::kFloat));
    keep.narrow(2, 0, clean).zero_();
  }
  if (in.per_token_timesteps) in.timestep = model::per_token_timesteps(model.spec(), b.t, x0.sizes(), clean);
  torch::Tensor target = noise - x0;  // in the compute dtype, as SDTrainer's (noise - batch.latents)
  if (b.next_t.defined()) {
    torch::NoGradGuard no_grad;
    const torch::Tensor v = model.forward(in).narrow(1, 0, b.x0.size(1)).to(torch::kFloat);
    const torch::Tensor next4 = per_sample(b.next_t, b.x0);
    noisy = noisy + (next4 - t4) * v;  // the scheduler's Euler step
    in.latents = noisy.to(o.dtype);
    if (clean > 0) in.latents.narrow(2, 0, clean).copy_(in.clean_latent_frames.to(o.dtype));
    in.timestep =
        in.per_token_timesteps ? model::per_token_timesteps(model.spec(), b.next_t, x0.sizes(), clean) : b.next_t;
    target = (noisy - (1 - next4) * x0f) / next4 - x0f;  // the stepped latents' noise, less x0
  }
  torch::Tensor pred = model.forward(in);
  // DiT also predicts a variance: only the first channels are the velocity.
  pred = pred.narrow(1, 0, target.size(1)).to(torch::kFloat);
  const torch::Tensor diff = pred - target.to(torch::kFloat);
  torch::Tensor elementwise = o.loss_type == config::LossType::mae ? diff.abs() : diff.square();
  if (keep.defined()) elementwise = elementwise * keep / keep.mean().clamp_min(1e-8);
  if (b.loss_mask.defined()) elementwise = elementwise * b.loss_mask;  // SDTrainer.py:953-959
  const torch::Tensor per_sample = elementwise.mean(sample_dims(diff));
  return (b.weight.defined() ? per_sample * b.weight.to(per_sample.device()) : per_sample).mean();
}

double flow_matching_step(model::DiffusionTransformer& model, const MicroBatch& b, const StepOptions& o) {
  const torch::Tensor loss = flow_matching_loss(model, b, o);
  (loss * o.loss_scale).backward();
  return loss.item<double>();
}

}  // namespace gclab::train
