#!/usr/bin/env python3
"""The GPU check's preflight (scripts/gpu/check.sh, stage setup): fails fast, with one clear line, when the
machine cannot run what travelled.

- the GPU (nvidia-smi) and torch's CUDA, on the GPU machine;
- torch's version is the one the bundle was built against (MANIFEST.txt): LibTorch's C++ ABI is per release;
- every library the binaries load resolves, and only from the bundle, torch's folder (and the CUDA wheels
  beside it) or the base system (libc, libstdc++, ...): a library found anywhere else is one the GPU machine
  may not have, which the bundle forgot (prepare.sh gathers them);
- gclab and the test executables start (`--help` / `--gtest_list_tests`): symbol versions are checked at load.
"""
import argparse
import os
import re
import subprocess
import sys

# The base system's libraries (and the driver's libcuda): on every machine, never carried. prepare.sh reads
# this pattern too (`preflight.py --base-pattern`), so the two agree on what travels.
BASE_PATTERN = r"^(linux-vdso|ld-linux|libc|libm|libdl|libpthread|librt|libgcc_s|libstdc\+\+|libutil|libcuda)\.so"
BASE = re.compile(BASE_PATTERN)


def run(cmd):
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as e:
        return subprocess.CompletedProcess(cmd, 127, "", str(e))


def main():
    if sys.argv[1:] == ["--base-pattern"]:
        print(BASE_PATTERN)
        return 0
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--torch-lib", required=True)
    ap.add_argument("--bundle-lib", default="")
    ap.add_argument("--manifest", default="")
    ap.add_argument("--gpu", action="store_true")
    a = ap.parse_args()
    problems = []

    smi = run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"])
    print("nvidia-smi:", smi.stdout.strip() if smi.returncode == 0 else "not available")
    if a.gpu and smi.returncode != 0:
        problems.append("nvidia-smi fails: no GPU visible")

    import torch  # the machine's torch (its python is the one running this)

    cuda = torch.cuda.is_available()
    print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, available {cuda}")
    if a.gpu and not cuda:
        problems.append("torch.cuda.is_available() is False")
    for tool in ("nvcc", "cmake", "c++"):  # not needed (the binaries travel built): said for the record
        r = run([tool, "--version"])
        lines = [l for l in r.stdout.splitlines() if l.strip()]
        print(f"{tool}: {(lines[-1] if tool == 'nvcc' else lines[0]) if r.returncode == 0 and lines else 'not found'}")
    if a.manifest:
        built = dict(l.split(": ", 1) for l in open(a.manifest).read().splitlines() if ": " in l)
        want = built.get("torch", "")
        if want.split("+")[0] != torch.__version__.split("+")[0]:
            problems.append(f"the bundle was built against torch {want}; this machine has {torch.__version__}")

    allowed = [os.path.realpath(p) for p in (a.bundle_lib, a.torch_lib) if p]
    allowed.append(os.path.realpath(os.path.join(a.torch_lib, "..", "..", "nvidia")))  # the CUDA wheels
    binaries = sorted(f for f in os.listdir(a.bin) if os.access(os.path.join(a.bin, f), os.X_OK))
    for name in binaries:
        path = os.path.join(a.bin, name)
        ldd = run(["ldd", path])
        for line in ldd.stdout.splitlines():
            m = re.match(r"\s*(\S+)\s*=>\s*(.*?)\s*(\(0x[0-9a-f]+\))?$", line)
            if not m:
                continue
            lib, where = m.group(1), m.group(2)
            if where == "not found":
                problems.append(f"{name} needs {lib}, which is not found")
            elif not BASE.match(lib) and not any(os.path.realpath(where).startswith(p) for p in allowed):
                problems.append(f"{name} loads {lib} from {where}: not carried (scripts/gpu/prepare.sh gathers it)")
        probe = {"gclab": [path, "--help"]}.get(name, [path, "--gtest_list_tests"] if name.startswith("test_") else None)
        r = run(probe) if probe else None
        if r is not None and r.returncode != 0:
            problems.append(f"{name} does not start: {(r.stderr or r.stdout).strip().splitlines()[-1:]}")
    print(f"binaries: {', '.join(binaries)}")
    for p in problems:
        print("preflight:", p)
    print("preflight: ok" if not problems else f"preflight: {len(problems)} problem(s)")
    return 0 if not problems else 2


if __name__ == "__main__":
    sys.exit(main())
