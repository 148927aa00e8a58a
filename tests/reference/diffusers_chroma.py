"""gclab's Chroma against diffusers' ChromaTransformer2DModel (the pinned `diffusers` in .venv, a test-only
reference), end to end through gclab's command line:

  diffusers_chroma.py GCLAB_EXE WORK_DIR

AI Toolkit trains Chroma in the Black Forest Labs layout (its copy of BFL's code, chroma/src/: fused `qkv`,
`linear1` / `linear2`, QK norms' `scale`) and loads lodestones' single-file checkpoints in it; gclab does the
same. So a tiny random diffusers model is written as such a file, by the inverse of diffusers' own
convert_chroma_transformer_checkpoint_to_diffusers (loaders/single_file_utils.py: qkv split in three,
linear1 in q, k, v and the MLP, in_layer/out_layer -> linear_1/linear_2, scale -> weight; its single-block
split is written for the full width, so the tiny one is split here by the same rule), and:

1. `gclab forward` with model.name_or_path = that file (shape from its tensors, weights unchanged) must give
   diffusers' output on the same inputs to float32 rounding — with a text mask (the prompt's tokens and
   one padding token after them attended, ChromaPipeline's `<=`), in float32 and in bf16.
2. A batch whose prompts have different lengths: AI Toolkit's mask is the union over the batch
   (chroma/src/model.py:237-250, `mask.T @ mask`), so each sample equals diffusers run with the longest
   prompt's mask.
3. A LoRA gclab trains is saved under AI Toolkit's keys (`diffusion_model.double_blocks.0.img_attn.qkv.lora_A.weight`:
   one adapter over the fused projection) and, merged into the BFL weights here (W += B A, alpha = rank),
   converted and run in diffusers, gives what `gclab forward --lora` gives.

The approximator's RMSNorm: AI Toolkit's is F.rms_norm with eps 1e-6 (chroma/src/layers.py RMSNorm);
diffusers' nn.RMSNorm(hidden) takes the dtype's eps. The reference is given eps 1e-6 (AI Toolkit's function).
"""
import os
import shutil
import subprocess
import sys

import torch
from safetensors.torch import load_file, save_file

TOL = 1e-5
BF16_TOL = 2e-2  # as tests/reference/diffusers_interop.py: bf16 rounding through a few blocks
B, H, W, T = 2, 16, 12, 7
HEADS, HEAD_DIM, TEXT_DIM, APPROX = 2, 128, 32, 48  # heads 128 wide: the rotary axes a file cannot say are 16, 56, 56


def build():
    import diffusers
    m = diffusers.ChromaTransformer2DModel(patch_size=1, in_channels=64, num_layers=2, num_single_layers=2,
                                           attention_head_dim=HEAD_DIM, num_attention_heads=HEADS,
                                           joint_attention_dim=TEXT_DIM, axes_dims_rope=(16, 56, 56),
                                           approximator_num_channels=64, approximator_hidden_dim=APPROX,
                                           approximator_layers=5)
    for n in m.distilled_guidance_layer.norms:
        n.eps = 1e-6
    with torch.no_grad():
        for p in m.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return m.eval()


def to_bfl(sd):
    """diffusers' names -> BFL's: the inverse of convert_chroma_transformer_checkpoint_to_diffusers."""
    out, cat = {}, lambda *ts: torch.cat(ts, 0)  # noqa: E731
    for k, v in sd.items():
        if k.startswith("distilled_guidance_layer."):
            k = k.replace(".linear_1.", ".in_layer.").replace(".linear_2.", ".out_layer.")
            if ".norms." in k:
                k = k.replace(".weight", ".scale")
            out[k] = v
    for a, b in (("context_embedder", "txt_in"), ("x_embedder", "img_in"), ("proj_out", "final_layer.linear")):
        for s in ("weight", "bias"):
            out[f"{b}.{s}"] = sd[f"{a}.{s}"]
    i = 0
    while f"transformer_blocks.{i}.attn.to_q.weight" in sd:
        p, q = f"transformer_blocks.{i}.", f"double_blocks.{i}."
        for s in ("weight", "bias"):
            out[q + f"img_attn.qkv.{s}"] = cat(*(sd[p + f"attn.to_{x}.{s}"] for x in "qkv"))
            out[q + f"txt_attn.qkv.{s}"] = cat(*(sd[p + f"attn.add_{x}_proj.{s}"] for x in "qkv"))
            out[q + f"img_attn.proj.{s}"] = sd[p + f"attn.to_out.0.{s}"]
            out[q + f"txt_attn.proj.{s}"] = sd[p + f"attn.to_add_out.{s}"]
            out[q + f"img_mlp.0.{s}"], out[q + f"img_mlp.2.{s}"] = sd[p + f"ff.net.0.proj.{s}"], sd[p + f"ff.net.2.{s}"]
            out[q + f"txt_mlp.0.{s}"] = sd[p + f"ff_context.net.0.proj.{s}"]
            out[q + f"txt_mlp.2.{s}"] = sd[p + f"ff_context.net.2.{s}"]
        for a, b in (("norm_q", "img_attn.norm.query_norm"), ("norm_k", "img_attn.norm.key_norm"),
                     ("norm_added_q", "txt_attn.norm.query_norm"), ("norm_added_k", "txt_attn.norm.key_norm")):
            out[q + b + ".scale"] = sd[p + f"attn.{a}.weight"]
        i += 1
    i = 0
    while f"single_transformer_blocks.{i}.attn.to_q.weight" in sd:
        p, q = f"single_transformer_blocks.{i}.", f"single_blocks.{i}."
        for s in ("weight", "bias"):
            out[q + f"linear1.{s}"] = cat(*(sd[p + f"attn.to_{x}.{s}"] for x in "qkv"), sd[p + f"proj_mlp.{s}"])
            out[q + f"linear2.{s}"] = sd[p + f"proj_out.{s}"]
        out[q + "norm.query_norm.scale"] = sd[p + "attn.norm_q.weight"]
        out[q + "norm.key_norm.scale"] = sd[p + "attn.norm_k.weight"]
        i += 1
    if sum(v.numel() for v in out.values()) != sum(v.numel() for v in sd.values()):
        raise SystemExit("the BFL state dict does not hold every diffusers weight once")
    return out


def from_bfl(bfl):
    """BFL's names -> diffusers': convert_chroma_transformer_checkpoint_to_diffusers's rule at this width."""
    sd = {}
    for k, v in bfl.items():
        if k.startswith("distilled_guidance_layer."):
            sd[k.replace(".in_layer.", ".linear_1.").replace(".out_layer.", ".linear_2.").replace(".scale", ".weight")] = v
    for a, b in (("context_embedder", "txt_in"), ("x_embedder", "img_in"), ("proj_out", "final_layer.linear")):
        for s in ("weight", "bias"):
            sd[f"{a}.{s}"] = bfl[f"{b}.{s}"]
    i = 0
    while f"double_blocks.{i}.img_attn.qkv.weight" in bfl:
        p, q = f"transformer_blocks.{i}.", f"double_blocks.{i}."
        for s in ("weight", "bias"):
            for x, t in zip("qkv", bfl[q + f"img_attn.qkv.{s}"].chunk(3, 0)):
                sd[p + f"attn.to_{x}.{s}"] = t
            for x, t in zip("qkv", bfl[q + f"txt_attn.qkv.{s}"].chunk(3, 0)):
                sd[p + f"attn.add_{x}_proj.{s}"] = t
            sd[p + f"attn.to_out.0.{s}"] = bfl[q + f"img_attn.proj.{s}"]
            sd[p + f"attn.to_add_out.{s}"] = bfl[q + f"txt_attn.proj.{s}"]
            sd[p + f"ff.net.0.proj.{s}"], sd[p + f"ff.net.2.{s}"] = bfl[q + f"img_mlp.0.{s}"], bfl[q + f"img_mlp.2.{s}"]
            sd[p + f"ff_context.net.0.proj.{s}"] = bfl[q + f"txt_mlp.0.{s}"]
            sd[p + f"ff_context.net.2.{s}"] = bfl[q + f"txt_mlp.2.{s}"]
        for a, b in (("norm_q", "img_attn.norm.query_norm"), ("norm_k", "img_attn.norm.key_norm"),
                     ("norm_added_q", "txt_attn.norm.query_norm"), ("norm_added_k", "txt_attn.norm.key_norm")):
            sd[p + f"attn.{a}.weight"] = bfl[q + b + ".scale"]
        i += 1
    i = 0
    while f"single_blocks.{i}.linear1.weight" in bfl:
        p, q = f"single_transformer_blocks.{i}.", f"single_blocks.{i}."
        d = bfl[q + "linear2.weight"].shape[0]
        for s in ("weight", "bias"):
            parts = torch.split(bfl[q + f"linear1.{s}"], [d, d, d, bfl[q + f"linear1.{s}"].shape[0] - 3 * d], 0)
            for x, t in zip(("attn.to_q", "attn.to_k", "attn.to_v", "proj_mlp"), parts):
                sd[p + f"{x}.{s}"] = t
            sd[p + f"proj_out.{s}"] = bfl[q + f"linear2.{s}"]
        sd[p + "attn.norm_q.weight"] = bfl[q + "norm.query_norm.scale"]
        sd[p + "attn.norm_k.weight"] = bfl[q + "norm.key_norm.scale"]
        i += 1
    return sd


def pack(lat):
    b, c, h, w = lat.shape
    return lat.view(b, c, h // 2, 2, w // 2, 2).permute(0, 2, 4, 1, 3, 5).reshape(b, (h // 2) * (w // 2), c * 4)


def unpack(tokens, c, h, w):
    b = tokens.shape[0]
    return tokens.view(b, h // 2, w // 2, c, 2, 2).permute(0, 3, 1, 4, 2, 5).reshape(b, c, h, w)


def ids(h, w):
    i = torch.zeros(h // 2, w // 2, 3)
    i[..., 1] = torch.arange(h // 2)[:, None]
    i[..., 2] = torch.arange(w // 2)[None, :]
    return i.reshape(-1, 3)


@torch.no_grad()
def velocity(m, d, lengths):
    """diffusers' prediction, each sample's prompt `lengths[i]` tokens: it and one padding row attended."""
    lat = d["latents"]
    n = (H // 2) * (W // 2)
    mask = torch.ones(lat.shape[0], T + n, dtype=torch.bool)
    for i, length in enumerate(lengths):
        mask[i, min(length + 1, T):T] = False
    out = m(hidden_states=pack(lat), encoder_hidden_states=d["text"], timestep=d["timestep"], img_ids=ids(H, W),
            txt_ids=torch.zeros(T, 3), attention_mask=mask, return_dict=False)[0]
    return unpack(out, 16, H, W)


def compare(what, ours, ref, tol=TOL):
    if ours.shape != ref.shape:
        raise SystemExit(f"{what}: gclab's shape {tuple(ours.shape)}, diffusers' {tuple(ref.shape)}")
    err = ((ours - ref).abs().max() / ref.abs().max()).item()
    print(f"{what}: max |gclab - diffusers| / max |diffusers| = {err:.2e}")
    if not err < tol:
        raise SystemExit(f"{what}: gclab differs from diffusers ({err:.2e} >= {tol:.0e})")


def gclab(exe, *args):
    r = subprocess.run([exe, *args], capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"gclab {' '.join(args)} exited {r.returncode}:\n{r.stdout}\n{r.stderr}")
    return r.stdout


def config(work, weights):
    path = os.path.join(work, "chroma.yaml")
    with open(path, "w") as f:
        f.write(f"""job: extension
config:
  name: chroma
  process:
    - type: sd_trainer
      training_folder: {work}/out
      device: cpu
      network: {{type: lora, linear: 4, linear_alpha: 4}}
      save: {{dtype: float32, save_every: 1000}}
      datasets:
        - folder_path: {work}/data
          resolution: [128]
      train:
        batch_size: 1
        steps: 2
        lr: 0.05
        optimizer: adamw
        dtype: fp32
        gradient_checkpointing: true
        cache_text_embeddings: true
        disable_sampling: true
      model:
        arch: chroma
        name_or_path: {weights}
""")
    return path


def forward(exe, cfg, work, inputs, extra=()):
    out = os.path.join(work, "gclab_out.safetensors")
    gclab(exe, "forward", cfg, "--inputs", inputs, "--out", out, *extra)
    return load_file(out)["prediction"]


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
    m = build()
    sd = {k: v.detach().clone() for k, v in m.state_dict().items()}
    bfl = to_bfl(sd)
    back = from_bfl(bfl)
    if back.keys() != sd.keys() or any(not torch.equal(back[k], sd[k]) for k in sd):
        raise SystemExit("the BFL file does not convert back to the diffusers weights")
    weights = os.path.join(work, "chroma-tiny.safetensors")
    save_file({k: v.contiguous() for k, v in bfl.items()}, weights)
    gclab(exe, "synth", "--out", os.path.join(work, "data"), "--count", "2", "--sizes", "128x128")
    cfg = config(work, weights)

    g = torch.Generator().manual_seed(7)
    d = {"latents": torch.randn(B, 16, H, W, generator=g), "timestep": torch.tensor([0.3, 0.85]),
         "text": torch.randn(B, T, TEXT_DIM, generator=g)}

    def run(lengths, name, dtype=torch.float32):
        x = {k: (v if k == "timestep" else v.to(dtype)) for k, v in d.items()}
        if dtype == torch.bfloat16:
            # diffusers rounds the timestep to the hidden dtype and multiplies by 1000 there
            # (transformer_chroma.py:517); AI Toolkit's Chroma keeps it float32 (chroma/src/model.py:206): times
            # whose thousandfold bf16 holds exactly.
            x["timestep"] = torch.tensor([0.25, 0.5])
        mask = torch.zeros(B, T, dtype=torch.long)
        for i, length in enumerate(lengths):
            mask[i, :length] = 1
        x["text_mask"] = mask
        path = os.path.join(work, name + ".safetensors")
        save_file({k: v.contiguous() for k, v in x.items()}, path)
        extra = ("--dtype", "bf16") if dtype == torch.bfloat16 else ()
        return forward(exe, cfg, work, path, extra), x

    # 1. Equal prompt lengths (5 tokens of 7): diffusers' per-sample mask is AI Toolkit's union.
    ours, x = run([5, 5], "equal")
    compare("chroma forward, prompts of 5 of 7 rows", ours, velocity(m, x, [5, 5]))
    unmasked = velocity(m, x, [T, T])
    if ((unmasked - velocity(m, x, [5, 5])).abs().max() / unmasked.abs().max()).item() < 1e-3:
        raise SystemExit("the mask changes nothing here; the test proves nothing")
    m16 = build()
    m16.load_state_dict(m.state_dict())
    m16.to(torch.bfloat16)
    ours16, x16 = run([5, 5], "equal_bf16", torch.bfloat16)
    # The two bf16 computations round in their own places (a fused qkv beside three projections, float32
    # embeddings): each is compared with the float32 function on the same bf16 inputs, and gclab's distance
    # must be of diffusers' own order (measured here: diffusers 1.2e-2, gclab 1.6e-2; the two 2.0e-2 apart).
    ref32 = velocity(m, {k: (v.float() if v.is_floating_point() else v) for k, v in x16.items()}, [5, 5])
    ref16 = velocity(m16, x16, [5, 5]).float()
    own = ((ref16 - ref32).abs().max() / ref32.abs().max()).item()
    print(f"diffusers in bf16: {own:.2e} from float32")
    compare("chroma forward in bf16 (against float32)", ours16.float(), ref32, max(2 * own, BF16_TOL))
    compare("chroma forward in bf16 (against diffusers in bf16)", ours16.float(), ref16, 3 * max(own, BF16_TOL / 2))
    del m16
    # 2. Different lengths: each sample as diffusers gives it under the longest prompt's mask.
    ours, x = run([2, 5], "ragged")
    compare("chroma forward, prompts of 2 and 5 rows (the batch's union)", ours, velocity(m, x, [5, 5]))

    # 3. A LoRA on the fused projections, under AI Toolkit's keys.
    gclab(exe, "train", cfg)
    lora_file = os.path.join(work, "out", "chroma", "chroma.safetensors")
    lora = load_file(lora_file)
    key = "diffusion_model.double_blocks.0.img_attn.qkv.lora_A.weight"
    if key not in lora or lora[key].shape != (4, HEADS * HEAD_DIM):
        raise SystemExit(f"the LoRA file lacks {key} [4, {HEADS * HEAD_DIM}]: {sorted(lora)[:4]}")
    if any(not k.startswith(("diffusion_model.double_blocks.", "diffusion_model.single_blocks.")) for k in lora):
        raise SystemExit(f"AI Toolkit's Chroma LoRA adapts the blocks only: {sorted(lora)[:4]}")
    merged = dict(bfl)
    for k in lora:
        if k.endswith(".lora_A.weight"):
            name = k[len("diffusion_model."):-len(".lora_A.weight")]
            merged[name + ".weight"] = merged[name + ".weight"] + lora[k.replace("lora_A", "lora_B")] @ lora[k]
    _, x = run([5, 5], "lora")
    base = velocity(m, x, [5, 5])
    m.load_state_dict(from_bfl(merged))
    ours = forward(exe, cfg, work, os.path.join(work, "lora.safetensors"), ("--lora", lora_file))
    ref = velocity(m, x, [5, 5])
    if ((ref - base).abs().max() / ref.abs().max()).item() < 100 * TOL:
        raise SystemExit("the trained LoRA barely changes the output; the test proves nothing")
    compare("chroma forward with gclab's LoRA (merged in diffusers)", ours, ref)
    print("chroma: gclab and diffusers agree")


if __name__ == "__main__":
    main()
