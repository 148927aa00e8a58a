#!/usr/bin/env python3
"""gclab's HTML reports in a real browser (issue 33): a tiny run's report.html, a bench's bench_report.html,
a fit's fit_report.html and an advise's advise.html, each loaded by headless Chromium from the file alone.
Each page must load with no console message, and its screenshot must show every chart drawn: each series
colour the page's charts use is found among the screenshot's pixels (a chart that failed to render leaves
its area white).

    tests/bench/browser_check.py GCLAB WORK_DIR

Exits 77 (ctest's skip) with a message when no Chromium is installed (scripts/setup.sh installs Debian's
chromium-headless-shell).
"""
import pathlib
import shutil
import subprocess
import sys

from PIL import Image

CHROMIUMS = ["chromium-headless-shell", "chromium", "chromium-browser", "google-chrome"]

CONFIG = """name: {name}
training_folder: {work}
device: cpu
training_seed: 3
network: {{type: lora, linear: 4, linear_alpha: 4}}
datasets:
  - folder_path: {work}/data
    resolution: [64]
train: {{batch_size: 2, steps: 4, lr: 1e-3, optimizer: adamw, dtype: fp32, skip_first_sample: true}}
sample: {{prompts: [a red circle], sample_every: 2, sample_steps: 2, width: 64, height: 64}}
model: {{arch: tiny-flux}}
"""

# Colours each page draws with (bench/svg.cpp's series and bars; RGB), at least one per chart.
PAGES = {
    "report.html": {"loss smoothed": (0x08, 0x51, 0x9C), "step time": (0xFF, 0x7F, 0x0E),
                    "backward peaks": (0xD6, 0x27, 0x28), "predicted bars": (0xAE, 0xC7, 0xE8)},
    "bench_report.html": {"policy off": (0x1F, 0x77, 0xB4), "policy full": (0xD6, 0x27, 0x28)},
    "fit_report.html": {"policy off": (0x1F, 0x77, 0xB4), "policy full": (0xD6, 0x27, 0x28)},
    "advise.html": {"step bars": (0x1F, 0x77, 0xB4), "preview bars": (0x94, 0x67, 0xBD)},
}


def run(cmd):
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"failed ({r.returncode}): {' '.join(map(str, cmd))}\n{r.stderr[-3000:]}")
    return r


def pixels_near(image, rgb, tolerance=6):
    n = 0
    for count, px in image.getcolors(maxcolors=1 << 24):
        if all(abs(px[i] - rgb[i]) <= tolerance for i in range(3)):
            n += count
    return n


def check_page(chromium, page, colours, work):
    shot = work / (page.stem + ".png")
    r = subprocess.run([chromium, "--no-sandbox", "--disable-gpu", "--hide-scrollbars", f"--screenshot={shot}",
                        "--window-size=1000,3200", "--enable-logging=stderr", "--v=0", page.resolve().as_uri()],
                       capture_output=True, text=True, timeout=120)
    if r.returncode != 0 or not shot.exists():
        sys.exit(f"{chromium} could not load {page}: {r.stderr[-2000:]}")
    console = [l for l in r.stderr.splitlines() if "CONSOLE" in l]
    if console:
        sys.exit(f"{page.name}: console messages:\n" + "\n".join(console))
    image = Image.open(shot).convert("RGB")
    for what, rgb in colours.items():
        n = pixels_near(image, rgb)
        print(f"{page.name}: {what}: {n} pixels")
        if n < 40:
            sys.exit(f"{page.name}: the {what} chart is blank in the screenshot ({n} pixels of #{bytes(rgb).hex()})")


def main():
    gclab, work = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
    chromium = next((shutil.which(c) for c in CHROMIUMS if shutil.which(c)), None)
    if not chromium:
        print("skipped: no Chromium here (scripts/setup.sh installs chromium-headless-shell)")
        sys.exit(77)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    run([gclab, "synth", "--out", work / "data", "--count", "6", "--sizes", "64x64"])
    config = work / "run.yaml"
    config.write_text(CONFIG.format(name="browser", work=work))
    run([gclab, "train", config, "--from-scratch"])
    run([gclab, "advise", config])  # advise.html, and the run's report.html with the advice in it
    run([gclab, "bench", config, "--gc", "off,full", "--batch", "1,2", "--resolution", "64", "--steps", "1"])
    run([gclab, "fit", config, "--gc", "off,full", "--resolution", "64", "--vram-cap", "40MiB", "--max-batch", "4"])
    for name, colours in PAGES.items():
        check_page(chromium, work / "browser" / name, colours, work)
    print("every page loaded with no console message and every chart drawn")


if __name__ == "__main__":
    main()
