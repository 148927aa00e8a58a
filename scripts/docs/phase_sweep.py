#!/usr/bin/env python3
"""Every phase predicted beside measured (issue 31): each tiny preset trained for two steps on the CPU (a
LoRA, fp32, batch 2 at 64², a preview and a save at step 2), with latents cached or encoded on the fly, the
text encoders resident or their embeddings cached, checkpointing off or full; and with latents and captions
cached, the partial policies every:2, first:1, offload, selective:attn and selective:mlp, and batch 1 with
gradient_accumulation 2. It reads each run's
memory.json (`phase_peak_bytes` measured, `predicted_phase_peak_bytes`) and prints a Markdown table of each
phase's error, and with --json the rows.

    scripts/docs/phase_sweep.py [--bin build/bin/gclab] [--work output/phase_sweep] [--presets a,b] [--json F]
                                [--tolerance 0.05] [--frames N]

--frames N (a video family's presets, with a --bin that has them registered): the data are clips of N
frames (`gclab synth --frames N`), the dataset's and the preview's num_frames N.

Wan 2.2 TI2V (`*-5b`) runs with do_i2v (its UI's default), a ctrl_img on its preview, latents encoded on
the fly, and cached with the clips' first frames' latents beside them (with the captions cached, no partial
policies: they change nothing the first frame touches). An image-to-video preset (`*-i2v`) conditions every step on the clips' first frames, so its latents are never
cached (gclab refuses it, as AI Toolkit fails on it); its preview takes a ctrl_img, and it runs checkpointing
full under model.low_vram too (its image encoder in host memory until the first step, and during previews).

Wan 2.2 A14B (`*-14b*`, two experts) runs full_lowvram as well: each expert in host memory until the forward
that runs it, the other sent back — four steps of switch_boundary_every 1 and a save at step 3 (from step 3
on both experts' optimizer state is held, the estimate's steady state; a preview sends the expert on the
device back to host memory before its decode).

With --tolerance it exits 1 when a phase's |error| exceeds it (ctest memory.phase_sweep: every phase within 5%).
"""
import argparse
import json
import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
PRESETS = ["tiny-flux", "tiny-qwen-image", "tiny-qwen-image-edit", "tiny-zimage", "tiny-sd3", "tiny-dit", "tiny-wan21"]
# gc_<name>: the run's checkpoint policy and, for acc2, its batch and accumulation. The partial policies and
# accumulation run in one data combination (latents and captions cached): what they change is the blocks'
# activations and the gradients' lifetime, which the other combinations do not touch.
VARIANTS = {"off": {"checkpoint_policy": "off"}, "full": {"checkpoint_policy": "full"},
            "every2": {"checkpoint_policy": "every:2"}, "first1": {"checkpoint_policy": "first:1"},
            "offload": {"checkpoint_policy": "offload"}, "sel_attn": {"checkpoint_policy": "selective:attn"},
            "sel_mlp": {"checkpoint_policy": "selective:mlp"},
            "off_acc2": {"checkpoint_policy": "off", "batch_size": 1, "gradient_accumulation": 2},
            "full_lowvram": {"checkpoint_policy": "full"}}
PARTIAL = ["every2", "first1", "offload", "sel_attn", "sel_mlp", "off_acc2"]
PHASES = ["setup", "cache", "data", "text", "forward", "backward", "optimizer", "sample", "save"]
ENV = dict(os.environ, OMP_NUM_THREADS="1")


def run(cmd):
    return subprocess.run(cmd, cwd=ROOT, env=ENV, capture_output=True, text=True)


def config(preset, cached_latents, cached_text, gc, work, frames=1, controls=False):
    # A control folder and a ctrl_img: an edit model's, or (--controls) a model whose references are optional.
    edit = preset.endswith("-edit") or preset.endswith("-kontext") or controls
    i2v = preset.endswith("-i2v")
    ti2v = preset.endswith("-5b")  # Wan 2.2 TI2V: do_i2v, as AI Toolkit's UI sets it
    name = f"{preset}-{'cached' if cached_latents else 'fly'}-{'te_cached' if cached_text else 'te'}-gc_{gc}"
    dataset = {"folder_path": str(work / "data"), "resolution": [64], "cache_latents": cached_latents,
               "num_frames": frames, "do_i2v": ti2v}
    if edit:
        dataset["control_path"] = [str(work / "controls")]
    sample = {"sample_every": 2, "width": 64, "height": 64, "sample_steps": 2, "seed": 3, "guidance_scale": 2,
              "prompts": ["a red circle"], "num_frames": frames}
    if edit or i2v or ti2v:
        sample["prompts"] = [f"a red circle --ctrl_img {work / 'controls' / 'synth_0000.png'}"]
    return name, {
        "name": name, "device": "cpu", "training_folder": str(work / "runs"), "training_seed": 7,
        "datasets": [dataset], "model": {"arch": preset, "low_vram": gc.endswith("_lowvram")},
        "network": {"type": "lora", "linear": 4, "linear_alpha": 4},
        "train": {"batch_size": 2, "steps": 2, "lr": 1e-3, "dtype": "fp32",
                  "gradient_checkpointing": VARIANTS[gc]["checkpoint_policy"] != "off", "skip_first_sample": True,
                  "optimizer": "adamw", "cache_text_embeddings": cached_text, **VARIANTS[gc]},
        "sample": sample, "save": {"dtype": "float32", "save_every": 2}}


def experts_steps(c, preset):
    # Wan 2.2 A14B: four steps, a save at step 3 — both experts' optimizer state held (the estimate's steady
    # state: torch's optimizers make an expert's state at its first update, step 2), and under low_vram an
    # expert on the device at the save and in step 4's data phase (a preview sends it to host memory before
    # its decode, as Wan22Pipeline's aggressive offload does: the step-2 preview).
    if "-14b" in preset:
        c["train"]["steps"] = 4
        c["save"]["save_every"] = 3
    return c


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default=str(ROOT / "build/bin/gclab"))
    ap.add_argument("--work", default=str(ROOT / "output/phase_sweep"))
    ap.add_argument("--presets", default=",".join(PRESETS))
    ap.add_argument("--json")
    ap.add_argument("--tolerance", type=float)
    ap.add_argument("--frames", type=int, default=1)
    ap.add_argument("--controls", action="store_true", help="every run with a control folder and a ctrl_img")
    a = ap.parse_args()
    work = pathlib.Path(a.work).resolve()
    (work / "runs").mkdir(parents=True, exist_ok=True)
    for folder, sizes, seed in [("data", "64x64", 1), ("controls", "64x64", 9)]:
        if not (work / folder).is_dir():
            r = run([a.bin, "synth", "--out", str(work / folder), "--count", "4", "--sizes", sizes, "--seed", str(seed),
                     "--frames", str(a.frames if folder == "data" else 1)])
            if r.returncode:
                sys.exit(r.stderr)
    rows, failed = [], []
    for preset in a.presets.split(","):
        ti2v = preset.endswith("-5b")
        i2v = preset.endswith("-i2v") or ti2v
        experts = "-14b" in preset  # Wan 2.2 A14B: under low_vram one expert on the device at a time
        for cached_latents in [False] if preset.endswith("-i2v") else [False, True]:
            for cached_text in [True] if ti2v and cached_latents else [False, True]:
                for gc in ["off", "full"] + (PARTIAL if cached_latents and cached_text and not ti2v else []) + \
                        (["full_lowvram"] if i2v or experts else []):
                    name, c = config(preset, cached_latents, cached_text, gc, work, a.frames, a.controls)
                    c = experts_steps(c, preset)
                    path = work / f"{name}.yaml"
                    path.write_text(json.dumps(c))
                    r = run([a.bin, "train", str(path), "--from-scratch"])
                    if r.returncode:
                        print(f"{name}: exit {r.returncode}\n{r.stderr[-2000:]}", file=sys.stderr)
                        failed.append(f"{name}: exit {r.returncode}")
                        continue
                    run_dir = work / "runs" / name
                    memory = json.loads((run_dir / "memory.json").read_text())
                    measured = memory["phase_peak_bytes"]
                    predicted = memory["predicted_phase_peak_bytes"]
                    rows.append({"run": name, "measured": measured, "predicted": predicted})
    if a.json:
        pathlib.Path(a.json).write_text(json.dumps(rows, indent=1))
    print("| run | " + " | ".join(PHASES) + " |")
    print("|---|" + "---|" * len(PHASES))
    worst = 0.0
    for row in rows:
        cells = []
        for p in PHASES:
            m, q = row["measured"].get(p), row["predicted"].get(p)
            if m is None or q is None or m == 0:
                cells.append("—")
                continue
            err = (q - m) / m
            worst = max(worst, abs(err))
            cells.append(f"{err:+.1%}")
            bound = a.tolerance
            if bound is not None and abs(err) > bound:
                failed.append(f"{row['run']} {p}: predicted {q}, measured {m} ({err:+.1%}, bound {bound:.0%})")
        print(f"| {row['run']} | " + " | ".join(cells) + " |")
    print(f"\nworst |error|: {worst:.1%}")
    if failed:
        print("\n".join(["", "outside the bounds:"] + failed))
        sys.exit(1)


if __name__ == "__main__":
    main()
