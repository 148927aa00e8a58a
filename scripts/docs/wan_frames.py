"""The Wan 2.1 estimate over frames x resolution (docs/results/wan.md): `gclab estimate` of AI Toolkit's own
train_lora_wan21_1b_24gb.yaml (../shared/aitk-configs), as written and with the 14B's name_or_path, at each
num_frames and resolution — tokens, the step's peak with checkpointing off and full, what the blocks keep,
and the slope per latent frame (4 frames).

Then the weights per qtype: the transformer's bytes as each `model.qtype` stores it (bf16 without
`quantize`), and the load's device peak with and without `low_vram` (UMT5 quantized, as the config says).

  wan_frames.py [--bin build/bin/gclab] [--config PATH] [--qtypes-only] [--models wan21-i2v-14b,wan22-5b]

The qtype table's "weights" are what the device holds through the steps: for Wan 2.2 A14B under low_vram one
expert's frozen weights (the other waits in host memory) and both experts' adapters.
"""
import argparse
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FRAMES = [1, 17, 33, 49, 81]
RESOLUTIONS = [480, 632]
# The image-to-video models train on the clips' pixels (no cached latents); Wan 2.1 I2V previews need a
# ctrl_img (sampling off here), Wan 2.2 TI2V runs with do_i2v as AI Toolkit's UI sets it.
MODELS = [("wan21-1.3b", []), ("wan21-14b", ["model.name_or_path=Wan-AI/Wan2.1-T2V-14B-Diffusers"]),
          ("wan21-i2v-14b", ["model.arch=wan21_i2v", "model.name_or_path=Wan-AI/Wan2.1-I2V-14B-480P-Diffusers",
                             "datasets.0.cache_latents_to_disk=false", "train.disable_sampling=true"]),
          ("wan22-5b", ["model.arch=wan22_5b", "model.name_or_path=Wan-AI/Wan2.2-TI2V-5B-Diffusers",
                        "datasets.0.cache_latents_to_disk=false", "datasets.0.do_i2v=true"]),
          # Wan 2.2 A14B: two experts, one on the device at a time under low_vram (its UI's default).
          ("wan22-14b", ["model.arch=wan22_14b", "model.name_or_path=ai-toolkit/Wan2.2-T2V-A14B-Diffusers-bf16",
                         "model.low_vram=true"]),
          ("wan22-14b-i2v", ["model.arch=wan22_14b_i2v", "model.name_or_path=ai-toolkit/Wan2.2-I2V-A14B-Diffusers-bf16",
                             "model.low_vram=true", "datasets.0.cache_latents_to_disk=false",
                             "train.disable_sampling=true"])]


def estimate(gclab, config, sets):
    args = [gclab, "estimate", config, "--json"]
    for s in sets:
        args += ["--set", s]
    r = subprocess.run(args, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"gclab estimate {' '.join(sets)}: exit {r.returncode}\n{r.stderr}")
    return json.loads(r.stdout)["estimate"]


def gib(b):
    return f"{b / 2**30:.2f}"


QTYPES = [None, "qfloat8", "int8", "uint4", "uint3"]


def qtype_table(a):
    print("\n### The transformer's weights per qtype, and the load\n")
    print("| model | qtype | weights (GiB) | load peak on the device (GiB) | with low_vram (GiB) |")
    print("|---|---|---|---|---|")
    for preset, extra in MODELS:
        for q in QTYPES:
            sets = extra + (["model.quantize=true", f"model.qtype={q}"] if q else ["model.quantize=false"])
            on, low = (estimate(a.bin, a.config, sets + [f"model.low_vram={v}"]) for v in ("false", "true"))
            print(f"| {preset} | {q or 'bf16 (no quantize)'} | {gib(on['weights'])} | "
                  f"{gib(on['load']['device_peak'])} | {gib(low['load']['device_peak'])} |")
        sys.stdout.flush()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default=os.path.join(ROOT, "build", "bin", "gclab"))
    ap.add_argument("--config", default=os.path.join(ROOT, "..", "shared", "aitk-configs",
                                                     "train_lora_wan21_1b_24gb.yaml"))
    ap.add_argument("--qtypes-only", action="store_true")
    ap.add_argument("--models", help="comma-separated presets of MODELS (default: all)")
    a = ap.parse_args()
    if a.models:
        keep = a.models.split(",")
        MODELS[:] = [m for m in MODELS if m[0] in keep]
    if a.qtypes_only:
        return qtype_table(a)
    for preset, extra in MODELS:
        print(f"\n### {preset}\n")
        print("| resolution | bucket tokens / frame | frames | latent frames | tokens | GC off peak (GiB) | "
              "GC full peak (GiB) | blocks keep, GC off (GiB) | GC full (GiB) |")
        print("|---|---|---|---|---|---|---|---|---|")
        for res in RESOLUTIONS:
            rows = []
            for frames in FRAMES:
                e = estimate(a.bin, a.config, extra + [f"datasets.0.resolution=[{res}]",
                                                       f"datasets.0.num_frames={frames}"])
                assert e["preset"] == preset, e["preset"]
                r = e["per_resolution"][0]
                latent = 1 + (frames - 1) // 4
                rows.append((frames, latent, r["image_tokens"], r["gc_off"], r["gc_full"]))
                print(f"| {res} | {r['image_tokens'] // latent} | {frames} | {latent} | {r['image_tokens']} | "
                      f"{gib(r['gc_off']['total'])} | {gib(r['gc_full']['total'])} | "
                      f"{gib(r['gc_off']['activations'])} | {gib(r['gc_full']['activations'])} |")
            (f0, l0, _, off0, full0), (f1, l1, _, off1, full1) = rows[-2], rows[-1]
            per = l1 - l0
            print(f"| {res} | per latent frame, {f0} → {f1} frames | | | | "
                  f"+{gib((off1['total'] - off0['total']) / per)} | +{gib((full1['total'] - full0['total']) / per)} | "
                  f"+{gib((off1['activations'] - off0['activations']) / per)} | "
                  f"+{gib((full1['activations'] - full0['activations']) / per)} |")
        sys.stdout.flush()
    qtype_table(a)


if __name__ == "__main__":
    main()
