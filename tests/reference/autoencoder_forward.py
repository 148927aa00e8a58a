"""What the autoencoder reference scripts (diffusers_vae.py, diffusers_qwen_vae.py) share: a config for
`gclab forward` with a given arch, and `gclab forward --component ...` on a weights folder."""
import os
import subprocess


def forward_config(work, arch):
    """Writes WORK/config.yaml (a CPU config of `arch`) and returns its path."""
    os.makedirs(work, exist_ok=True)
    path = os.path.join(work, "config.yaml")
    with open(path, "w") as f:
        f.write(f"name: vae\ndevice: cpu\nmodel: {{arch: {arch}}}\n"
                "datasets: [{folder_path: " + work + "}]\ntrain: {steps: 1}\n")
    return path


def run_component(exe, config_yaml, component, folder, inputs, out, extra=()):
    """gclab forward CONFIG --component COMPONENT --weights FOLDER --inputs IN --out OUT [EXTRA...]"""
    subprocess.run([exe, "forward", config_yaml, "--component", component, "--weights", folder, "--inputs", inputs,
                    "--out", out, *extra], check=True, stdout=subprocess.DEVNULL)
