"""Wan 2.2 A14B's two experts in gclab against diffusers (the pinned `diffusers` in .venv, a test-only
reference), through gclab's command line:

  diffusers_wan22_experts.py GCLAB_EXE WORK_DIR

1. Two tiny random WanTransformer3DModel saved by diffusers' save_pretrained as a Wan 2.2 A14B folder's
   transformer/ (the high-noise expert) and transformer_2/ (the low-noise one). `gclab forward` with
   model.arch wan22_14b and name_or_path that folder must give the expert the batch's mean timestep picks
   (AI Toolkit's DualWanTransformer3DModel: mean > 875 of 1000, transformer_1), to float32 rounding.
2. `gclab train` (two steps, switch_boundary_every 1: one step each expert) writes <name>_high_noise and
   <name>_low_noise.safetensors (AI Toolkit's split_multistage_loras); diffusers' Wan LoRA loader reads each
   as one transformer's, and each expert with its file loaded gives what `gclab forward --lora` gives.
"""
import os
import shutil
import sys

import torch
from safetensors.torch import save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import diffusers_interop as interop  # noqa: E402  (its tiny Wan, inputs, config and comparisons)

interop.ARCH["wan22_a14b"] = "wan22_14b"
interop.TEXT["wan22_a14b"] = interop.TEXT["wan21"]


def main():
    exe, work = sys.argv[1], sys.argv[2]
    try:
        import diffusers  # noqa: F401
        import peft  # noqa: F401
    except ImportError as e:
        print(f"skipped: {e} (scripts/setup.sh installs the pinned diffusers and peft into .venv)")
        sys.exit(77)
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    model_dir = os.path.join(work, "model")
    torch.manual_seed(0)
    high = interop.build("wan21")
    low = interop.build("wan21")  # other perturbations: the two experts differ everywhere
    high.save_pretrained(os.path.join(model_dir, "transformer"))
    low.save_pretrained(os.path.join(model_dir, "transformer_2"))
    interop.gclab(exe, "synth", "--out", os.path.join(work, "data"), "--count", "2", "--sizes", "128x128")
    cfg = interop.config(work, "wan22_a14b", model_dir, extra_train="        switch_boundary_every: 1\n")
    d = interop.inputs("wan21")
    cases = {"high": (torch.tensor([0.95, 0.9]), high), "low": (torch.tensor([0.3, 0.85]), low),
             "mean_low": (torch.tensor([0.95, 0.79]), low)}

    def forward_case(name, t, extra=()):
        d["timestep"] = t
        save_file({k: v.contiguous() for k, v in d.items()}, os.path.join(work, "inputs.safetensors"))
        return interop.gclab_forward(exe, cfg, work, extra)

    for name, (t, expert) in cases.items():
        interop.compare(f"wan22_a14b forward ({name}: t = {t.tolist()})", forward_case(name, t),
                        interop.velocity("wan21", expert, dict(d, timestep=t)))

    interop.gclab(exe, "train", cfg)
    out = os.path.join(work, "out", "wan22_a14b")
    if os.path.exists(os.path.join(out, "wan22_a14b.safetensors")):
        raise SystemExit("a combined LoRA file was written beside the experts' files")
    from diffusers import WanPipeline
    for suffix, (expert, t) in {"_high_noise": (high, cases["high"][0]), "_low_noise": (low, cases["low"][0])}.items():
        lora = os.path.join(out, f"wan22_a14b{suffix}.safetensors")
        state = WanPipeline.lora_state_dict(lora)
        if not any(k.startswith("transformer.blocks.0.attn1.to_q") for k in state):
            raise SystemExit(f"{suffix}: diffusers did not read gclab's file as a Wan LoRA: {sorted(state)[:3]}")
        before = interop.velocity("wan21", expert, dict(d, timestep=t))
        expert.load_lora_adapter(state, prefix="transformer", adapter_name="gclab")
        want = interop.velocity("wan21", expert, dict(d, timestep=t))
        delta = ((want - before).abs().max() / before.abs().max()).item()
        if delta < 100 * interop.TOL:
            raise SystemExit(f"{suffix}: the trained LoRA barely changes its expert ({delta:.1e})")
        # gclab reads the experts' files beside the one it is given (AI Toolkit's load_lora).
        interop.compare(f"wan22_a14b{suffix} expert with gclab's LoRA",
                        forward_case(suffix, t, ("--lora", os.path.join(out, "wan22_a14b_high_noise.safetensors"))),
                        want)
    print("wan22_a14b: gclab and diffusers agree")


if __name__ == "__main__":
    main()
