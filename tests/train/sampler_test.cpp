// Previews guide as each family's pipeline (the one AI Toolkit's previews call) does: Qwen-Image's true
// CFG as two forwards, rescaled per token to the conditional prediction's norm (QwenImagePipeline);
// Z-Image's c + g (c - u) (ZImagePipeline); one Euler step checked against the formula by hand, and the
// Qwen preview's peak against one unguided forward's.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "gclab/memory/tracker.h"
#include "gclab/model/registry.h"
#include "gclab/model/transformer.h"
#include "gclab/sample/sampler.h"

namespace gclab::sample {
namespace {

struct Conditioning {
  model::ModelInputs cond, uncond;
};

Conditioning conditioning(const model::DiffusionTransformer& m, int64_t cond_tokens, int64_t uncond_tokens) {
  torch::manual_seed(4);
  Conditioning c{m.example_inputs({1, 1, 64, 64}, cond_tokens), m.example_inputs({1, 1, 64, 64}, uncond_tokens)};
  return c;
}

// x after one Euler step from t = 1 to 0 is noise - v(noise, 1): v from the given guidance rule.
torch::Tensor one_step(model::DiffusionTransformer& m, const Conditioning& c, double g) {
  SampleOptions o;
  o.height = o.width = 64, o.steps = 1, o.guidance_scale = g, o.seed = 3;
  return euler_sample(m, c.cond, c.uncond, o);
}

torch::Tensor noise_and_velocity(model::DiffusionTransformer& m, model::ModelInputs in, torch::Tensor* x) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(3);
  *x = at::normal(0.0, 1.0, {1, m.spec().latent_channels, 8, 8}, gen, torch::TensorOptions().dtype(torch::kFloat));
  in.latents = *x;
  in.timestep = torch::ones({1});
  torch::NoGradGuard no_grad;
  return m.forward(in);
}

TEST(Sampler, QwenImageTrueCfgIsTwoForwardsRescaledPerToken) {
  torch::manual_seed(0);
  auto m = model::build_transformer(model::spec_by_preset("tiny-qwen-image"));
  const Conditioning c = conditioning(*m, 12, 1);  // a 1-token negative (neg: "")
  m->eval();
  torch::Tensor x;
  const torch::Tensor vc = noise_and_velocity(*m, c.cond, &x), vu = noise_and_velocity(*m, c.uncond, &x);
  const torch::Tensor guided = vu + 3.0 * (vc - vu);
  auto token_norm = [](const torch::Tensor& v) {  // over each 2x2 patch of all channels
    return v.reshape({1, 16, 4, 2, 4, 2}).pow(2).sum({1, 3, 5}, true).sqrt();
  };
  const torch::Tensor want_v =
      (guided.reshape({1, 16, 4, 2, 4, 2}) * (token_norm(vc) / token_norm(guided))).reshape({1, 16, 8, 8});
  EXPECT_TRUE(torch::allclose(one_step(*m, c, 3.0), x - want_v, 1e-5, 1e-5));
  EXPECT_FALSE(torch::allclose(one_step(*m, c, 3.0), x - guided, 1e-3, 1e-3));  // the rescale matters
  EXPECT_TRUE(torch::allclose(one_step(*m, c, 1.0), x - vc, 1e-5, 1e-5));       // g <= 1: no CFG
  // The Plus models' pipeline (AI Toolkit's own) rescales only with sample.do_cfg_norm, off by default.
  const model::ModelFamily& qwen = model::family_of(m->spec().family);
  auto sample_with = [&](const std::string& preset, bool do_cfg_norm) {
    SampleOptions o;
    o.height = o.width = 64, o.steps = 1, o.guidance_scale = 3.0, o.seed = 3;
    model::ModelSpec spec = model::spec_by_preset(preset);
    spec.patch = m->spec().patch;
    o.guidance = qwen.preview_guidance(spec, do_cfg_norm);
    return euler_sample(*m, c.cond, c.uncond, o);
  };
  EXPECT_TRUE(torch::allclose(sample_with("qwen-image-edit-2509", false), x - guided, 1e-5, 1e-5));
  EXPECT_TRUE(torch::allclose(sample_with("qwen-image-edit", false), x - want_v, 1e-5, 1e-5));
  EXPECT_TRUE(torch::allclose(sample_with("qwen-image-edit-2511", true), x - want_v, 1e-5, 1e-5));

  // Two forwards of one sample, not one of two: the guided preview's peak is the unguided one's.
  memory::CpuMemoryTracker tracker;
  auto peak_of = [&](double g) {
    const int64_t before = tracker.stats().live_bytes;
    tracker.reset_peak();
    one_step(*m, conditioning(*m, 12, 12), g);
    return tracker.stats().peak_bytes - before;
  };
  const int64_t unguided = peak_of(1.0), guided_peak = peak_of(3.0);
  EXPECT_LT(guided_peak, unguided * 5 / 4) << "guided " << guided_peak << ", unguided " << unguided;
}

TEST(Sampler, ZImageGuidesAsItsPipelineDoes) {
  torch::manual_seed(0);
  auto m = model::build_transformer(model::spec_by_preset("tiny-zimage"));
  const Conditioning c = conditioning(*m, 20, 20);
  m->eval();
  torch::Tensor x;
  const torch::Tensor vc = noise_and_velocity(*m, c.cond, &x), vu = noise_and_velocity(*m, c.uncond, &x);
  // AI Toolkit hands ZImagePipeline g - 1 ("CFG is 0 normalized", z_image.py:363), which guides when that is
  // above 0: no unconditional prediction at g <= 1, c + (g - 1)(c - u) above.
  EXPECT_TRUE(torch::allclose(one_step(*m, c, 3.0), x - (vc + 2.0 * (vc - vu)), 1e-4, 1e-5));
  EXPECT_TRUE(torch::allclose(one_step(*m, c, 1.0), x - vc, 1e-5, 1e-5));
  EXPECT_TRUE(torch::allclose(one_step(*m, c, 0.5), x - vc, 1e-5, 1e-5));
  EXPECT_TRUE(torch::allclose(one_step(*m, c, 0.0), x - vc, 1e-5, 1e-5));
}

}  // namespace
}  // namespace gclab::sample
