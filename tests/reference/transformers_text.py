"""gclab's text encoders against transformers' (the pinned `transformers` in .venv, a test-only reference),
through `gclab forward --component text_encoder|text_encoder_2|text_encoder_3`:

  transformers_text.py GCLAB_EXE WORK_DIR

Tiny random CLIPTextModel (FLUX.1's text_encoder: quick_gelu, its pooled output), CLIPTextModelWithProjection
(SD3.5's text_encoder / text_encoder_2: the penultimate hidden states and the projected pooled output),
T5EncoderModel (text_encoder_2 / text_encoder_3: gated-gelu, relative position buckets), UMT5EncoderModel
(Wan's text_encoder: a relative-position bias per block), Qwen3Model
(Z-Image: hidden_states[-2]; FLUX.2 klein: hidden states 1 and 2 stacked per token, as its pipeline stacks
9 / 18 / 27), Mistral3ForConditionalGeneration (FLUX.2-dev: Mistral's hidden states stacked likewise, its
Pixtral tower and LM head in the file held but unused) and Qwen2_5_VLForConditionalGeneration (Qwen-Image: the last hidden states,
text only, and with images through its vision tower as the edit pipelines call it; the LM head in the file
is not used), saved by
transformers' save_pretrained, must load unchanged and give transformers' outputs to float32 rounding, with
and without an attention mask; a CLIPTextModel file with the `text_model.` prefix (as the published
checkpoints store it) loads too. Full-size parameter counts (T5-XXL's encoder, CLIP-L, bigG with its
projection, Qwen3-4B, Qwen2.5-VL-7B's language model, Mistral-Small-3.1 and its parts), counted on the meta device, are printed for the C++ test's constants. Exit 77 without
transformers.
"""
import os
import subprocess
import sys

import torch
from safetensors.torch import load_file, save_file

TOL = 1e-5  # relative to the output's largest magnitude
IMAGE_TOKEN = 998  # the tiny Qwen2.5-VL's <|image_pad|>


def config_yaml(work, arch):
    os.makedirs(work, exist_ok=True)
    path = os.path.join(work, f"{arch}.yaml")
    with open(path, "w") as f:
        f.write(f"name: text\ndevice: cpu\nmodel: {{arch: {arch}}}\n"
                "datasets: [{folder_path: " + work + "}]\ntrain: {steps: 1}\n")
    return path


def run(exe, yaml, component, folder, inputs, out):
    """`gclab forward` on one component; returns what it printed to stderr (its warnings)."""
    r = subprocess.run([exe, "forward", yaml, "--component", component, "--weights", folder, "--inputs", inputs,
                        "--out", out], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if r.returncode:
        raise SystemExit(f"gclab forward exited {r.returncode}: {r.stderr}")
    return r.stderr


def perturb(model):
    with torch.no_grad():  # every parameter perturbed: a one or a zero hides a wrong name or layout
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)


def check_qwen_images(exe, work, model):
    """Qwen2.5-VL with images, as the edit pipelines call it: each image's <|image_pad|> run in the ids, the
    processor's pixel_values and image_grid_thw, multimodal rotary positions (mm_token_type_ids marks the
    image tokens, as the processor does). Then gclab's own processor on an `image` input: pixel_values equal
    the processor's where no resize is needed, and close to them (uint8 rounding) where one is."""
    from transformers import Qwen2VLImageProcessor
    proc = Qwen2VLImageProcessor()
    yaml = config_yaml(work, "tiny-qwen-image-edit")
    folder = os.path.join(work, "qwen25_vl")
    torch.manual_seed(1)
    pictures = [torch.randint(0, 256, (3, 84, 140), dtype=torch.uint8),  # 6x10 patches: 3x5 merged, padded windows
                torch.randint(0, 256, (3, 56, 56), dtype=torch.uint8)]
    pv = proc(images=pictures, return_tensors="pt")
    pv_two = pv
    grid = pv["image_grid_thw"]
    counts = (grid.prod(-1) // 4).tolist()
    rows = []
    for i, n in enumerate(counts):
        rows.append(torch.cat([torch.randint(0, 990, (5 + i,)), torch.full((n,), IMAGE_TOKEN),
                               torch.randint(0, 990, (7,))]))
    length = max(len(r) for r in rows) + 2
    ids = torch.zeros(2, length, dtype=torch.long)
    mask = torch.zeros(2, length, dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, :len(r)] = r
        mask[i, :len(r)] = 1
    worst = 0.0
    with torch.no_grad():
        want = model(input_ids=ids, attention_mask=mask, pixel_values=pv["pixel_values"], image_grid_thw=grid,
                     mm_token_type_ids=(ids == IMAGE_TOKEN).int(), output_hidden_states=True).hidden_states[-1]
    inputs = os.path.join(work, "in_qwen_images.safetensors")
    save_file({"input_ids": ids, "attention_mask": mask, "pixel_values": pv["pixel_values"].contiguous(),
               "image_grid_thw": grid.contiguous()}, inputs)
    out = os.path.join(work, "out_qwen_images.safetensors")
    run(exe, yaml, "text_encoder", folder, inputs, out)
    got = load_file(out)["hidden_states"]
    keep = mask.bool()
    err = ((got[keep] - want[keep]).abs().max() / want[keep].abs().max()).item()
    print(f"qwen25_vl text_encoder hidden_states with two images: max relative difference {err:.2e}")
    assert err < TOL, err
    worst = max(worst, err)
    # gclab's processor: no resize (84x140 is a multiple of 28), then a resize (100x150 -> 112x140).
    for picture, tol in ((pictures[0], 1e-5), (torch.randint(0, 256, (3, 100, 150), dtype=torch.uint8), 1.01 / 255 / 0.26)):
        pv = proc(images=[picture], return_tensors="pt")
        n = int(pv["image_grid_thw"].prod() // 4)
        one = torch.cat([torch.randint(0, 990, (4,)), torch.full((n,), IMAGE_TOKEN), torch.randint(0, 990, (3,))])[None]
        inputs = os.path.join(work, "in_qwen_image.safetensors")
        save_file({"input_ids": one, "image": picture.float() / 255}, inputs)
        run(exe, yaml, "text_encoder", folder, inputs, out)
        got = load_file(out)
        assert torch.equal(got["image_grid_thw"], pv["image_grid_thw"]), (got["image_grid_thw"], pv["image_grid_thw"])
        diff = (got["pixel_values"] - pv["pixel_values"]).abs().max().item()
        print(f"gclab's Qwen2VL processor, {tuple(picture.shape[1:])} -> grid {pv['image_grid_thw'].tolist()[0]}: "
              f"pixel_values max difference {diff:.2e}")
        assert diff < tol, diff
        if tol < 1e-4:
            with torch.no_grad():
                want = model(input_ids=one, pixel_values=pv["pixel_values"], image_grid_thw=pv["image_grid_thw"],
                             mm_token_type_ids=(one == IMAGE_TOKEN).int(), output_hidden_states=True).hidden_states[-1]
            err = ((got["hidden_states"] - want).abs().max() / want.abs().max()).item()
            print(f"qwen25_vl from an image input: max relative difference {err:.2e}")
            assert err < TOL, err
            worst = max(worst, err)
    # The published Qwen-Image text_encoder's layout (written by transformers 4.x): visual.*, model.layers.*,
    # model.embed_tokens / model.norm, lm_head — the same weights load unchanged and give the same states.
    old_layout = os.path.join(work, "qwen25_vl_4x")
    os.makedirs(old_layout, exist_ok=True)
    tensors = load_file(os.path.join(folder, "model.safetensors"))
    renamed = {}
    for k, v in tensors.items():
        if k.startswith("model.visual."):
            k = k[len("model."):]
        elif k.startswith("model.language_model."):
            k = "model." + k[len("model.language_model."):]
        renamed[k] = v
    assert any(k.startswith("visual.") for k in renamed) and any(k.startswith("model.layers.") for k in renamed)
    save_file(renamed, os.path.join(old_layout, "model.safetensors"))
    with open(os.path.join(folder, "config.json")) as src, open(os.path.join(old_layout, "config.json"), "w") as dst:
        dst.write(src.read())
    run(exe, yaml, "text_encoder", old_layout, os.path.join(work, "in_qwen_images.safetensors"), out)
    with torch.no_grad():
        want = model(input_ids=ids, attention_mask=mask, pixel_values=pv_two["pixel_values"],
                     image_grid_thw=pv_two["image_grid_thw"], mm_token_type_ids=(ids == IMAGE_TOKEN).int(),
                     output_hidden_states=True).hidden_states[-1]
    got = load_file(out)["hidden_states"]
    err = ((got[keep] - want[keep]).abs().max() / want[keep].abs().max()).item()
    print(f"qwen25_vl in the transformers 4.x layout (visual.*, model.layers.*): max relative difference {err:.2e}")
    assert err < TOL, err
    worst = max(worst, err)
    # A grid that does not match the pixel values, or image tokens that do not match the images: exit 2.
    bad = os.path.join(work, "bad_images.safetensors")
    save_file({"input_ids": one, "image": torch.rand(3, 56, 56)}, bad)
    r = subprocess.run([exe, "forward", yaml, "--component", "text_encoder", "--weights", folder, "--inputs", bad,
                        "--out", out], capture_output=True, text=True)
    assert r.returncode == 2, f"image tokens that do not match: exit {r.returncode}: {r.stderr}"
    print(f"image tokens that do not match the image: exit 2 ({r.stderr.strip().splitlines()[-1]})")
    return worst


def main():
    exe, work = sys.argv[1], sys.argv[2]
    try:
        from transformers import (CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection, Mistral3Config,
                                  Mistral3ForConditionalGeneration, Qwen2_5_VLConfig, Qwen3ForCausalLM,
                                  Qwen2_5_VLForConditionalGeneration, Qwen3Config, Qwen3Model, T5Config,
                                  T5EncoderModel, UMT5Config, UMT5EncoderModel)
    except Exception as e:
        print(f"transformers unavailable: {e}", file=sys.stderr)
        sys.exit(77)
    torch.manual_seed(0)
    worst = 0.0
    ids = torch.randint(0, 1000, (2, 16))
    ids[0, 9] = 999  # CLIP's pooled token: the largest id (eos_token_id 2) / the first eos_token_id
    mask = torch.ones(2, 16, dtype=torch.long)
    mask[1, 11:] = 0
    cases = []
    clip_kw = dict(vocab_size=1000, hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=4,
                   max_position_embeddings=16, projection_dim=24)
    flux = config_yaml(work, "tiny-flux")
    sd3 = config_yaml(work, "tiny-sd3")
    clip_l = CLIPTextModel(CLIPTextConfig(**clip_kw, hidden_act="quick_gelu", eos_token_id=2)).eval()
    cases.append(("clip_l", clip_l, flux, "text_encoder", lambda o: {"pooled": o.pooler_output}, None))
    clip_g = CLIPTextModelWithProjection(CLIPTextConfig(**clip_kw, hidden_act="gelu", eos_token_id=999)).eval()
    cases.append(("clip_g", clip_g, sd3, "text_encoder_2",
                  lambda o: {"hidden_states": o.hidden_states[-2], "pooled": o.text_embeds}, None))
    t5 = T5EncoderModel(T5Config(vocab_size=1000, d_model=32, d_kv=8, d_ff=64, num_layers=3, num_heads=4,
                                 feed_forward_proj="gated-gelu", relative_attention_num_buckets=8,
                                 relative_attention_max_distance=20)).eval()
    cases.append(("t5", t5, flux, "text_encoder_2", lambda o: {"hidden_states": o.last_hidden_state}, None))
    cases.append(("t5_sd3", t5, sd3, "text_encoder_3", lambda o: {"hidden_states": o.last_hidden_state}, None))
    # Wan's UMT5: T5's blocks, each with its own relative-position bias (model_type "umt5").
    umt5 = UMT5EncoderModel(UMT5Config(vocab_size=1000, d_model=32, d_kv=8, d_ff=64, num_layers=3, num_heads=4,
                                       feed_forward_proj="gated-gelu", relative_attention_num_buckets=8,
                                       relative_attention_max_distance=20)).eval()
    cases.append(("umt5", umt5, config_yaml(work, "tiny-wan21"), "text_encoder",
                  lambda o: {"hidden_states": o.last_hidden_state}, None))
    qwen_kw = dict(vocab_size=1000, hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=4,
                   num_key_value_heads=2, head_dim=8)
    qwen3 = Qwen3Model(Qwen3Config(**qwen_kw)).eval()
    cases.append(("qwen3", qwen3, config_yaml(work, "tiny-zimage"), "text_encoder",
                  lambda o: {"hidden_states": o.hidden_states[-2]}, None))
    # FLUX.2: hidden states of several layers side by side per token ([B, T, k D]); index 0 the embeddings.
    def stacked(layers):
        return lambda o: {"hidden_states": torch.cat([o.hidden_states[k] for k in layers], -1)}
    # klein 9B's Qwen3-8B is a Qwen3ForCausalLM with its own LM head: every tensor of its file is held.
    qwen3_lm = Qwen3ForCausalLM(Qwen3Config(**qwen_kw, tie_word_embeddings=False)).eval()
    cases.append(("qwen3_stacked", qwen3_lm, config_yaml(work, "tiny-flux2-klein"), "text_encoder",
                  stacked([1, 2]), [1, 2]))
    # Mistral-Small-3.1's architecture at test size: no q/k norms, RMS eps 1e-5, a large rotary theta; the
    # file holds the Pixtral tower, the projector and the LM head, which gclab holds and never runs.
    mistral = Mistral3ForConditionalGeneration(Mistral3Config(
        text_config=dict(model_type="mistral", **qwen_kw, rms_norm_eps=1e-5, sliding_window=None,
                         rope_parameters={"rope_type": "default", "rope_theta": 1000000000.0},
                         tie_word_embeddings=False),
        vision_config=dict(model_type="pixtral", hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                           num_attention_heads=2, head_dim=8), tie_word_embeddings=False)).eval()
    cases.append(("mistral3", mistral, config_yaml(work, "tiny-flux2-dev"), "text_encoder", stacked([1, 2, 3]),
                  [1, 2, 3]))
    qwen_kw.pop("head_dim")  # 8 = 32 / 4; the multimodal rotary sections must cover its 4 frequencies
    qwen_kw["rope_parameters"] = {"rope_type": "default", "rope_theta": 1000000.0, "mrope_section": [1, 1, 2]}
    # The vision tower: a windowed block then a full-attention one, 56-pixel windows (2x2 merge units) so
    # that the test's grids need padded windows.
    qwen25 = Qwen2_5_VLForConditionalGeneration(Qwen2_5_VLConfig(
        text_config=qwen_kw, vision_config=dict(depth=2, hidden_size=16, intermediate_size=32, num_heads=2,
                                                out_hidden_size=32, window_size=56, fullatt_block_indexes=[1]),
        image_token_id=IMAGE_TOKEN)).eval()
    cases.append(("qwen25_vl", qwen25, config_yaml(work, "tiny-qwen-image"), "text_encoder",
                  lambda o: {"hidden_states": o.hidden_states[-1]}, None))
    folders = {}  # a model two cases read is saved once (its first case's folder)
    for name, model, yaml, component, outputs, layers in cases:
        if id(model) not in folders:
            perturb(model)
            folders[id(model)] = os.path.join(work, name)
            model.save_pretrained(folders[id(model)], safe_serialization=True)
        folder = folders[id(model)]
        for masked in (False, True):
            with torch.no_grad():
                want = outputs(model(input_ids=ids, attention_mask=mask if masked else None,
                                     output_hidden_states=True))
            inputs = os.path.join(work, f"in_{name}_{masked}.safetensors")
            save_file({"input_ids": ids, **({"attention_mask": mask} if masked else {}),
                       **({"hidden_layers": torch.tensor(layers)} if layers else {})}, inputs)
            out = os.path.join(work, f"out_{name}_{masked}.safetensors")
            warnings = run(exe, yaml, component, folder, inputs, out)
            if layers:  # FLUX.2's encoders are held whole: every tensor of the file used
                assert "were not used" not in warnings, f"{name}: {warnings}"
            got = load_file(out)
            for key, w in want.items():
                assert key in got, f"{name}: no '{key}' in {sorted(got)}"
                g = got[key]
                assert g.shape == w.shape, f"{name} {key}: {tuple(g.shape)} vs {tuple(w.shape)}"
                err = ((g - w).abs().max() / w.abs().max()).item()
                worst = max(worst, err)
                print(f"{name} {component} {key}{' masked' if masked else ''}: max relative difference {err:.2e}")
                assert err < TOL, f"{name} {key}: {err:.2e} >= {TOL}"
    worst = max(worst, check_qwen_images(exe, work, qwen25))
    # The published CLIP-L files keep the `text_model.` prefix transformers 5 drops when it saves.
    prefixed = os.path.join(work, "clip_l_prefixed")
    os.makedirs(prefixed, exist_ok=True)
    tensors = load_file(os.path.join(work, "clip_l", "model.safetensors"))
    save_file({"text_model." + k: v for k, v in tensors.items()}, os.path.join(prefixed, "model.safetensors"))
    with open(os.path.join(work, "clip_l", "config.json")) as src, open(os.path.join(prefixed, "config.json"), "w") as dst:
        dst.write(src.read())
    inputs = os.path.join(work, "in_clip_l_False.safetensors")
    out = os.path.join(work, "out_prefixed.safetensors")
    run(exe, flux, "text_encoder", prefixed, inputs, out)
    with torch.no_grad():
        want = clip_l(input_ids=ids).pooler_output
    err = ((load_file(out)["pooled"] - want).abs().max() / want.abs().max()).item()
    print(f"clip_l with the text_model. prefix: max relative difference {err:.2e}")
    assert err < TOL
    # Bad input is a clear error (exit 2), not a crash: an id outside the vocabulary, a 1-D tensor.
    for label, bad in (("out of vocabulary", torch.tensor([[1, 2, 1000]])), ("1-D", torch.tensor([1, 2, 3]))):
        inputs = os.path.join(work, "bad.safetensors")
        save_file({"input_ids": bad}, inputs)
        r = subprocess.run([exe, "forward", flux, "--component", "text_encoder_2", "--weights", os.path.join(work, "t5"),
                            "--inputs", inputs, "--out", os.path.join(work, "bad_out.safetensors")],
                           capture_output=True, text=True)
        assert r.returncode == 2, f"{label}: exit {r.returncode}: {r.stderr}"
        print(f"{label} input_ids: exit 2 ({r.stderr.strip().splitlines()[-1]})")
    with torch.device("meta"):
        counts = {
            "t5-xxl encoder": T5EncoderModel(T5Config(vocab_size=32128, d_model=4096, d_kv=64, d_ff=10240, num_layers=24,
                                                      num_heads=64, feed_forward_proj="gated-gelu")),
            "umt5-xxl encoder": UMT5EncoderModel(UMT5Config(vocab_size=256384, d_model=4096, d_kv=64, d_ff=10240,
                                                            num_layers=24, num_heads=64, feed_forward_proj="gated-gelu")),
            "clip-l": CLIPTextModel(CLIPTextConfig(vocab_size=49408, hidden_size=768, intermediate_size=3072,
                                                   num_hidden_layers=12, num_attention_heads=12,
                                                   max_position_embeddings=77)),
            "clip-g with projection": CLIPTextModelWithProjection(CLIPTextConfig(
                vocab_size=49408, hidden_size=1280, intermediate_size=5120, num_hidden_layers=32,
                num_attention_heads=20, max_position_embeddings=77, projection_dim=1280, hidden_act="gelu")),
        }
        counts["qwen3-4b"] = Qwen3Model(Qwen3Config(
            vocab_size=151936, hidden_size=2560, intermediate_size=9728, num_hidden_layers=36, num_attention_heads=32,
            num_key_value_heads=8, head_dim=128))
        full = Qwen2_5_VLForConditionalGeneration(Qwen2_5_VLConfig(text_config=dict(
            vocab_size=152064, hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
            num_key_value_heads=4, tie_word_embeddings=False), vision_config=dict(
            depth=32, hidden_size=1280, intermediate_size=3420, num_heads=16, out_hidden_size=3584),
            tie_word_embeddings=False))
        counts["qwen2.5-vl-7b language model"] = full.model.language_model
        counts["qwen2.5-vl-7b vision tower"] = full.model.visual
        counts["qwen2.5-vl-7b (all, with the LM head)"] = full
        mistral = Mistral3ForConditionalGeneration(Mistral3Config(text_config=dict(
            model_type="mistral", vocab_size=131072, hidden_size=5120, intermediate_size=32768, num_hidden_layers=40,
            num_attention_heads=32, num_key_value_heads=8, head_dim=128, tie_word_embeddings=False,
            sliding_window=None), vision_config=dict(
            model_type="pixtral", hidden_size=1024, intermediate_size=4096, num_hidden_layers=24,
            num_attention_heads=16, head_dim=64, patch_size=14, image_size=1540), tie_word_embeddings=False))
        counts["mistral-small-3.1 language model"] = mistral.model.language_model
        counts["mistral-small-3.1 (all, with the tower, projector and LM head)"] = mistral
        for label, m in counts.items():
            print(f"full-size parameters, {label}: {sum(p.numel() for p in m.parameters())}")
    print(f"all match transformers (worst {worst:.2e})")


if __name__ == "__main__":
    main()
