"""The flow-match schedules AI Toolkit trains and previews with, computed by diffusers'
FlowMatchEulerDiscreteScheduler itself (tests/train/timesteps_test.cpp compares gclab's with them):

  flow_schedules.py OUT

The scheduler configs are AI Toolkit's (toolkit/sampler.py flux_config; sd_flow_config, which SD3 gets through
get_sampler(..., arch="sd"); extensions_built_in/diffusion_models/qwen_image/qwen_image.py scheduler_config;
z_image.py scheduler_config).
For each family and image token count, OUT gets
  train.<family>.<tokens>    the 1000 timesteps CustomFlowMatchEulerDiscreteScheduler.set_train_timesteps lays
                             out for the shift types: linspace over the scheduler's sigma range, shifted by
                             time_shift(mu) or the static shift, stretched to shift_terminal (the scheduler's
                             own methods do each part)
  preview.<family>.<tokens>  the sigmas of a 20-step preview: set_timesteps(sigmas=linspace(1, 1/20, 20), mu) as the
                             FLUX / Qwen-Image / Z-Image pipelines call it; set_timesteps(20) as
                             StableDiffusion3Pipeline does (no sigmas)
  preview.sd3.25             SD3's 25-step preview (the last sigma before 0: 0.0089)
"""
import sys

import numpy as np
import torch
from diffusers import FlowMatchEulerDiscreteScheduler
from safetensors.torch import save_file

CONFIGS = {
    "flux": dict(base_image_seq_len=256, base_shift=0.5, max_image_seq_len=4096, max_shift=1.15,
                 num_train_timesteps=1000, shift=3.0, use_dynamic_shifting=True),
    "qwen_image": dict(base_image_seq_len=256, base_shift=0.5, invert_sigmas=False, max_image_seq_len=8192,
                       max_shift=0.9, num_train_timesteps=1000, shift=1.0, shift_terminal=0.02,
                       stochastic_sampling=False, time_shift_type="exponential", use_beta_sigmas=False,
                       use_dynamic_shifting=True, use_exponential_sigmas=False, use_karras_sigmas=False),
    "zimage": dict(num_train_timesteps=1000, use_dynamic_shifting=False, shift=3.0),
    "sd3": dict(base_image_seq_len=256, base_shift=0.5, max_image_seq_len=4096, max_shift=1.15,
                num_train_timesteps=1000, shift=3.0, use_dynamic_shifting=False),
}
PIPELINE_PASSES_SIGMAS = {"flux", "qwen_image", "zimage"}


def mu_for(s, tokens):
    c = s.config
    m = (c.get("max_shift", 1.15) - c.get("base_shift", 0.5)) / (
        c.get("max_image_seq_len", 4096) - c.get("base_image_seq_len", 256))
    return tokens * m + (c.get("base_shift", 0.5) - m * c.get("base_image_seq_len", 256))


def train_grid(s, tokens):
    t = np.linspace(s._sigma_to_t(s.sigma_max), s._sigma_to_t(s.sigma_min), 1000)
    sigmas = t / s.config.num_train_timesteps
    if s.config.use_dynamic_shifting:
        sigmas = s.time_shift(mu_for(s, tokens), 1.0, sigmas)
    else:
        sigmas = s.shift * sigmas / (1 + (s.shift - 1) * sigmas)
    if s.config.shift_terminal:
        sigmas = s.stretch_shift_to_terminal(sigmas)
    return torch.from_numpy(sigmas).float() * s.config.num_train_timesteps


def preview(s, tokens, passes_sigmas, steps=20):
    kwargs = {"mu": mu_for(s, tokens)} if s.config.use_dynamic_shifting else {}
    if passes_sigmas:
        s.set_timesteps(sigmas=np.linspace(1.0, 1 / steps, steps), **kwargs)
    else:
        s.set_timesteps(steps, **kwargs)
    return s.sigmas.float()


def main():
    out = {}
    for family, config in CONFIGS.items():
        for tokens in (256, 1024, 4096):
            out[f"train.{family}.{tokens}"] = train_grid(FlowMatchEulerDiscreteScheduler(**config), tokens)
            out[f"preview.{family}.{tokens}"] = preview(FlowMatchEulerDiscreteScheduler(**config), tokens,
                                                        family in PIPELINE_PASSES_SIGMAS)
    out["preview.sd3.25"] = preview(FlowMatchEulerDiscreteScheduler(**CONFIGS["sd3"]), 4096, False, 25)
    save_file({k: v.contiguous() for k, v in out.items()}, sys.argv[1])


if __name__ == "__main__":
    main()
