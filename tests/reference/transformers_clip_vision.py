"""gclab's CLIP vision tower against transformers' CLIPVisionModel (the pinned `transformers` in .venv, a
test-only reference): a tiny random ViT saved by save_pretrained (and a copy with the published checkpoints'
`vision_model.` prefix), its inputs and its outputs (hidden_states[-2], as Wan 2.1 I2V takes them; the last
hidden state; the pooled output) written beside it; then the C++ test ClipVision.MatchesTransformers... loads
the folder and compares.

  transformers_clip_vision.py TEST_TEXT_EXE WORK_DIR

Exit 77 without transformers.
"""
import os
import shutil
import subprocess
import sys

try:
    import torch
    from safetensors.torch import load_file, save_file
    from transformers import CLIPVisionConfig, CLIPVisionModel
except ImportError as e:
    print(f"skipped: {e}")
    sys.exit(77)


def main():
    exe, work = sys.argv[1], sys.argv[2]
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    torch.manual_seed(0)
    config = CLIPVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=4,
                              image_size=32, patch_size=8, hidden_act="gelu", projection_dim=16)
    m = CLIPVisionModel(config).eval()
    with torch.no_grad():  # every parameter away from its initialisation (LayerNorms included)
        for p in m.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    m.save_pretrained(os.path.join(work, "model"))
    state = load_file(os.path.join(work, "model", "model.safetensors"))
    os.makedirs(os.path.join(work, "prefixed"))
    save_file({(k if k.startswith("vision_model.") else "vision_model." + k): v.contiguous() for k, v in state.items()},
              os.path.join(work, "prefixed", "model.safetensors"))
    pixels = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        out = m(pixel_values=pixels, output_hidden_states=True)
    save_file({"pixel_values": pixels, "penultimate": out.hidden_states[-2].contiguous(),
               "last_hidden_state": out.last_hidden_state.contiguous(), "pooler_output": out.pooler_output.contiguous()},
              os.path.join(work, "io.safetensors"))
    env = dict(os.environ, GCLAB_CLIP_VISION_FIXTURE=work)
    r = subprocess.run([exe, "--gtest_filter=ClipVision.MatchesTransformers*"], env=env)
    sys.exit(r.returncode)


if __name__ == "__main__":
    main()
