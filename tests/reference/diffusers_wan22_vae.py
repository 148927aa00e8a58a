"""gclab's Wan 2.2 VAE against diffusers' AutoencoderKLWan with is_residual (the pinned `diffusers` in .venv,
a test-only reference): a tiny random one in the Wan 2.2 layout (residual down / up blocks, frames patchified
2 x 2 into 12 channels, a decoder of its own width, 48 latent channels with their own latents_mean /
latents_std), saved by save_pretrained, its inputs and outputs written beside it — encode (the posterior's
mean, then (z - mean) / std as AI Toolkit normalises) and decode (z * std + mean, decoded, clamped) of an
image and of 5- and 9-frame videos, and a decode in tiles (enable_tiling at 64 pixels, stride 48: not
clamped); then the C++ test Wan22Vae.MatchesDiffusers... loads the folder and compares. It prints the full
size's parameter count (Wan2.2-TI2V-5B's vae/, as convert_wan_to_diffusers.py configures it) for the C++
test's constant.

  diffusers_wan22_vae.py TEST_VAE_EXE WORK_DIR

Exit 77 without diffusers.
"""
import os
import shutil
import subprocess
import sys

try:
    import torch
    from safetensors.torch import save_file
    from diffusers import AutoencoderKLWan
except ImportError as e:
    print(f"skipped: {e}")
    sys.exit(77)

WAN22 = dict(is_residual=True, in_channels=12, out_channels=12, scale_factor_temporal=4, scale_factor_spatial=16,
             patch_size=2, z_dim=48)


def main():
    exe, work = sys.argv[1], sys.argv[2]
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    torch.manual_seed(0)
    with torch.device("meta"):
        full = AutoencoderKLWan(base_dim=160, decoder_base_dim=256, **WAN22)
    print(f"full-size parameters: {sum(p.numel() for p in full.parameters())}")
    # 48 latent means and deviations of its own (the folder's config.json carries them, as the 5B's does)
    mean_std = dict(latents_mean=(torch.randn(48) * 0.3).tolist(), latents_std=(torch.rand(48) + 0.5).tolist())
    vae = AutoencoderKLWan(base_dim=8, decoder_base_dim=12, dim_mult=[1, 2, 2, 2], num_res_blocks=1, **WAN22,
                           **mean_std).eval()
    with torch.no_grad():  # every parameter away from its initialisation (the RMS norms' gammas included)
        for p in vae.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    vae.save_pretrained(os.path.join(work, "vae"))
    mean = torch.tensor(vae.config.latents_mean).view(1, 48, 1, 1, 1)
    std = torch.tensor(vae.config.latents_std).view(1, 48, 1, 1, 1)
    tensors = {}
    with torch.no_grad():
        for frames in (1, 5, 9):
            x = torch.rand(1, 3, frames, 32, 48) * 2 - 1
            z = torch.randn(1, 48, 1 + (frames - 1) // 4, 2, 3)
            tensors[f"images_{frames}"] = x
            tensors[f"encoded_{frames}"] = (vae.encode(x).latent_dist.mean - mean) / std
            tensors[f"latents_{frames}"] = z
            tensors[f"decoded_{frames}"] = vae.decode(z * std + mean).sample
        z = torch.randn(1, 48, 2, 6, 7)  # 96 x 112 pixels: tiles of 64 at a stride of 48
        vae.enable_tiling(tile_sample_min_height=64, tile_sample_min_width=64, tile_sample_stride_height=48,
                          tile_sample_stride_width=48)
        tensors["tiled_latents"] = z
        tensors["tiled_decoded"] = vae.decode(z * std + mean).sample
    save_file({k: v.contiguous() for k, v in tensors.items()}, os.path.join(work, "io.safetensors"))
    env = dict(os.environ, GCLAB_WAN22_VAE_FIXTURE=work)
    r = subprocess.run([exe, "--gtest_filter=Wan22Vae.MatchesDiffusers*"], env=env)
    sys.exit(r.returncode)


if __name__ == "__main__":
    main()
