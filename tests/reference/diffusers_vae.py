"""gclab's AutoencoderKL against diffusers' (the pinned `diffusers` in .venv, a test-only reference), through
`gclab forward --component vae.encode|vae.decode`:

  diffusers_vae.py GCLAB_EXE WORK_DIR

For three tiny random AutoencoderKL configurations shaped like the ones users train on (FLUX's: 16
channels, no quant convs, a shift factor; SD3's factors; the SD VAE's: 4 channels with quant_conv and
post_quant_conv), and FLUX.2's AutoencoderKLFlux2 (32 channels in 2 x 2 patches, BatchNorm statistics; also
written in BFL's ae.safetensors layout, full and small decoder), saved by diffusers' own save_pretrained, gclab
must load the folder (or file) unchanged and give
diffusers' encode (the posterior's mean, then (z - shift) * scaling, as the pipelines and AI Toolkit scale
latents) and decode (z / scaling + shift, then decode) to float32 rounding; in bfloat16 (gclab forward --dtype
bf16 against diffusers' model cast to bfloat16, the same inputs) to bfloat16 rounding. Exit 77 without diffusers.
"""
import os
import subprocess
import sys

import torch
from safetensors.torch import load_file, save_file

from autoencoder_forward import forward_config, run_component

TOL = 1e-5  # relative to the output's largest magnitude
# bfloat16: gclab's bf16 output may differ from diffusers' bf16 output by no more than twice what diffusers' own
# bf16 output differs from its float32 one (what bf16 rounding does to this network; both sides round on their
# own, each by up to that much, and which kernel runs — the attention's, the CPU's convolutions — moves it by
# ~1e-2), with a floor.

CONFIGS = {
    "flux": dict(latent_channels=16, use_quant_conv=False, use_post_quant_conv=False, scaling_factor=0.3611,
                 shift_factor=0.1159),
    "sd3": dict(latent_channels=16, use_quant_conv=False, use_post_quant_conv=False, scaling_factor=1.5305,
                shift_factor=0.0609),
    "sd": dict(latent_channels=4, scaling_factor=0.18215),
}


def flux2_expected(vae, images, latents):
    """Flux2Pipeline's encode and decode (pipeline_flux2.py:457-470, 606-618): the posterior's mean, 2 x 2 patches
    into the channels, normalized by the BatchNorm's running statistics; decode the inverse."""
    mean = vae.bn.running_mean.view(1, -1, 1, 1)
    std = torch.sqrt(vae.bn.running_var.view(1, -1, 1, 1) + vae.config.batch_norm_eps)
    with torch.no_grad():
        z = vae.encode(images).latent_dist.mode()
        b, c, h, w = z.shape
        z = z.view(b, c, h // 2, 2, w // 2, 2).permute(0, 1, 3, 5, 2, 4).reshape(b, c * 4, h // 2, w // 2)
        b, c, h, w = latents.shape
        u = (latents * std + mean).reshape(b, c // 4, 2, 2, h, w).permute(0, 1, 4, 2, 5, 3).reshape(
            b, c // 4, 2 * h, 2 * w)
        return {"latents": (z - mean) / std, "images": vae.decode(u).sample}


def perturbed_flux2(**kw):
    """A tiny AutoencoderKLFlux2, every parameter and its running statistics perturbed (the defaults 0 and 1
    would hide a skipped normalization)."""
    from diffusers import AutoencoderKLFlux2
    vae = AutoencoderKLFlux2(**kw).eval()
    with torch.no_grad():
        for p in vae.parameters():
            p.add_(torch.randn_like(p) * 0.05)
        vae.bn.running_mean.copy_(torch.randn(128) * 0.3)
        vae.bn.running_var.copy_(torch.rand(128) + 0.5)
    return vae


def bfl_names(sd, levels):
    """diffusers' AutoencoderKLFlux2 weights under Black Forest Labs' names (flux2/src/autoencoder.py: the LDM
    layout, the decoder's levels numbered from the full resolution, 1 x 1 convolutions in the mid attention,
    quant_conv inside the encoder and post_quant_conv inside the decoder), written here from BFL's modules."""
    out = {}
    for k, v in sd.items():
        if k.startswith("quant_conv."):
            k = "encoder." + k
        elif k.startswith("post_quant_conv."):
            k = "decoder." + k
        p = k.split(".")
        o = []
        i = 0
        while i < len(p):
            s = p[i]
            if s in ("down_blocks", "up_blocks"):
                o += ["down" if s == "down_blocks" else "up",
                      p[i + 1] if s == "down_blocks" else str(levels - 1 - int(p[i + 1]))]
                i += 2
            elif s == "mid_block":
                o.append("mid")
                i += 1
            elif s == "resnets" and o[-1] == "mid":
                o.append(f"block_{int(p[i + 1]) + 1}")
                i += 2
            elif s == "attentions":
                o.append("attn_1")
                i += 2
            elif s in ("downsamplers", "upsamplers"):
                o.append("downsample" if s == "downsamplers" else "upsample")
                i += 2
            elif s == "to_out":
                o.append("proj_out")
                i += 2
            else:
                o.append({"resnets": "block", "group_norm": "norm", "to_q": "q", "to_k": "k", "to_v": "v",
                          "conv_norm_out": "norm_out", "conv_shortcut": "nin_shortcut"}.get(s, s))
                i += 1
        name = ".".join(o)
        if ".attn_1." in name and name.endswith(".weight") and ".norm." not in name:
            v = v[:, :, None, None]  # BFL's 1 x 1 convolutions
        out[name] = v.contiguous()
    return out


def compare_flux2(exe, work, label, weights, want, inputs):
    worst = 0.0
    config_yaml = forward_config(work, "tiny-flux2-klein")
    for component, key in (("vae.encode", "latents"), ("vae.decode", "images")):
        out = os.path.join(work, f"flux2_{component}.safetensors")
        run_component(exe, config_yaml, component, weights, inputs, out, [])
        got = load_file(out)[key]
        assert got.shape == want[key].shape, f"{label} {component}: {tuple(got.shape)} vs {tuple(want[key].shape)}"
        err = ((got - want[key]).abs().max() / want[key].abs().max()).item()
        worst = max(worst, err)
        print(f"{label} {component}: max relative difference {err:.2e}")
        assert err < TOL, f"{label} {component}: {err:.2e} >= {TOL}"
    return worst


def check_flux2(exe, work):
    """FLUX.2's AutoencoderKLFlux2 as a diffusers folder; then BFL's ae.safetensors layout (AI Toolkit's Flux2Model
    reads that file) at the tiny preset's shape, with the full decoder and with a narrower one (BFL's
    AutoEncoderSmallDecoderParams: 96 channels for 128), the widths read from the file."""
    torch.manual_seed(3)
    vae = perturbed_flux2(block_out_channels=(32, 64), down_block_types=("DownEncoderBlock2D",) * 2,
                          up_block_types=("UpDecoderBlock2D",) * 2, layers_per_block=1, norm_num_groups=8)
    folder = os.path.join(work, "flux2")
    vae.save_pretrained(folder, safe_serialization=True)
    images = torch.rand(2, 3, 24, 40) * 2 - 1
    latents = torch.randn(2, 128, 6, 10)
    inputs = os.path.join(work, "in_flux2.safetensors")
    save_file({"images": images.contiguous(), "latents": latents.contiguous()}, inputs)
    worst = compare_flux2(exe, work, "flux2", folder, flux2_expected(vae, images, latents), inputs)
    images = torch.rand(2, 3, 32, 48) * 2 - 1
    latents = torch.randn(2, 128, 2, 3)
    inputs = os.path.join(work, "in_flux2_bfl.safetensors")
    save_file({"images": images.contiguous(), "latents": latents.contiguous()}, inputs)
    for label, decoder in (("flux2 ae.safetensors", None), ("flux2 ae.safetensors, small decoder", (8, 8, 8, 8))):
        vae = perturbed_flux2(block_out_channels=(16, 16, 16, 16), layers_per_block=1, norm_num_groups=4,
                              decoder_block_out_channels=decoder)
        ae = os.path.join(work, "ae.safetensors")
        save_file(bfl_names(vae.state_dict(), 4), ae)
        worst = max(worst, compare_flux2(exe, work, label, ae, flux2_expected(vae, images, latents), inputs))
    return worst


def main():
    exe, work = sys.argv[1], sys.argv[2]
    try:
        from diffusers import AutoencoderKL
    except Exception as e:
        print(f"diffusers unavailable: {e}", file=sys.stderr)
        sys.exit(77)
    config_yaml = forward_config(work, "tiny-flux")
    worst = 0.0
    for name, extra in CONFIGS.items():
        torch.manual_seed(0)
        vae = AutoencoderKL(block_out_channels=(32, 64), down_block_types=("DownEncoderBlock2D",) * 2,
                            up_block_types=("UpDecoderBlock2D",) * 2, layers_per_block=1, norm_num_groups=8,
                            **extra).eval()
        with torch.no_grad():  # every parameter perturbed: a zero or one hides a wrong name or layout
            for p in vae.parameters():
                p.add_(torch.randn_like(p) * 0.05)
        folder = os.path.join(work, name)
        vae.save_pretrained(folder, safe_serialization=True)
        images = torch.rand(2, 3, 24, 40) * 2 - 1
        latents = torch.randn(2, extra["latent_channels"], 12, 20)
        shift = extra.get("shift_factor", 0.0)
        with torch.no_grad():
            want_latents = (vae.encode(images).latent_dist.mean - shift) * extra["scaling_factor"]
            want_images = vae.decode(latents / extra["scaling_factor"] + shift).sample
        save_file({"images": images.contiguous(), "latents": latents.contiguous()}, os.path.join(work, "in.safetensors"))
        vae.tile_sample_min_size, vae.tile_latent_min_size = 16, 8
        vae.enable_tiling()
        with torch.no_grad():
            want_tiled = vae.decode(latents / extra["scaling_factor"] + shift).sample
        vae.disable_tiling()
        assert not torch.allclose(want_tiled, want_images), "the tiles should show"
        for component, key, want, extra_args in (("vae.encode", "latents", want_latents, []),
                                                 ("vae.decode", "images", want_images, []),
                                                 ("vae.decode", "images", want_tiled, ["--vae-tile", "16"])):
            out = os.path.join(work, f"{name}_{component}.safetensors")
            run_component(exe, config_yaml, component, folder, os.path.join(work, "in.safetensors"), out, extra_args)
            got = load_file(out)[key]
            assert got.shape == want.shape, f"{name} {component}: {tuple(got.shape)} vs {tuple(want.shape)}"
            err = ((got - want).abs().max() / want.abs().max()).item()
            worst = max(worst, err)
            label = f"{name} {component}{' tiled' if extra_args else ''}"
            print(f"{label}: max relative difference {err:.2e}")
            assert err < TOL, f"{label}: {err:.2e} >= {TOL}"
        # bfloat16: the same weights and inputs, both sides computing in bfloat16.
        fp32 = {"latents": want_latents, "images": want_images}
        vae_bf16 = vae.to(torch.bfloat16)
        with torch.no_grad():
            want_latents = ((vae_bf16.encode(images.bfloat16()).latent_dist.mean - shift) * extra["scaling_factor"]).float()
            want_images = vae_bf16.decode(latents.bfloat16() / extra["scaling_factor"] + shift).sample.float()
        for component, key, want in (("vae.encode", "latents", want_latents), ("vae.decode", "images", want_images)):
            rounding = ((want - fp32[key]).abs().max() / fp32[key].abs().max()).item()
            out = os.path.join(work, f"{name}_{component}_bf16.safetensors")
            run_component(exe, config_yaml, component, folder, os.path.join(work, "in.safetensors"), out,
                          ["--dtype", "bf16"])
            got = load_file(out)[key]
            assert got.dtype == torch.bfloat16, f"{name} {component} bf16: {got.dtype}"
            err = ((got.float() - want).abs().max() / want.abs().max()).item()
            print(f"{name} {component} bf16: max relative difference {err:.2e} (diffusers' bf16 from its float32: "
                  f"{rounding:.2e})")
            assert err <= max(2 * rounding, 2e-3), f"{name} {component} bf16: {err:.2e} > 2 x {rounding:.2e}"
    worst = max(worst, check_flux2(exe, work))
    # Bad requests are refused by name with exit 2 (a user error), never a crash.
    only_latents = os.path.join(work, "latents_only.safetensors")
    save_file({"latents": torch.randn(1, 4, 8, 8)}, only_latents)
    folder = os.path.join(work, "sd")
    for args, needle in ((["--component", "vae.bogus", "--inputs", only_latents], "vae.bogus"),
                         (["--component", "vae.encode", "--inputs", only_latents], "needs 'images'"),
                         (["--component", "vae.decode", "--vae-tile", "7", "--inputs", only_latents], "--vae-tile 7"),
                         (["--component", "vae.encode", "--posterior", "mode", "--inputs", only_latents], "mode")):
        r = subprocess.run([exe, "forward", config_yaml, "--weights", folder, "--out", os.path.join(work, "x.safetensors")]
                           + args, capture_output=True, text=True)
        assert r.returncode == 2 and needle in r.stderr, f"{args}: exit {r.returncode}, stderr {r.stderr!r}"
    print(f"all match diffusers (worst {worst:.2e}); bad requests refused")


if __name__ == "__main__":
    main()
