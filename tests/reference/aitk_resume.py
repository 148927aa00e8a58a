"""`gclab train` resuming from a folder AI Toolkit wrote (issue 46, row 4), against real torch / bitsandbytes
optimizer states:

  aitk_resume.py GCLAB_EXE WORK_DIR [FAMILY]   (flux, qwen_image, sd3, zimage; flux by default)

A tiny diffusers transformer of FAMILY (the interop test's) is saved as a model folder. Its LoRA'd Linears
are listed as AI Toolkit's LoRASpecialNetwork creates them, independently of gclab: the diffusers model's
named_modules order, Linears whose name holds "transformer_blocks" ("layers" for Z-Image, its
get_transformer_block_names) (toolkit/lora_special.py:484-550), each
with lora_down then lora_up (toolkit/kohya_lora.py:1030-1075). Adapters with distinct random values are
written as AI Toolkit saves them (`<name>_000000004.safetensors`, PEFT keys, training_info metadata) and
optimizer.pt is a real optimizer's state_dict() stepped on those parameters in that order with random
gradients: torch.optim.AdamW, and bitsandbytes' AdamW8bit (rank 16: some adapters have 4096 values or
more, 8-bit codes; the others float32). gclab resumes there with train.steps = 4 (no step trained) and
writes its state: its trained tensors must equal the file's and its optimizer state the pickled one,
parameter by parameter (a wrong order fails: the values differ per parameter). Then: optimizer.pt of another
rank, and one for an optimizer gclab does not map (adafactor), resume the weights with a warning and a fresh
state; gclab's own state wins over AI Toolkit's save once it is there, and gclab's rotation leaves AI
Toolkit's older save alone.
"""
import json
import os
import shutil
import subprocess
import sys

import torch
from safetensors.torch import load_file, save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from diffusers_interop import ARCH, build  # noqa: E402

RANK = 16
STEP = 4


def fail(msg):
    raise SystemExit("FAIL: " + msg)


FAMILY = sys.argv[3] if len(sys.argv) > 3 else "flux"
BLOCKS = "layers" if FAMILY == "zimage" else "transformer_blocks"
PREFIX = "diffusion_model" if FAMILY in ("qwen_image", "zimage") else "transformer"  # as AI Toolkit saves them


def aitk_linears(m):
    """AI Toolkit's unet_loras, in order: the model's named_modules, Linears whose name holds the family's
    block name (transformer_only)."""
    return [(n, mod) for n, mod in m.named_modules() if isinstance(mod, torch.nn.Linear) and BLOCKS in n]


def adapters(m, rank, seed):
    g = torch.Generator().manual_seed(seed)
    out = []  # (path, lora_down [rank, in], lora_up [out, rank])
    for n, mod in aitk_linears(m):
        down = torch.randn(rank, mod.in_features, generator=g) * 0.05
        up = torch.randn(mod.out_features, rank, generator=g) * 0.05
        out.append((n, torch.nn.Parameter(down), torch.nn.Parameter(up)))
    return out


def write_lora(path, ads, step):
    tensors = {}
    for n, down, up in ads:
        tensors[f"{PREFIX}.{n}.lora_A.weight"] = down.detach().clone()
        tensors[f"{PREFIX}.{n}.lora_B.weight"] = up.detach().clone()
    save_file(tensors, path, {"format": "pt", "training_info": json.dumps({"step": step, "epoch": 1}),
                              "software": json.dumps({"name": "ai-toolkit"})})


def stepped(opt_cls, params, steps=3, **kw):
    opt = opt_cls(params, **kw)
    g = torch.Generator().manual_seed(99)
    for _ in range(steps):
        for p in params:
            p.grad = torch.randn(p.shape, generator=g)
        opt.step()
    return opt


def config(work, name, optimizer, steps, rank=RANK, keep=4, save_every=1000):
    path = os.path.join(work, name + ".yaml")
    with open(path, "w") as f:
        f.write(f"""job: extension
config:
  name: {name}
  process:
    - type: sd_trainer
      training_folder: {work}/out
      device: cpu
      network: {{type: lora, linear: {rank}, linear_alpha: {rank}}}
      save: {{dtype: float32, save_every: {save_every}, max_step_saves_to_keep: {keep}}}
      datasets:
        - folder_path: {work}/data
          resolution: [128]
      train:
        batch_size: 1
        steps: {steps}
        lr: 0.0001
        optimizer: {optimizer}
        dtype: fp32
        cache_text_embeddings: true
        disable_sampling: true
      model:
        arch: {ARCH[FAMILY]}
        name_or_path: {work}/model
""")
    return path


def gclab(exe, *args):
    r = subprocess.run([exe, *args], capture_output=True, text=True)
    out = r.stdout + r.stderr
    if r.returncode != 0:
        fail(f"gclab {' '.join(args)} exited {r.returncode}:\n{out}")
    return out


def run_folder(work, name, ads, opt_state=None):
    folder = os.path.join(work, "out", name)
    shutil.rmtree(folder, ignore_errors=True)
    os.makedirs(folder)
    write_lora(os.path.join(folder, f"{name}_{STEP:09d}.safetensors"), ads, STEP)
    if opt_state is not None:
        torch.save(opt_state, os.path.join(folder, "optimizer.pt"))
    return folder


def gclab_state(folder, name, step=STEP):
    return load_file(os.path.join(folder, f"{name}_{step:09d}.state.safetensors"))


def check_weights(state, ads, what):
    for n, down, up in ads:
        for key, t in ((f"param.{n}.lora_A.weight", down), (f"param.{n}.lora_B.weight", up)):
            if key not in state:
                fail(f"{what}: gclab's state has no {key}")
            if not torch.equal(state[key], t.detach()):
                fail(f"{what}: {key} differs from the AI Toolkit file's")


def names_in_order(ads):
    out = []
    for n, down, up in ads:
        out += [(f"{n}.lora_A.weight", down), (f"{n}.lora_B.weight", up)]
    return out


def main():
    exe, work = sys.argv[1], sys.argv[2]
    try:
        import diffusers  # noqa: F401
    except ImportError as e:
        print(f"skipped: {e} (scripts/setup.sh installs the pinned diffusers into .venv)")
        sys.exit(77)
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    torch.manual_seed(0)
    m = build(FAMILY)
    m.save_pretrained(os.path.join(work, "model", "transformer"))
    gclab(exe, "synth", "--out", os.path.join(work, "data"), "--count", "2", "--sizes", "128x128")

    # 1. torch.optim.AdamW: exp_avg / exp_avg_sq per parameter, step a float tensor.
    ads = adapters(m, RANK, 1)
    params = [p for _, d, u in ads for p in (d, u)]
    opt = stepped(torch.optim.AdamW, params, lr=1e-4, eps=1e-6, weight_decay=0.01)
    folder = run_folder(work, "adamw", ads, opt.state_dict())
    log = gclab(exe, "train", config(work, "adamw", "adamw", STEP))
    if f"(AI Toolkit's save) at step {STEP}; optimizer state from" not in log:
        fail(f"adamw: the log does not say it resumed from AI Toolkit's save with its optimizer state:\n{log}")
    s = gclab_state(folder, "adamw")
    check_weights(s, ads, "adamw")
    if s["optimizer.step"].item() != 3:
        fail(f"adamw: optimizer step {s['optimizer.step'].item()}, torch's 3")
    for name, p in names_in_order(ads):
        for moment in ("exp_avg", "exp_avg_sq"):
            if not torch.equal(s[f"optimizer.{name}.{moment}"], opt.state[p][moment]):
                fail(f"adamw: {name}.{moment} is not torch's for that parameter")
    print(f"adamw: {len(params)} parameters' weights and moments resumed from AI Toolkit's files")

    # 2. bitsandbytes' AdamW8bit (AI Toolkit's default): codes, absmax, and float32 for small parameters.
    try:
        import bitsandbytes as bnb
    except ImportError:
        bnb = None
        print("bitsandbytes not installed: AdamW8bit not checked")
    if bnb is not None:
        ads8 = adapters(m, RANK, 2)
        params8 = [p for _, d, u in ads8 for p in (d, u)]
        opt8 = stepped(bnb.optim.AdamW8bit, params8, lr=1e-4, eps=1e-6, weight_decay=0.01)
        folder = run_folder(work, "adamw8bit", ads8, opt8.state_dict())
        log = gclab(exe, "train", config(work, "adamw8bit", "adamw8bit", STEP))
        if "optimizer state from" not in log:
            fail(f"adamw8bit: the optimizer state was not loaded:\n{log}")
        s = gclab_state(folder, "adamw8bit")
        check_weights(s, ads8, "adamw8bit")
        coded = 0
        for name, p in names_in_order(ads8):
            st = opt8.state[p]
            for slot, moment in ((1, "exp_avg"), (2, "exp_avg_sq")):
                ref = st[f"state{slot}"]
                if ref.dtype == torch.uint8:
                    coded += 1
                    if not torch.equal(s[f"optimizer.{name}.{moment}.codes"], ref.reshape(p.shape)):
                        fail(f"adamw8bit: {name}.{moment} codes are not bitsandbytes' state{slot}")
                    if not torch.equal(s[f"optimizer.{name}.{moment}.absmax"], st[f"absmax{slot}"]):
                        fail(f"adamw8bit: {name}.{moment} absmax is not bitsandbytes' absmax{slot}")
                elif not torch.equal(s[f"optimizer.{name}.{moment}"], ref):
                    fail(f"adamw8bit: {name}.{moment} is not bitsandbytes' float32 state{slot}")
        if FAMILY == "flux" and (coded == 0 or coded == 2 * len(params8)):
            fail(f"adamw8bit: {coded} coded moments: the test should hold both kinds")
        print(f"adamw8bit: {coded} 8-bit moments and {2 * len(params8) - coded} float32 ones resumed")

    # 3. optimizer.pt that does not map: another rank's, and an optimizer gclab does not read from AI Toolkit.
    # The weights resume, the optimizer state is fresh (nothing under optimizer.* but the step count).
    other = adapters(m, 8, 3)
    other_opt = stepped(torch.optim.AdamW, [p for _, d, u in other for p in (d, u)], steps=1, lr=1e-4)
    for name, optimizer, state in (("mismatch", "adamw", other_opt.state_dict()),
                                   ("adafactor", "adafactor", opt.state_dict())):
        folder = run_folder(work, name, ads, state)
        log = gclab(exe, "train", config(work, name, optimizer, STEP))
        if f"not loading {folder}/optimizer.pt" not in log or "a fresh optimizer state" not in log:
            fail(f"{name}: no warning that optimizer.pt was not loaded:\n{log}")
        s = gclab_state(folder, name)
        check_weights(s, ads, name)
        moments = [k for k in s if k.startswith("optimizer.") and k != "optimizer.step"]
        if moments:
            fail(f"{name}: optimizer state {moments[:3]} loaded from an optimizer.pt that does not map")
        print(f"{name}: weights resumed, optimizer.pt refused with a warning")

    # 4. gclab's own state wins once it is there, and its rotation leaves AI Toolkit's older save alone.
    folder = os.path.join(work, "out", "adamw")
    older = os.path.join(folder, "adamw_000000002.safetensors")
    write_lora(older, ads, 2)  # written last: AI Toolkit would take it as the newest
    log = gclab(exe, "train", config(work, "adamw", "adamw", STEP + 2, keep=1, save_every=1))
    if f"resumed from {folder}/adamw_{STEP:09d}.state.safetensors at step {STEP}" not in log:
        fail(f"gclab's own state did not win over AI Toolkit's save:\n{log}")
    if not os.path.exists(older) or not os.path.exists(os.path.join(folder, "optimizer.pt")):
        fail("gclab's rotation removed AI Toolkit's files")
    if os.path.exists(os.path.join(folder, f"adamw_{STEP + 1:09d}.state.safetensors")):
        fail("gclab's rotation kept more than max_step_saves_to_keep of its own saves")
    print("gclab's state wins over AI Toolkit's save; AI Toolkit's older save and optimizer.pt are kept")


if __name__ == "__main__":
    main()
