"""What the BFL-layout interop tests (diffusers_chroma.py, diffusers_flux2.py) share: gclab's command line, the
comparison to float32 rounding, a tiny model written as the BFL file AI Toolkit loads (and converted back),
a config on it, the bf16 comparison and a trained LoRA merged into the BFL weights as AI Toolkit's keys say."""
import os
import shutil
import sys

import torch
from safetensors.torch import load_file, save_file

from gclab_cli import TOL, compare, gclab  # noqa: F401  (compare: the interop scripts' too)
BF16_TOL = 2e-2  # as tests/reference/diffusers_interop.py: bf16 rounding through a few blocks
# Times whose thousandfold bf16 holds exactly: diffusers rounds the 0-1 timestep to the hidden dtype and multiplies
# by 1000 there; AI Toolkit's BFL models keep the time (Chroma) or round it at the 0-1000 scale (FLUX.2).
BF16_TIMES = torch.tensor([0.25, 0.5])


def start(work):
    """A fresh work folder, or exit 77 without diffusers (the C++ side skips)."""
    try:
        import diffusers  # noqa: F401
    except ImportError as e:
        print(f"skipped: {e} (scripts/setup.sh installs the pinned diffusers into .venv)")
        sys.exit(77)
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)


def write_bfl(model, to_bfl, from_bfl, path):
    """The model's weights in BFL's names at `path`, checked to convert back to them; (diffusers', BFL's)."""
    sd = {k: v.detach().clone() for k, v in model.state_dict().items()}
    bfl = to_bfl(sd)
    back = from_bfl(bfl)
    if back.keys() != sd.keys() or any(not torch.equal(back[k], sd[k]) for k in sd):
        raise SystemExit("the BFL file does not convert back to the diffusers weights")
    save_file({k: v.contiguous() for k, v in bfl.items()}, path)
    return sd, bfl


def config(exe, work, name, arch, weights, resolution):
    """A LoRA run on synthetic data (2 steps, float32, GC on, text cached) on the BFL file."""
    gclab(exe, "synth", "--out", os.path.join(work, "data"), "--count", "2", "--sizes", f"{resolution}x{resolution}")
    path = os.path.join(work, name + ".yaml")
    with open(path, "w") as f:
        f.write(f"""job: extension
config:
  name: {name}
  process:
    - type: sd_trainer
      training_folder: {work}/out
      device: cpu
      network: {{type: lora, linear: 4, linear_alpha: 4}}
      save: {{dtype: float32, save_every: 1000}}
      datasets:
        - folder_path: {work}/data
          resolution: [{resolution}]
      train: {{batch_size: 1, steps: 2, lr: 0.05, optimizer: adamw, dtype: fp32, gradient_checkpointing: true,
              cache_text_embeddings: true, disable_sampling: true}}
      model:
        arch: {arch}
        name_or_path: {weights}
""")
    return path


def forward(exe, cfg, work, inputs, name, extra=()):
    """`gclab forward` on the tensors `inputs` (saved as WORK/name.safetensors): its prediction."""
    path = os.path.join(work, name + ".safetensors")
    save_file({k: v.contiguous() for k, v in inputs.items()}, path)
    out = os.path.join(work, "gclab_out.safetensors")
    gclab(exe, "forward", cfg, "--inputs", path, "--out", out, *extra)
    return load_file(out)["prediction"]


def check_bf16(what, ours16, ref32, ref16):
    """The two bf16 computations round in their own places (fused projections, float32 embeddings): each is
    held to the float32 function on the same bf16 inputs, gclab's distance of diffusers' own order."""
    own = ((ref16 - ref32).abs().max() / ref32.abs().max()).item()
    print(f"diffusers in bf16: {own:.2e} from float32")
    compare(f"{what} in bf16 (against float32)", ours16.float(), ref32, max(2 * own, BF16_TOL))
    compare(f"{what} in bf16 (against diffusers in bf16)", ours16.float(), ref16, 3 * max(own, BF16_TOL / 2))


def trained_lora(exe, cfg, work, name, bfl, key, shape):
    """Trains the run's LoRA and reads its file: AI Toolkit's keys (`key` of `shape` present, the blocks only);
    returns (file, BFL weights with every adapter merged: W += B A, alpha = rank)."""
    gclab(exe, "train", cfg)
    lora_file = os.path.join(work, "out", name, name + ".safetensors")
    lora = load_file(lora_file)
    if key not in lora or tuple(lora[key].shape) != tuple(shape):
        raise SystemExit(f"the LoRA file lacks {key} {list(shape)}: {sorted(lora)[:4]}")
    if any(not k.startswith(("diffusion_model.double_blocks.", "diffusion_model.single_blocks.")) for k in lora):
        raise SystemExit(f"AI Toolkit's LoRA for this model adapts the blocks only: {sorted(lora)[:4]}")
    merged = dict(bfl)
    for k in lora:
        if k.endswith(".lora_A.weight"):
            base = k[len("diffusion_model."):-len(".lora_A.weight")]
            merged[base + ".weight"] = merged[base + ".weight"] + lora[k.replace("lora_A", "lora_B")] @ lora[k]
    return lora_file, merged


def check_lora(what, ours, ref, base):
    if ((ref - base).abs().max() / ref.abs().max()).item() < 100 * TOL:
        raise SystemExit("the trained LoRA barely changes the output; the test proves nothing")
    compare(f"{what} with gclab's LoRA (merged in diffusers)", ours, ref)
