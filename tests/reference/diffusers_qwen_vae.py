"""gclab's AutoencoderKLQwenImage (the Wan 2.1 VAE Qwen-Image decodes with) against diffusers' (the pinned
`diffusers` in .venv, a test-only reference), through `gclab forward --component vae.encode|vae.decode`:

  diffusers_qwen_vae.py GCLAB_EXE WORK_DIR

A tiny random AutoencoderKLQwenImage (Qwen-Image's layout: temporal down-sampling in the last two stages,
16 latent channels with its latents_mean / latents_std), saved by diffusers' save_pretrained, must load
unchanged and give diffusers' encode (the posterior's mean, then (z - latents_mean) / latents_std as the
Qwen-Image pipelines normalise latents) and decode (z / (1 / latents_std) + latents_mean, then decode,
clamped) to float32 rounding — for an image (one frame, [B, 3, H, W]) and for videos of 5 and 9 frames, whose
chunks go through the causal convolutions' frame cache; and decode in tiles (`--vae-tile 32` against
diffusers' enable_tiling(tile_sample_min 32, stride 24): blended seams, not clamped) for an image and a
5-frame video; and the Wan 2.1 VAE (AutoencoderKLWan, the same network) from a Wan folder's config.json,
whole and in tiles (its tiled decode clamps).
Full-size parameter count: printed for the C++ test's constant. Exit 77 without diffusers.
"""
import os
import sys

import torch
from safetensors.torch import load_file, save_file

from autoencoder_forward import forward_config, run_component

TOL = 1e-5  # relative to the output's largest magnitude


def main():
    exe, work = sys.argv[1], sys.argv[2]
    try:
        from diffusers import AutoencoderKLQwenImage
    except Exception as e:
        print(f"diffusers unavailable: {e}", file=sys.stderr)
        sys.exit(77)
    config_yaml = forward_config(work, "tiny-qwen-image")
    torch.manual_seed(0)
    vae = AutoencoderKLQwenImage(base_dim=8, z_dim=16, dim_mult=[1, 2, 2, 2], num_res_blocks=1).eval()
    with torch.no_grad():  # every parameter perturbed: a one or a zero hides a wrong name or layout
        for p in vae.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    folder = os.path.join(work, "qwen_vae")
    vae.save_pretrained(folder, safe_serialization=True)
    mean = torch.tensor(vae.config.latents_mean).view(1, 16, 1, 1, 1)
    std = torch.tensor(vae.config.latents_std).view(1, 16, 1, 1, 1)
    inv_std = 1.0 / torch.tensor(vae.config.latents_std).view(1, 16, 1, 1, 1)
    worst = 0.0
    for frames in (1, 5, 9):
        image = frames == 1
        x = torch.rand(2, 3, frames, 24, 40) * 2 - 1
        z = torch.randn(2, 16, 1 + (frames - 1) // 4, 3, 5)
        with torch.no_grad():
            want_latents = (vae.encode(x).latent_dist.mean - mean) / std
            want_frames = vae.decode(z / inv_std + mean).sample
        if image:
            x, z, want_latents, want_frames = x[:, :, 0], z[:, :, 0], want_latents[:, :, 0], want_frames[:, :, 0]
        inputs = os.path.join(work, f"in_{frames}.safetensors")
        save_file({"images": x.contiguous(), "latents": z.contiguous()}, inputs)
        for component, key, want in (("vae.encode", "latents", want_latents), ("vae.decode", "images", want_frames)):
            out = os.path.join(work, f"{component}_{frames}.safetensors")
            run_component(exe, config_yaml, component, folder, inputs, out)
            got = load_file(out)[key]
            assert got.shape == want.shape, f"{frames} frames {component}: {tuple(got.shape)} vs {tuple(want.shape)}"
            err = ((got - want).abs().max() / want.abs().max()).item()
            worst = max(worst, err)
            print(f"{frames} frame(s) {component}: max relative difference {err:.2e}")
            assert err < TOL, f"{frames} frames {component}: {err:.2e} >= {TOL}"
    # Tiled decoding: 48 x 64 pixels in 32-pixel tiles with a stride of 24 (a 2 x 3 grid), as diffusers tiles.
    for frames in (1, 5):
        z = torch.randn(1, 16, 1 + (frames - 1) // 4, 6, 8)
        with torch.no_grad():
            whole = vae.decode(z / inv_std + mean).sample
            vae.enable_tiling(tile_sample_min_height=32, tile_sample_min_width=32, tile_sample_stride_height=24,
                              tile_sample_stride_width=24)
            want = vae.decode(z / inv_std + mean).sample
            vae.disable_tiling()
        assert not torch.allclose(want.clamp(-1, 1), whole, atol=1e-3), "the tiles should show"
        if frames == 1:
            z, want = z[:, :, 0], want[:, :, 0]
        inputs = os.path.join(work, f"tiled_{frames}.safetensors")
        save_file({"latents": z.contiguous()}, inputs)
        out = os.path.join(work, f"tiled_out_{frames}.safetensors")
        run_component(exe, config_yaml, "vae.decode", folder, inputs, out, ["--vae-tile", "32"])
        got = load_file(out)["images"]
        assert got.shape == want.shape, f"tiled {frames}: {tuple(got.shape)} vs {tuple(want.shape)}"
        err = ((got - want).abs().max() / want.abs().max()).item()
        worst = max(worst, err)
        print(f"{frames} frame(s) vae.decode tiled: max relative difference {err:.2e}")
        assert err < TOL, f"tiled {frames}: {err:.2e} >= {TOL}"
    # The Wan 2.1 VAE (diffusers' AutoencoderKLWan, a Wan folder's vae/): the same network and state dict, read
    # from its own config.json by the Wan family (tiny-wan21), a 5-frame video both ways.
    from diffusers import AutoencoderKLWan
    wan = AutoencoderKLWan(base_dim=8, z_dim=16, dim_mult=[1, 2, 2, 2], num_res_blocks=1).eval()
    wan.load_state_dict(vae.state_dict())
    wan_folder = os.path.join(work, "wan_vae")
    wan.save_pretrained(wan_folder, safe_serialization=True)
    wan_yaml = forward_config(work, "tiny-wan21")
    x = torch.rand(2, 3, 5, 24, 40) * 2 - 1
    z = torch.randn(2, 16, 2, 3, 5)
    with torch.no_grad():
        wants = {"vae.encode": ("latents", (wan.encode(x).latent_dist.mean - mean) / std),
                 "vae.decode": ("images", wan.decode(z / inv_std + mean).sample)}
    inputs = os.path.join(work, "in_wan.safetensors")
    save_file({"images": x.contiguous(), "latents": z.contiguous()}, inputs)
    # Its tiled decode clamps (AutoencoderKLWan.tiled_decode does; Qwen-Image's does not).
    with torch.no_grad():
        wan.enable_tiling(tile_sample_min_height=32, tile_sample_min_width=32, tile_sample_stride_height=24,
                          tile_sample_stride_width=24)
        wants["vae.decode --vae-tile 32"] = ("images", wan.decode(z / inv_std + mean).sample)
        wan.disable_tiling()
    assert wants["vae.decode --vae-tile 32"][1].abs().max() <= 1, "clamped"
    for component, (key, want) in wants.items():
        out = os.path.join(work, f"wan_{component.replace(' ', '_')}.safetensors")
        words = component.split()
        run_component(exe, wan_yaml, words[0], wan_folder, inputs, out, words[1:])
        got = load_file(out)[key]
        assert got.shape == want.shape, f"Wan {component}: {tuple(got.shape)} vs {tuple(want.shape)}"
        err = ((got - want).abs().max() / want.abs().max()).item()
        worst = max(worst, err)
        print(f"AutoencoderKLWan, 5 frames, {component}: max relative difference {err:.2e}")
        assert err < TOL, f"Wan {component}: {err:.2e} >= {TOL}"
    with torch.device("meta"):
        full = AutoencoderKLQwenImage()
    print(f"full-size parameters: {sum(p.numel() for p in full.parameters())}")
    print(f"all match diffusers (worst {worst:.2e})")


if __name__ == "__main__":
    main()
