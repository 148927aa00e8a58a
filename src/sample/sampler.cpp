#include "gclab/sample/sampler.h"

#include "gclab/ckpt/autocast.h"

namespace gclab::sample {

Guidance guidance_for(const model::ModelSpec& spec) {
  if (spec.family == model::Family::flux) return spec.guidance_embed ? Guidance::Embedded : Guidance::None;
  return Guidance::Cfg;
}

torch::Tensor euler_sample(model::DiffusionTransformer& model, const model::ModelInputs& cond,
                           const model::ModelInputs& uncond, const SampleOptions& o) {
  torch::NoGradGuard no_grad;
  const bool training = model.is_training();
  model.eval();
  const auto& spec = model.spec();
  const torch::Device device = cond.text.defined()           ? cond.text.device()
                               : cond.class_labels.defined() ? cond.class_labels.device()
                                                             : torch::Device(torch::kCPU);
  auto gen = at::make_generator<at::CPUGeneratorImpl>(static_cast<uint64_t>(o.seed));
  torch::Tensor x = at::normal(0.0, 1.0, {1, spec.latent_channels, o.latent_height, o.latent_width}, gen,
                               torch::TensorOptions().dtype(torch::kFloat))
                        .to(device);
  const Guidance mode = guidance_for(spec);
  const bool cfg = mode == Guidance::Cfg && o.guidance_scale != 1.0;
  auto cat = [](const torch::Tensor& a, const torch::Tensor& b) {
    return a.defined() ? torch::cat({a, b}, 0) : torch::Tensor();
  };
  // The velocity for `latents` at time t under the conditioning `in` (as many samples as latents).
  auto predict = [&](model::ModelInputs in, const torch::Tensor& latents, double t) {
    const int64_t n = latents.size(0);
    in.latents = latents;
    in.timestep = torch::full({n}, t, torch::TensorOptions().device(device));
    if (mode == Guidance::Embedded)
      in.guidance = torch::full({n}, o.guidance_scale, torch::TensorOptions().device(device));
    const auto state = o.autocast_bf16 ? ckpt::AutocastState::enabled_for(device.type(), at::kBFloat16)
                                       : ckpt::AutocastState::capture();
    ckpt::AutocastScope autocast(state);  // restored on exit, also when forward throws
    return model.forward(in).narrow(1, 0, spec.latent_channels).to(torch::kFloat);
  };
  // CFG runs the conditional and unconditional prompts as one batch of two when their text sequences
  // have one length; otherwise as two passes (Qwen-Image's sequence is the prompt's own length, so an
  // empty negative prompt is shorter than the prompt — its pipeline runs them separately too).
  const bool one_batch = !cond.text.defined() || cond.text.size(1) == uncond.text.size(1);
  for (int i = 0; i < o.steps; ++i) {
    const double t = 1.0 - static_cast<double>(i) / o.steps, t_next = 1.0 - static_cast<double>(i + 1) / o.steps;
    torch::Tensor v;
    if (!cfg) {
      v = predict(cond, x, t);
    } else if (one_batch) {
      model::ModelInputs in = cond;
      in.text = cat(cond.text, uncond.text);
      in.pooled = cat(cond.pooled, uncond.pooled);
      in.class_labels = cat(cond.class_labels, uncond.class_labels);
      const torch::Tensor both = predict(in, torch::cat({x, x}, 0), t);
      v = both[1].unsqueeze(0) + o.guidance_scale * (both[0].unsqueeze(0) - both[1].unsqueeze(0));
    } else {
      const torch::Tensor vc = predict(cond, x, t), vu = predict(uncond, x, t);
      v = vu + o.guidance_scale * (vc - vu);
    }
    x = x + (t_next - t) * v;
  }
  if (training) model.train();
  return x;
}

}  // namespace gclab::sample
