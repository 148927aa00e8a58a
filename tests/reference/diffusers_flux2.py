"""gclab's FLUX.2 klein transformer against diffusers' Flux2Transformer2DModel (the pinned `diffusers` in .venv, a
test-only reference), end to end through gclab's command line:

  diffusers_flux2.py GCLAB_EXE WORK_DIR

AI Toolkit trains FLUX.2 in the Black Forest Labs layout (its copy of BFL's code, flux2/src/model.py: fused `qkv`,
`linear1` / `linear2`, `img_mlp.0` over gate and up, QK norms' `scale`, the final modulation's shift before its
scale) and loads BFL's single files (flux-2-klein-base-4b.safetensors) in it; gclab does the same. So a tiny random
diffusers model is written as such a file by the inverse of diffusers' own convert_flux2_transformer_checkpoint_to_
diffusers (loaders/single_file_utils.py), which is run on it to check the inverse, and:

1. `gclab forward` with model.name_or_path = that file (shape from its tensors, weights unchanged) must give
   diffusers' output on the same inputs to float32 rounding — with a reference image's tokens after the noisy
   ones at time coordinate 10, its own grid (AI Toolkit's encode_image_refs ids) — in float32 and in bf16.
2. A LoRA gclab trains is saved under AI Toolkit's keys (`diffusion_model.double_blocks.0.img_attn.qkv.lora_A.weight`)
   and, merged into the BFL weights here (W += B A, alpha = rank), converted and run in diffusers, gives what
   `gclab forward --lora` gives.

The rotary tables: AI Toolkit's are float32 from int64 ids (src/model.py rope), diffusers' float64; at these
positions the two agree to float32 rounding.
"""
import os
import shutil
import subprocess
import sys

import torch
from safetensors.torch import load_file, save_file

TOL = 1e-5
BF16_TOL = 2e-2  # as tests/reference/diffusers_interop.py: bf16 rounding through a few blocks
B, H, W, T = 2, 6, 4, 7  # latents [B, 128, 6, 4]: 24 image tokens (an image of 96 x 64)
REF_H, REF_W = 4, 6  # one reference image of another size
HEADS, HEAD_DIM, TEXT_DIM = 2, 128, 96  # heads 128 wide: the rotary axes a file cannot say are 4 x 32

RENAME = {  # convert_flux2_transformer_checkpoint_to_diffusers's names, diffusers' -> BFL's
    "x_embedder": "img_in", "context_embedder": "txt_in",
    "time_guidance_embed.timestep_embedder.linear_1": "time_in.in_layer",
    "time_guidance_embed.timestep_embedder.linear_2": "time_in.out_layer",
    "double_stream_modulation_img.linear": "double_stream_modulation_img.lin",
    "double_stream_modulation_txt.linear": "double_stream_modulation_txt.lin",
    "single_stream_modulation.linear": "single_stream_modulation.lin",
    "proj_out": "final_layer.linear",
}
DOUBLE = {"attn.norm_q": "img_attn.norm.query_norm", "attn.norm_k": "img_attn.norm.key_norm",
          "attn.to_out.0": "img_attn.proj", "ff.linear_in": "img_mlp.0", "ff.linear_out": "img_mlp.2",
          "attn.norm_added_q": "txt_attn.norm.query_norm", "attn.norm_added_k": "txt_attn.norm.key_norm",
          "attn.to_add_out": "txt_attn.proj", "ff_context.linear_in": "txt_mlp.0",
          "ff_context.linear_out": "txt_mlp.2"}
SINGLE = {"attn.to_qkv_mlp_proj": "linear1", "attn.to_out": "linear2", "attn.norm_q": "norm.query_norm",
          "attn.norm_k": "norm.key_norm"}


def build():
    import diffusers
    m = diffusers.Flux2Transformer2DModel(patch_size=1, in_channels=128, num_layers=2, num_single_layers=2,
                                          attention_head_dim=HEAD_DIM, num_attention_heads=HEADS,
                                          joint_attention_dim=TEXT_DIM, guidance_embeds=False)
    with torch.no_grad():
        for p in m.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return m.eval()


def to_bfl(sd):
    """diffusers' names -> BFL's: the inverse of convert_flux2_transformer_checkpoint_to_diffusers."""
    out = {}
    for k, v in sd.items():
        name, kind = k.rsplit(".", 1)
        if name in RENAME:
            out[RENAME[name] + "." + kind] = v
        elif name == "norm_out.linear":  # diffusers' scale, shift -> BFL's shift, scale
            scale, shift = v.chunk(2, 0)
            out["final_layer.adaLN_modulation.1." + kind] = torch.cat([shift, scale], 0)
        elif name.startswith("transformer_blocks."):
            i, rest = name.split(".", 2)[1:]
            base = f"double_blocks.{i}."
            if rest in ("attn.to_q", "attn.to_k", "attn.to_v", "attn.add_q_proj", "attn.add_k_proj", "attn.add_v_proj"):
                continue  # fused below
            out[base + DOUBLE[rest] + "." + ("scale" if "norm" in rest else kind)] = v
        elif name.startswith("single_transformer_blocks."):
            i, rest = name.split(".", 2)[1:]
            out[f"single_blocks.{i}." + SINGLE[rest] + "." + ("scale" if "norm" in rest else kind)] = v
        else:
            raise SystemExit(f"no BFL name for {k}")
    i = 0
    while f"transformer_blocks.{i}.attn.to_q.weight" in sd:
        p = f"transformer_blocks.{i}.attn."
        out[f"double_blocks.{i}.img_attn.qkv.weight"] = torch.cat([sd[p + f"to_{x}.weight"] for x in "qkv"], 0)
        out[f"double_blocks.{i}.txt_attn.qkv.weight"] = torch.cat([sd[p + f"add_{x}_proj.weight"] for x in "qkv"], 0)
        i += 1
    return out


def from_bfl(bfl):
    from diffusers.loaders.single_file_utils import convert_flux2_transformer_checkpoint_to_diffusers
    return convert_flux2_transformer_checkpoint_to_diffusers(dict(bfl))


def ids(h, w, t=0):  # prc_img: (t, row, column, 0)
    i = torch.zeros(h, w, 4, dtype=torch.long)
    i[..., 0] = t
    i[..., 1] = torch.arange(h)[:, None]
    i[..., 2] = torch.arange(w)[None, :]
    return i.reshape(-1, 4)


@torch.no_grad()
def velocity(m, d):
    """diffusers' prediction on gclab's inputs: the tokens of the latents, then of the reference."""
    lat, ref = d["latents"], d["reference_latents.0"]
    tokens = torch.cat([lat.flatten(2).transpose(1, 2), ref.flatten(2).transpose(1, 2)], 1)
    img_ids = torch.cat([ids(H, W), ids(REF_H, REF_W, 10)], 0)
    txt_ids = torch.zeros(T, 4, dtype=torch.long)
    txt_ids[:, 3] = torch.arange(T)
    out = m(hidden_states=tokens, encoder_hidden_states=d["text"], timestep=d["timestep"], img_ids=img_ids,
            txt_ids=txt_ids, guidance=None, return_dict=False)[0]
    return out[:, : H * W].transpose(1, 2).reshape(lat.shape[0], 128, H, W)


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
    path = os.path.join(work, "klein.yaml")
    with open(path, "w") as f:
        f.write(f"""job: extension
config:
  name: klein
  process:
    - type: sd_trainer
      training_folder: {work}/out
      device: cpu
      network: {{type: lora, linear: 4, linear_alpha: 4}}
      save: {{dtype: float32, save_every: 1000}}
      datasets:
        - folder_path: {work}/data
          resolution: [64]
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
        arch: flux2_klein_4b
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
        raise SystemExit("diffusers' converter does not take the BFL file back to the diffusers weights")
    weights = os.path.join(work, "flux-2-klein-tiny.safetensors")
    save_file({k: v.contiguous() for k, v in bfl.items()}, weights)
    gclab(exe, "synth", "--out", os.path.join(work, "data"), "--count", "2", "--sizes", "64x64")
    cfg = config(work, weights)

    g = torch.Generator().manual_seed(7)
    d = {"latents": torch.randn(B, 128, H, W, generator=g), "timestep": torch.tensor([0.3, 0.85]),
         "text": torch.randn(B, T, TEXT_DIM, generator=g),
         "reference_latents.0": torch.randn(B, 128, REF_H, REF_W, generator=g)}

    def run(name, dtype=torch.float32):
        x = {k: (v if k == "timestep" else v.to(dtype)) for k, v in d.items()}
        if dtype == torch.bfloat16:
            # diffusers rounds the 0-1 timestep to bf16 and multiplies by 1000 there; AI Toolkit rounds the
            # 0-1000 value, divides and multiplies back (flux2_model.py:450): times all of whose steps bf16
            # holds exactly.
            x["timestep"] = torch.tensor([0.25, 0.5])
        path = os.path.join(work, name + ".safetensors")
        save_file({k: v.contiguous() for k, v in x.items()}, path)
        extra = ("--dtype", "bf16") if dtype == torch.bfloat16 else ()
        return forward(exe, cfg, work, path, extra), x

    ours, x = run("fp32")
    compare("klein forward with a reference image", ours, velocity(m, x))
    m16 = build()
    m16.load_state_dict(m.state_dict())
    m16.to(torch.bfloat16)
    ours16, x16 = run("bf16", torch.bfloat16)
    ref32 = velocity(m, {k: v.float() for k, v in x16.items()})
    ref16 = velocity(m16, x16).float()
    own = ((ref16 - ref32).abs().max() / ref32.abs().max()).item()
    print(f"diffusers in bf16: {own:.2e} from float32")
    compare("klein forward in bf16 (against float32)", ours16.float(), ref32, max(2 * own, BF16_TOL))
    compare("klein forward in bf16 (against diffusers in bf16)", ours16.float(), ref16, 3 * max(own, BF16_TOL / 2))
    del m16

    # 2. A LoRA on the fused projections, under AI Toolkit's keys.
    gclab(exe, "train", cfg)
    lora_file = os.path.join(work, "out", "klein", "klein.safetensors")
    lora = load_file(lora_file)
    key = "diffusion_model.double_blocks.0.img_mlp.0.lora_B.weight"
    if key not in lora or lora[key].shape != (2 * 3 * HEADS * HEAD_DIM, 4):
        raise SystemExit(f"the LoRA file lacks {key} [{2 * 3 * HEADS * HEAD_DIM}, 4]: {sorted(lora)[:4]}")
    if any(not k.startswith(("diffusion_model.double_blocks.", "diffusion_model.single_blocks.")) for k in lora):
        raise SystemExit(f"AI Toolkit's FLUX.2 LoRA adapts the blocks only: {sorted(lora)[:4]}")
    merged = dict(bfl)
    for k in lora:
        if k.endswith(".lora_A.weight"):
            name = k[len("diffusion_model."):-len(".lora_A.weight")]
            merged[name + ".weight"] = merged[name + ".weight"] + lora[k.replace("lora_A", "lora_B")] @ lora[k]
    base = velocity(m, x)
    m.load_state_dict(from_bfl(merged))
    ref = velocity(m, x)
    if ((ref - base).abs().max() / ref.abs().max()).item() < 100 * TOL:
        raise SystemExit("the trained LoRA barely changes the output; the test proves nothing")
    ours = forward(exe, cfg, work, os.path.join(work, "fp32.safetensors"), ("--lora", lora_file))
    compare("klein forward with gclab's LoRA (merged in diffusers)", ours, ref)
    print("flux2 klein: gclab and diffusers agree")


if __name__ == "__main__":
    main()
