"""gclab's FLUX.2 transformers (klein, and dev with its guidance embedder) against diffusers' Flux2Transformer2DModel (the pinned `diffusers` in .venv, a
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
   FLUX.2-dev's guidance embedder (guidance_in, BFL's names for time_guidance_embed.guidance_embedder) is
   checked the same way on a tiny model with it, at two guidance scales (float32).
2. A LoRA gclab trains is saved under AI Toolkit's keys (`diffusion_model.double_blocks.0.img_attn.qkv.lora_A.weight`)
   and, merged into the BFL weights here (W += B A, alpha = rank), converted and run in diffusers, gives what
   `gclab forward --lora` gives.

The rotary tables: AI Toolkit's are float32 from int64 ids (src/model.py rope), diffusers' float64; at these
positions the two agree to float32 rounding.
"""
import os
import sys

import torch

from bfl_interop import (BF16_TIMES, check_bf16, check_lora, compare, config, forward, start, trained_lora,
                         write_bfl)

B, H, W, T = 2, 6, 4, 7  # latents [B, 128, 6, 4]: 24 image tokens (an image of 96 x 64)
REF_H, REF_W = 4, 6  # one reference image of another size
HEADS, HEAD_DIM, TEXT_DIM = 2, 128, 96  # heads 128 wide: the rotary axes a file cannot say are 4 x 32

RENAME = {  # convert_flux2_transformer_checkpoint_to_diffusers's names, diffusers' -> BFL's
    "x_embedder": "img_in", "context_embedder": "txt_in",
    "time_guidance_embed.timestep_embedder.linear_1": "time_in.in_layer",
    "time_guidance_embed.timestep_embedder.linear_2": "time_in.out_layer",
    "time_guidance_embed.guidance_embedder.linear_1": "guidance_in.in_layer",
    "time_guidance_embed.guidance_embedder.linear_2": "guidance_in.out_layer",
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


def build(guidance_embeds=False):
    import diffusers
    m = diffusers.Flux2Transformer2DModel(patch_size=1, in_channels=128, num_layers=2, num_single_layers=2,
                                          attention_head_dim=HEAD_DIM, num_attention_heads=HEADS,
                                          joint_attention_dim=TEXT_DIM, guidance_embeds=guidance_embeds)
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
            txt_ids=txt_ids, guidance=d.get("guidance"), return_dict=False)[0]
    return out[:, : H * W].transpose(1, 2).reshape(lat.shape[0], 128, H, W)


def main():
    exe, work = sys.argv[1], sys.argv[2]
    start(work)
    torch.manual_seed(0)
    m = build()
    weights = os.path.join(work, "flux-2-klein-tiny.safetensors")
    _, bfl = write_bfl(m, to_bfl, from_bfl, weights)  # diffusers' own converter takes it back
    cfg = config(exe, work, "klein", "flux2_klein_4b", weights, 64)
    g = torch.Generator().manual_seed(7)
    d = {"latents": torch.randn(B, 128, H, W, generator=g), "timestep": torch.tensor([0.3, 0.85]),
         "text": torch.randn(B, T, TEXT_DIM, generator=g),
         "reference_latents.0": torch.randn(B, 128, REF_H, REF_W, generator=g)}

    def run(name, dtype=torch.float32):
        x = {k: (v if k == "timestep" else v.to(dtype)) for k, v in d.items()}
        if dtype == torch.bfloat16:
            x["timestep"] = BF16_TIMES  # AI Toolkit rounds the 0-1000 value (flux2_model.py:450)
        return forward(exe, cfg, work, x, name, ("--dtype", "bf16") if dtype == torch.bfloat16 else ()), x

    ours, x = run("fp32")
    compare("klein forward with a reference image", ours, velocity(m, x))
    m16 = build()
    m16.load_state_dict(m.state_dict())
    m16.to(torch.bfloat16)
    ours16, x16 = run("bf16", torch.bfloat16)
    check_bf16("klein forward", ours16, velocity(m, {k: v.float() for k, v in x16.items()}), velocity(m16, x16).float())
    del m16

    # 2. A LoRA on the fused projections, under AI Toolkit's keys: one adapter over gate and up.
    lora_file, merged = trained_lora(exe, cfg, work, "klein", bfl, "diffusion_model.double_blocks.0.img_mlp.0.lora_B.weight",
                                     (2 * 3 * HEADS * HEAD_DIM, 4))
    base = velocity(m, x)
    m.load_state_dict(from_bfl(merged))
    ours = forward(exe, cfg, work, x, "fp32", ("--lora", lora_file))
    check_lora("klein forward", ours, velocity(m, x), base)

    # FLUX.2-dev's guidance embedder: the scale embedded as the timestep is (1000 g), added to the time vector.
    dev = build(guidance_embeds=True)
    dev_weights = os.path.join(work, "flux2-dev-tiny.safetensors")
    write_bfl(dev, to_bfl, from_bfl, dev_weights)
    dev_cfg = config(exe, work, "dev", "flux2", dev_weights, 64)
    outs = []
    for g in (1.0, 4.0):  # train.cfg_scale's default; the UI's preview guidance_scale
        xd = dict(d, guidance=torch.full((B,), g))
        outs.append(forward(exe, dev_cfg, work, xd, "dev"))
        compare(f"dev forward at guidance {g:g}", outs[-1], velocity(dev, xd))
    if ((outs[0] - outs[1]).abs().max() / outs[1].abs().max()).item() < 1e-3:
        raise SystemExit("the guidance scale barely moves the output; the test proves nothing")
    print("flux2 klein and dev: gclab and diffusers agree")


if __name__ == "__main__":
    main()
