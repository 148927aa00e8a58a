"""Wan 2.1 I2V's first-frame conditioning against the references (the pinned diffusers and transformers in
.venv, test-only): a tiny AutoencoderKLWan, a tiny CLIPVisionModel and its CLIPImageProcessor saved as a Wan
I2V folder's vae/, image_encoder/ and image_processor/, and a control image; then

  - the preview's inputs as WanImageToVideoPipeline computes them (encode_image: the processor, then
    hidden_states[-2]; prepare_latents: the image followed by black frames, encoded to the posterior's mean,
    normalised, after its 4-channel mask), and
  - a training step's image tokens as AI Toolkit's Wan21I2V.get_noise_prediction prepares them (its
    preprocess_clip_image: (x + 1) / 2, bilinear to the tower's size, clamped, normalised with the processor's
    mean and std; written here from that description, then the tower's hidden_states[-2]),

written beside it; the C++ test FirstFrame.MatchesDiffusers... builds gclab's conditioning from the folder and
compares (the training channels with the posterior's mean, which is what makes them comparable: AI Toolkit
samples the posterior there).

  diffusers_wan_i2v_condition.py TEST_TRAIN_EXE WORK_DIR

Exit 77 without diffusers / transformers.
"""
import os
import shutil
import subprocess
import sys

try:
    import numpy as np
    import torch
    import torch.nn.functional as F
    from PIL import Image
    from safetensors.torch import save_file
    from transformers import CLIPImageProcessor, CLIPVisionConfig, CLIPVisionModel
    from diffusers import AutoencoderKLWan, WanImageToVideoPipeline
    from diffusers.video_processor import VideoProcessor
except ImportError as e:
    print(f"skipped: {e}")
    sys.exit(77)

# 3 latent frames of 4 x 6. The image's short side is the processor's 32 already: its resize keeps it as it is
# whichever backend transformers picks (torchvision's, as in AI Toolkit's environment, or PIL's without it),
# and the centre crop takes columns 8-39.
WIDTH, HEIGHT, FRAMES = 48, 32, 9


def main():
    exe, work = sys.argv[1], sys.argv[2]
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    torch.manual_seed(0)
    vae = AutoencoderKLWan(base_dim=8, z_dim=16, dim_mult=[1, 2, 2, 2], num_res_blocks=1).eval()
    vae.save_pretrained(os.path.join(work, "vae"))
    config = CLIPVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=4,
                              image_size=32, patch_size=8, hidden_act="gelu")
    clip = CLIPVisionModel(config).eval()
    with torch.no_grad():  # every parameter away from its initialisation (LayerNorms included)
        for p in clip.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    clip.save_pretrained(os.path.join(work, "image_encoder"))
    processor = CLIPImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32})
    processor.save_pretrained(os.path.join(work, "image_processor"))
    # The control image at the preview's size (AI Toolkit resizes it there with PIL's LANCZOS first; gclab with
    # stb's filter — at the same size both keep it as it is).
    rng = np.random.default_rng(3)
    pixels = rng.integers(0, 256, (HEIGHT, WIDTH, 3), dtype=np.uint8)
    image = Image.fromarray(pixels)
    image.save(os.path.join(work, "control.png"))

    pipe = WanImageToVideoPipeline(tokenizer=None, text_encoder=None, vae=vae, scheduler=None,
                                   image_processor=processor, image_encoder=clip, transformer=None)
    with torch.no_grad():
        preview_embeds = pipe.encode_image(image, device=torch.device("cpu"))
        video = VideoProcessor(vae_scale_factor=8).preprocess(image, height=HEIGHT, width=WIDTH).to(torch.float32)
        _, condition = pipe.prepare_latents(video, 1, 16, HEIGHT, WIDTH, FRAMES, torch.float32,
                                            torch.device("cpu"), None)
        # A training step's first frame: the same image in [-1, 1].
        frame = torch.from_numpy(pixels).permute(2, 0, 1).float().div(255).mul(2).sub(1).unsqueeze(0)
        x = ((frame + 1) / 2)
        x = F.interpolate(x, size=(32, 32), mode="bilinear", align_corners=False).clamp(0, 1)
        mean = torch.tensor(processor.image_mean).view(1, 3, 1, 1)
        std = torch.tensor(processor.image_std).view(1, 3, 1, 1)
        train_embeds = clip((x - mean) / std, output_hidden_states=True).hidden_states[-2]
    save_file({"frame": frame.contiguous(), "preview_image_embeds": preview_embeds.contiguous(),
               "condition": condition.contiguous(), "train_image_embeds": train_embeds.contiguous()},
              os.path.join(work, "io.safetensors"))
    env = dict(os.environ, GCLAB_WAN_I2V_FIXTURE=work)
    r = subprocess.run([exe, "--gtest_filter=FirstFrame.MatchesDiffusers*"], env=env)
    sys.exit(r.returncode)


if __name__ == "__main__":
    main()
