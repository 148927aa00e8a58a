#!/usr/bin/env python3
"""A LoRA file gclab trains carries the hashes AI Toolkit's trainer writes (issue 32, row 20).

AI Toolkit's network save (toolkit/network_mixins.py:654) calls toolkit/metadata.py add_model_hash_to_meta:
the state dict serialised by safetensors with the file's ss_* metadata alone, then
toolkit/train_tools.py addnet_hash_safetensors (SHA-256 of the bytes after the header) and
addnet_hash_legacy (the first 8 hex digits of the SHA-256 of the 64 KiB at 1 MiB). This script trains a
tiny LoRA with gclab (one small, one over 1 MiB so the legacy hash reads real bytes), recomputes both
hashes that way with the safetensors library, and compares them with the file's.

    lora_hashes.py GCLAB WORK_DIR
"""
import hashlib
import io
import json
import os
import subprocess
import sys

import safetensors.torch


def addnet_hash_safetensors(b):  # toolkit/train_tools.py:162-176
    h = hashlib.sha256()
    b.seek(0)
    n = int.from_bytes(b.read(8), "little")
    b.seek(n + 8)
    for chunk in iter(lambda: b.read(1024 * 1024), b""):
        h.update(chunk)
    return h.hexdigest()


def addnet_hash_legacy(b):  # toolkit/train_tools.py:179-185
    m = hashlib.sha256()
    b.seek(0x100000)
    m.update(b.read(0x10000))
    return m.hexdigest()[0:8]


def main():
    gclab, work = sys.argv[1], os.path.abspath(sys.argv[2])
    os.makedirs(work, exist_ok=True)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    data = os.path.join(work, "data")
    if not os.path.isdir(data):
        subprocess.run([gclab, "synth", "--out", data, "--count", "2", "--sizes", "64x64"], check=True, env=env)
    for name, arch, rank in [("small", "tiny-zimage", 4), ("large", "tiny-flux", 64)]:
        cfg = {"name": name, "device": "cpu", "training_folder": os.path.join(work, "runs"), "trigger_word": "sks",
               "datasets": [{"folder_path": data, "resolution": [64]}], "model": {"arch": arch},
               "network": {"type": "lora", "linear": rank, "linear_alpha": rank},
               "train": {"batch_size": 1, "steps": 1, "lr": 1e-3, "dtype": "fp32"},
               "save": {"dtype": "float32"}}
        path = os.path.join(work, name + ".yaml")
        with open(path, "w") as f:
            json.dump(cfg, f)
        subprocess.run([gclab, "train", path], check=True, env=env, capture_output=True)
        lora = os.path.join(work, "runs", name, name + ".safetensors")
        with safetensors.safe_open(lora, "pt") as f:
            meta = f.metadata()
        tensors = safetensors.torch.load_file(lora)
        ss = {k: v for k, v in meta.items() if k.startswith("ss_")}
        b = io.BytesIO(safetensors.torch.save(tensors, ss))
        size = len(b.getvalue())
        expected = {"sshs_model_hash": addnet_hash_safetensors(b), "sshs_legacy_hash": addnet_hash_legacy(b)}
        for key, value in expected.items():
            if meta.get(key) != value:
                raise SystemExit(f"{name}: {key} is {meta.get(key)!r}, AI Toolkit's computation gives {value!r}")
        print(f"{name} ({arch}, rank {rank}, {size} bytes): sshs hashes equal AI Toolkit's")
    print("ok")


if __name__ == "__main__":
    main()
