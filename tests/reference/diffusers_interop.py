"""gclab against diffusers itself (the pinned `diffusers` in .venv, a test-only reference), end to end
through gclab's command line, for one transformer family:

  diffusers_interop.py GCLAB_EXE FAMILY WORK_DIR

1. A tiny random diffusers transformer of FAMILY (flux, qwen_image, zimage, sd3; flux_kontext, qwen_image_edit and
   qwen_image_edit_2511 and flex2, forward only) is saved by diffusers' own save_pretrained as a model folder (WORK_DIR/model/transformer/{config.json, safetensors}).
2. `gclab forward` with model.name_or_path = that folder (shape from its config.json, weights from its
   safetensors, unchanged) must give diffusers' output on the same inputs to float32 rounding.
3. `gclab train` trains a LoRA on it (scale linear_alpha / linear = 2, gclab's use_linear_alpha); the LoRA file loaded into the diffusers
   model with diffusers' own loader must give the output `gclab forward --lora` gives.
4. `gclab train` fine-tunes the whole transformer with save_format: diffusers; the saved folder must load
   in diffusers (from_pretrained) and give the output gclab gives from it.

gclab's `forward` convention (include/gclab/model/forward.h): `timestep` is the flow time sigma in [0, 1]
(1 = pure noise) and `prediction` is the flow velocity noise - x0, for every family. The mapping to each
diffusers model's own inputs is what its pipeline does (FLUX / Qwen-Image: 2x2-packed tokens and position
ids, timestep sigma; SD3: timestep 1000 sigma; Z-Image: a list of [C, 1, H, W] latents, timestep 1 - sigma,
and the pipeline negates the output).
"""
import json
import os
import shutil
import sys

import torch
from safetensors.torch import load_file, save_file

from gclab_cli import compare, gclab

TOL = 1e-5  # relative to the output's largest magnitude: float32 rounding through a few blocks
# The same in bf16 (8-bit mantissa: 4e-3 a rounding) through the same few blocks. Measured here (CPU):
# FLUX 6.5e-3, SD3 5.4e-3, Z-Image 1.1e-2, Qwen-Image 6.1e-3 (its edit models 6.0e-3, 7.5e-3) — against
# diffusers' own bf16 distance from float32 of 1.2e-1, 6.4e-3, 1.6e-2, 7.3e-2. A timestep not rounded to bf16
# as diffusers rounds it gave 1.2e-1 (FLUX) and 7.3e-2 (Qwen-Image); frequencies rounded as
# transformer_qwenimage.py's unused get_timestep_embedding would round them, 3.8e-2.
BF16_TOL = 2e-2

B, H, W = 2, 16, 12  # latent size (an image of 128 x 96); 8 x 6 = 48 patches, not a multiple of 32
TEXT = {"flux": 7, "flux_kontext": 7, "flex2": 7, "qwen_image": 9, "qwen_image_edit": 9, "qwen_image_edit_2511": 9, "zimage": 20, "sd3": 11,
        "wan21": 7, "wan21_i2v": 512, "wan22_ti2v": 7}
# Wan: video latents [B, 16, F', H, W] of F' = 3 latent frames (9 frames); Wan 2.1 I2V takes its first-frame
# condition channels (mask 4 + latent 16) and CLIP's 257 image tokens, and 512 text rows (its attention
# processor takes the context's last 512 rows as the text: transformer_wan.py:87-91); Wan 2.2 TI2V one
# timestep per token (transformer_wan.py:676-691).
WAN = ("wan21", "wan21_i2v", "wan22_ti2v")
FRAMES = 3
# Z-Image: 20 tokens, padded to 32 inside. The edit models get one reference image of another size
# (Qwen-Image-Edit-2511: zero_cond_t, its reference tokens modulated by the embedding of t = 0).
EDITS = {"qwen_image_edit": False, "qwen_image_edit_2511": True}
REF_H, REF_W = 12, 20


def build(family):
    """A tiny diffusers transformer with every parameter perturbed (diffusers zero-initialises some,
    e.g. Z-Image's pad tokens, and a zero parameter hides a wrong name or layout)."""
    import diffusers
    if family in ("flux", "flux_kontext"):  # FLUX.1 Kontext: FLUX.1-dev's transformer
        m = diffusers.FluxTransformer2DModel(patch_size=1, in_channels=64, num_layers=2, num_single_layers=2,
                                             attention_head_dim=16, num_attention_heads=4, joint_attention_dim=32,
                                             pooled_projection_dim=24, guidance_embeds=True, axes_dims_rope=(4, 6, 6))
    elif family == "flex2":  # Flex.2: a 196-feature input (latent 64, inpaint latent 64, mask 4, control 64)
        m = diffusers.FluxTransformer2DModel(patch_size=1, in_channels=196, out_channels=64, num_layers=2,
                                             num_single_layers=2, attention_head_dim=16, num_attention_heads=4,
                                             joint_attention_dim=32, pooled_projection_dim=24, guidance_embeds=True,
                                             axes_dims_rope=(4, 6, 6))
    elif family == "qwen_image" or family in EDITS:
        m = diffusers.QwenImageTransformer2DModel(patch_size=2, in_channels=64, out_channels=16, num_layers=2,
                                                  attention_head_dim=16, num_attention_heads=4,
                                                  joint_attention_dim=32, axes_dims_rope=(4, 6, 6),
                                                  zero_cond_t=EDITS.get(family, False))
    elif family == "zimage":
        m = diffusers.ZImageTransformer2DModel(all_patch_size=(2,), all_f_patch_size=(1,), in_channels=16, dim=64,
                                               n_layers=2, n_refiner_layers=1, n_heads=2, n_kv_heads=2,
                                               cap_feat_dim=32, axes_dims=[8, 12, 12], axes_lens=[256, 64, 64])
    elif family == "sd3":
        m = diffusers.SD3Transformer2DModel(sample_size=32, patch_size=2, in_channels=16, num_layers=2,
                                            attention_head_dim=16, num_attention_heads=4, joint_attention_dim=32,
                                            caption_projection_dim=64, pooled_projection_dim=24, out_channels=16,
                                            pos_embed_max_size=48, qk_norm="rms_norm")
    elif family in WAN:
        i2v = family == "wan21_i2v"
        m = diffusers.WanTransformer3DModel(patch_size=(1, 2, 2), num_attention_heads=4, attention_head_dim=16,
                                            in_channels=36 if i2v else 16, out_channels=16, text_dim=32,
                                            ffn_dim=96, num_layers=2, image_dim=24 if i2v else None,
                                            added_kv_proj_dim=64 if i2v else None)
    else:
        raise SystemExit(f"unknown family {family}")
    with torch.no_grad():
        for p in m.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return m.eval()


def inputs(family):
    g = torch.Generator().manual_seed(7)
    r = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    d = {"latents": r(B, 16, H, W), "timestep": torch.tensor([0.3, 0.85]), "text": r(B, TEXT[family], 32)}
    if family in WAN:
        d["latents"] = r(B, 16, FRAMES, H, W)
    if family == "wan21_i2v":
        d["condition_channels"] = r(B, 20, FRAMES, H, W)
        d["image_embeds"] = r(B, 257, 24)
    if family == "wan22_ti2v":  # the first latent frame's tokens at t = 0, as the TI2V pipeline conditions on it
        tokens = FRAMES * (H // 2) * (W // 2)
        d["timestep"] = torch.tensor([0.3, 0.85])[:, None].repeat(1, tokens)
        d["timestep"][:, : (H // 2) * (W // 2)] = 0
    if family in ("flux", "flux_kontext", "flex2", "sd3"):
        d["pooled"] = r(B, 24)
    if family in ("flux", "flux_kontext", "flex2"):
        d["guidance"] = torch.tensor([3.5, 1.0])
    if family in EDITS or family == "flux_kontext":
        d["reference_latents.0"] = r(B, 16, REF_H, REF_W)
    return d


def flux_ids(h, w, index=0):  # FluxPipeline._prepare_latent_image_ids; Kontext's reference at index 1
    ids = torch.zeros(h // 2, w // 2, 3)
    ids[..., 0] = index
    ids[..., 1] = torch.arange(h // 2)[:, None]
    ids[..., 2] = torch.arange(w // 2)[None, :]
    return ids.reshape(-1, 3)


def pack(lat):  # [B, C, H, W] -> [B, (H/2)(W/2), 4C], the FLUX / Qwen-Image pipelines' _pack_latents
    b, c, h, w = lat.shape
    return lat.view(b, c, h // 2, 2, w // 2, 2).permute(0, 2, 4, 1, 3, 5).reshape(b, (h // 2) * (w // 2), c * 4)


def unpack(tokens, c, h, w):
    b = tokens.shape[0]
    return tokens.view(b, h // 2, w // 2, c, 2, 2).permute(0, 3, 1, 4, 2, 5).reshape(b, c, h, w)


@torch.no_grad()
def velocity(family, m, d):
    """The diffusers model's prediction on gclab's inputs, in gclab's convention."""
    lat, t = d["latents"], d["timestep"]
    if family in ("flux", "flux_kontext", "flex2"):
        if family == "flex2":
            # No inpainting or control input, as AI Toolkit's Flex2 builds it on the latents before packing
            # (extensions_built_in/flex2/flex2.py:462-482): a zero inpainting latent, a mask of ones, a zero
            # control latent.
            zeros = torch.zeros_like(lat)
            lat = torch.cat([lat, zeros, torch.ones_like(lat[:, :1]), zeros], 1)
        tokens, ids = pack(lat), flux_ids(H, W)
        if "reference_latents.0" in d:  # FluxKontextPipeline: the image's tokens appended, ids[..., 0] = 1
            ref = d["reference_latents.0"]
            tokens = torch.cat([tokens, pack(ref)], 1)
            ids = torch.cat([ids, flux_ids(ref.shape[2], ref.shape[3], index=1)], 0)
        out = m(hidden_states=tokens, encoder_hidden_states=d["text"], pooled_projections=d["pooled"],
                timestep=t, img_ids=ids, txt_ids=torch.zeros(d["text"].shape[1], 3),
                guidance=d["guidance"], return_dict=False)[0]
        return unpack(out[:, :(H // 2) * (W // 2)], 16, H, W)  # noise_pred[:, : latents.size(1)]
    if family == "qwen_image" or family in EDITS:
        # The edit pipelines append the reference image's packed tokens and list its shape after the target's.
        refs = [d[k] for k in sorted(d) if k.startswith("reference_latents.")]
        tokens = torch.cat([pack(lat)] + [pack(x) for x in refs], 1)
        shapes = [(1, H // 2, W // 2)] + [(1, x.shape[2] // 2, x.shape[3] // 2) for x in refs]
        out = m(hidden_states=tokens, encoder_hidden_states=d["text"],
                encoder_hidden_states_mask=torch.ones(B, d["text"].shape[1]), timestep=t,
                img_shapes=[shapes] * B, return_dict=False)[0]
        return unpack(out[:, :(H // 2) * (W // 2)], 16, H, W)
    if family == "sd3":
        return m(hidden_states=lat, encoder_hidden_states=d["text"], pooled_projections=d["pooled"],
                 timestep=t * 1000, return_dict=False)[0]
    if family == "zimage":
        out = m([x.unsqueeze(1) for x in lat], 1 - t, list(d["text"].unbind(0)), return_dict=False)[0]
        return -torch.stack([o.squeeze(1) for o in out])
    if family in WAN:  # WanPipeline: the latents (with an I2V model's condition channels), timestep 1000 t
        if "condition_channels" in d:
            lat = torch.cat([lat, d["condition_channels"]], 1)
        return m(hidden_states=lat, timestep=t * 1000, encoder_hidden_states=d["text"],
                 encoder_hidden_states_image=d.get("image_embeds"), return_dict=False)[0]
    raise SystemExit(family)


ARCH = {"flux": "flux", "flux_kontext": "flux_kontext", "flex2": "flex2", "qwen_image": "qwen_image", "zimage": "zimage", "sd3": "sd3",
        "qwen_image_edit": "qwen_image_edit", "qwen_image_edit_2511": "qwen_image_edit_plus",
        "wan21": "wan21", "wan21_i2v": "wan21", "wan22_ti2v": "wan21"}


def config(work, name, model_dir, extra_train="", network=True, save_format="safetensors"):
    """A tiny AI Toolkit config on the diffusers folder (synthetic data, 1 step)."""
    path = os.path.join(work, name + ".yaml")
    net = "      network: {type: lora, linear: 4, linear_alpha: 8, use_linear_alpha: true}\n" if network else ""
    with open(path, "w") as f:
        f.write(f"""job: extension
config:
  name: {name}
  process:
    - type: sd_trainer
      training_folder: {work}/out
      device: cpu
{net}      save: {{dtype: float32, save_every: 1000, save_format: {save_format}}}
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
{extra_train}      model:
        arch: {ARCH[name.split('-')[0]]}
        name_or_path: {model_dir}
""")
    return path


def gclab_forward(exe, cfg, work, extra=()):
    out = os.path.join(work, "gclab_out.safetensors")
    gclab(exe, "forward", cfg, "--inputs", os.path.join(work, "inputs.safetensors"), "--out", out, *extra)
    return load_file(out)["prediction"]


def main():
    exe, family, work = sys.argv[1], sys.argv[2], sys.argv[3]
    try:
        import diffusers  # noqa: F401
        import peft  # noqa: F401  (diffusers' LoRA loader)
    except ImportError as e:  # a machine without the references (the GPU machine): skipped, said so
        print(f"skipped: {e} (scripts/setup.sh installs the pinned diffusers and peft into .venv)")
        sys.exit(77)
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    torch.manual_seed(0)
    model_dir = os.path.join(work, "model")
    m = build(family)
    m.save_pretrained(os.path.join(model_dir, "transformer"))  # diffusers' own layout and config.json
    d = inputs(family)
    save_file({k: v.contiguous() for k, v in d.items()}, os.path.join(work, "inputs.safetensors"))

    gclab(exe, "synth", "--out", os.path.join(work, "data"), "--count", "2", "--sizes", "128x128")

    # 2. The diffusers folder's weights, unchanged, in gclab.
    cfg = config(work, family, model_dir)
    ref = velocity(family, m, d)
    compare(f"{family} forward", gclab_forward(exe, cfg, work), ref)

    # 2b. In bf16, as AI Toolkit runs these models (train.dtype bf16): the weights in bf16, no autocast, the
    # latents and text in bf16 and the timestep (and FLUX's guidance) as the pipeline hands it, float32 — so
    # each model's own casts (FLUX rounds its timestep to bf16 before the embedding; RMSNorm and RoPE compute
    # in float32) are compared, not only its layout.
    m16 = build(family)  # the same perturbed weights (torch.manual_seed(0) again below), in bf16
    m16.load_state_dict(m.state_dict())
    m16.to(torch.bfloat16)
    d16 = {k: (v if k in ("timestep", "guidance") else v.to(torch.bfloat16)) for k, v in d.items()}
    save_file({k: v.contiguous() for k, v in d16.items()}, os.path.join(work, "inputs_bf16.safetensors"))
    ref16 = velocity(family, m16, d16).float()
    out = os.path.join(work, "gclab_out_bf16.safetensors")
    gclab(exe, "forward", cfg, "--inputs", os.path.join(work, "inputs_bf16.safetensors"), "--out", out,
          "--dtype", "bf16")
    compare(f"{family} forward in bf16", load_file(out)["prediction"].float(), ref16, tol=BF16_TOL)
    del m16
    if family in EDITS or family in ("flux_kontext", "flex2", "wan21_i2v", "wan22_ti2v"):  # training and saving: checked on the others
        print(f"{family}: gclab and diffusers agree")
        return

    # 3. A LoRA gclab trained, in diffusers' own loader, at the strength it was trained at.
    gclab(exe, "train", cfg)
    lora = os.path.join(work, "out", family, family + ".safetensors")
    ours = gclab_forward(exe, cfg, work, ("--lora", lora))
    # AI Toolkit renames Qwen-Image's and Z-Image's keys to "diffusion_model." before saving (qwen_image.py
    # :418-423, z_image.py:467-472); gclab writes them so. diffusers' loader takes the prefix it is given.
    prefix = "diffusion_model" if family.startswith(("qwen_image", "zimage")) else "transformer"
    if family.startswith("wan"):
        # AI Toolkit saves Wan LoRAs in Wan's original names (wan_lora_convert.py); diffusers' Wan loader
        # converts them back (WanLoraLoaderMixin.lora_state_dict: _convert_non_diffusers_wan_lora_to_diffusers).
        from diffusers import WanPipeline
        state = WanPipeline.lora_state_dict(lora)
        if not any(k.startswith("transformer.blocks.0.attn1.to_q") for k in state):
            raise SystemExit(f"{family}: diffusers did not read gclab's Wan LoRA as Wan's: {sorted(state)[:3]}")
    m.load_lora_adapter(state if family.startswith("wan") else lora,
                        prefix="transformer" if family.startswith("wan") else prefix, adapter_name="gclab")
    with_lora = velocity(family, m, d)
    delta = ((with_lora - ref).abs().max() / ref.abs().max()).item()
    print(f"{family} LoRA changes the output by {delta:.2e} (relative)")
    if delta < 100 * TOL:
        raise SystemExit(f"{family}: the trained LoRA barely changes the output ({delta:.1e}); the test proves nothing")
    compare(f"{family} forward with gclab's LoRA", ours, with_lora)
    half = gclab_forward(exe, cfg, work, ("--lora", lora, "--lora-scale", "0.5"))
    m.set_adapters(["gclab"], weights=[0.5])
    compare(f"{family} forward with gclab's LoRA at scale 0.5", half, velocity(family, m, d))
    m.delete_adapters("gclab")

    # 4. A full fine-tune saved as a diffusers folder, in diffusers.
    ft_cfg = config(work, family + "-ft", model_dir, network=False, save_format="diffusers")
    gclab(exe, "train", ft_cfg)
    saved = os.path.join(work, "out", family + "-ft", family + "-ft")
    with open(os.path.join(saved, "transformer", "config.json")) as f:
        json.load(f)
    tuned = type(m).from_pretrained(os.path.join(saved, "transformer")).eval()
    moved = max((a - b).abs().max().item() for a, b in zip(tuned.parameters(), m.parameters()))
    if moved == 0.0:
        raise SystemExit(f"{family}: the fine-tune changed no weight")
    back_cfg = config(work, family + "-back", saved)
    compare(f"{family} fine-tuned folder (gclab vs diffusers)", gclab_forward(exe, back_cfg, work), velocity(family, tuned, d))
    print(f"{family}: gclab and diffusers agree")


if __name__ == "__main__":
    main()
