#include "gclab/train/flow.h"

#include "gclab/ckpt/autocast.h"

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

torch::Tensor flow_matching_loss(model::DiffusionTransformer& model, const MicroBatch& b, const StepOptions& o) {
  model::ModelInputs in = b.conditioning;
  const torch::Tensor t4 = per_sample(b.t, b.x0);
  in.latents = (1 - t4) * b.x0 + t4 * b.noise;
  in.timestep = b.t;
  auto predict = [&](const model::ModelInputs& inputs) {
    const auto state = o.autocast_bf16 ? ckpt::AutocastState::enabled_for(b.x0.device().type(), at::kBFloat16)
                                       : ckpt::AutocastState::capture();
    ckpt::AutocastScope autocast(state);  // restored on exit, also when forward throws
    return model.forward(inputs);
  };
  torch::Tensor target = b.noise - b.x0;
  if (b.next_t.defined()) {
    torch::NoGradGuard no_grad;
    const torch::Tensor v = predict(in).narrow(1, 0, b.x0.size(1)).to(torch::kFloat);
    const torch::Tensor next4 = per_sample(b.next_t, b.x0);
    in.latents = in.latents + (next4 - t4) * v;  // the scheduler's Euler step
    in.timestep = b.next_t;
    target = (in.latents - (1 - next4) * b.x0) / next4 - b.x0;  // the stepped latents' noise, less x0
  }
  torch::Tensor pred = predict(in);
  // DiT also predicts a variance: only the first channels are the velocity.
  pred = pred.narrow(1, 0, target.size(1)).to(torch::kFloat);
  const torch::Tensor diff = pred - target;
  const torch::Tensor per_sample =
      (o.loss_type == config::LossType::mae ? diff.abs() : diff.square()).mean(sample_dims(diff));
  return (b.weight.defined() ? per_sample * b.weight.to(per_sample.device()) : per_sample).mean();
}

double flow_matching_step(model::DiffusionTransformer& model, const MicroBatch& b, const StepOptions& o) {
  const torch::Tensor loss = flow_matching_loss(model, b, o);
  (loss * o.loss_scale).backward();
  return loss.item<double>();
}

}  // namespace gclab::train
