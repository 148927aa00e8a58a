#include "gclab/sample/sampler.h"

#include "gclab/model/experts.h"
#include "gclab/model/family.h"
#include "gclab/model/flow_schedule.h"
#include "gclab/model/registry.h"
#include "gclab/model/spec.h"

namespace gclab::sample {

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
  // The latents in the model's dtype between steps, as the pipelines keep them (prepare_latents in the
  // prompt embeddings' dtype; FlowMatchEulerDiscreteScheduler.step adds in float32 and casts back).
  torch::Tensor x = at::normal(0.0, 1.0, model::latent_shape(spec, {1, o.frames, o.height, o.width}), gen,
                               torch::TensorOptions().dtype(torch::kFloat))
                        .to(device, o.dtype);
  // Leading latent frames given clean (Wan 2.2 TI2V's ctrl_img: add_first_frame_conditioning_v22 on the
  // pipeline's initial latents): in place from the start and put back after each step (Wan22Pipeline's
  // `latents = pre * (1 - mask) + latents * mask`), their tokens at t = 0.
  const torch::Tensor& clean = cond.clean_latent_frames;
  const int64_t k = clean.defined() ? clean.size(2) : 0;
  if (k > 0) x.narrow(2, 0, k).copy_(clean.to(o.dtype));
  const std::shared_ptr<const model::Guidance> rule =
      o.guidance ? o.guidance : model::family_of(spec.family).preview_guidance(spec, /*do_cfg_norm=*/true);
  const double g = o.guidance_scale;
  const bool cfg = rule->runs_cfg(g);
  auto cat = [](const torch::Tensor& a, const torch::Tensor& b) {
    return a.defined() ? torch::cat({a, b}, 0) : torch::Tensor();
  };
  // The velocity for `latents` at time t under the conditioning `in` (as many samples as latents).
  auto predict = [&](model::ModelInputs in, const torch::Tensor& latents, double t) {
    const int64_t n = latents.size(0);
    in.latents = latents;
    in.timestep = torch::full({n}, t, torch::TensorOptions().device(device));
    if (in.per_token_timesteps) in.timestep = model::per_token_timesteps(spec, in.timestep, latents.sizes(), k);
    // A model of several experts: Wan22Pipeline's `transformer` while t >= the boundary, then `transformer_2`
    // (wan22_pipeline.py:197-231; guidance_scale_2 defaults to guidance_scale, :117-118).
    if (!spec.expert_boundaries.empty()) in.expert = static_cast<int>(model::expert_at(spec, t, /*inclusive=*/true));
    if (rule->embeds_scale()) in.guidance = torch::full({n}, o.guidance_scale, torch::TensorOptions().device(device));
    // No autocast: the model computes in its weights' dtype on inputs cast to it, as AI Toolkit runs it.
    for (torch::Tensor* t : {&in.text, &in.pooled, &in.condition_channels})
      if (t->defined()) *t = t->to(o.dtype);
    for (auto& r : in.reference_latents) r = r.to(o.dtype);
    return model.forward(in).narrow(1, 0, spec.latent_channels);
  };
  // CFG runs the conditional and unconditional prompts as one batch of two where the family's pipeline does
  // and their text sequences have one length; otherwise as two passes: half the activations' peak.
  const bool one_batch =
      rule->forward_batch(g) == 2 && (!cond.text.defined() || cond.text.size(1) == uncond.text.size(1));
  // The pipeline's sigmas: linspace(1, 1/steps, steps) shifted by the family's schedule (the dynamic mu of
  // this preview's image tokens for FLUX / Qwen-Image / SD3), then 0.
  const torch::Tensor sigmas =
      model::flow_schedule(spec).preview_sigmas(o.steps, model::image_tokens(spec, {1, o.frames, o.height, o.width}));
  const auto sigma = sigmas.accessor<double, 1>();
  for (int i = 0; i < o.steps; ++i) {
    const double t = sigma[i], t_next = sigma[i + 1];
    torch::Tensor v;
    if (!cfg) {
      v = predict(cond, x, t);
    } else {
      torch::Tensor vc, vu;
      if (one_batch) {
        model::ModelInputs in = cond;
        in.text = cat(cond.text, uncond.text);
        in.text_mask = cat(cond.text_mask, uncond.text_mask);
        in.pooled = cat(cond.pooled, uncond.pooled);
        in.class_labels = cat(cond.class_labels, uncond.class_labels);
        in.condition_channels = cat(cond.condition_channels, uncond.condition_channels);
        in.image_embeds = cat(cond.image_embeds, uncond.image_embeds);
        const torch::Tensor both = predict(in, torch::cat({x, x}, 0), t);
        vc = both[0].unsqueeze(0), vu = both[1].unsqueeze(0);
      } else {
        vc = predict(cond, x, t), vu = predict(uncond, x, t);
      }
      v = rule->combine(vc, vu, g);
    }
    const torch::Tensor before = k > 0 ? x.narrow(2, 0, k).clone() : torch::Tensor();
    x = (x.to(torch::kFloat) + (t_next - t) * v.to(torch::kFloat)).to(o.dtype);
    if (k > 0) x.narrow(2, 0, k).copy_(before);
  }
  if (training) model.train();
  return x.to(torch::kFloat);
}

}  // namespace gclab::sample
