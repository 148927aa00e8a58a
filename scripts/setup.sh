#!/usr/bin/env bash
# Installs everything gclab needs, idempotently: Debian packages (compilers, yaml-cpp, spdlog, fmt,
# GoogleTest, CLI11, stb, libwebp, nlohmann-json, libsentencepiece, libicu, FFmpeg's libav*, ccache, clang-format) and LibTorch from the pinned `torch`
# wheel in a venv at .venv/. A second run checks, finds nothing missing, and says so.
set -euo pipefail
cd "$(dirname "$0")/.."

TORCH_VERSION="${GCLAB_TORCH_VERSION:-2.11.0}"
PYTHON="${GCLAB_BASE_PYTHON:-python3}"
APT_PACKAGES=(cmake ninja-build g++ make python3-venv ccache pkg-config
              libyaml-cpp-dev libspdlog-dev libfmt-dev libgtest-dev googletest libcli11-dev libstb-dev
              nlohmann-json3-dev libwebp-dev libsentencepiece-dev libicu-dev clang-format
              libgloo-dev  # Gloo's headers, which the torch wheel's c10d headers include and do not ship
              libavformat-dev libavcodec-dev libavutil-dev libswscale-dev  # video files (FFmpeg)
              chromium-headless-shell)  # the HTML reports' browser test (ctest report.browser)

did_something=0
# pip installs with --no-compile: byte-compiling every module of torch, transformers and diffusers at install
# is most of a warm-cache install's time; Python compiles what a test imports when it first imports it.
say() { echo "setup: $*"; }

# --- Debian packages ------------------------------------------------------------------------------
missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  did_something=1
  say "installing Debian packages: ${missing[*]}"
  SUDO=""
  if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null || { say "not root and no sudo: install these yourself: ${missing[*]}"; exit 1; }
    SUDO="sudo"
  fi
  if ! $SUDO apt-get update -qq; then
    say "apt-get update failed (network?). Retry: scripts/setup.sh"; exit 1
  fi
  if ! DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null; then
    say "apt-get could not install: ${missing[*]}. Retry: scripts/setup.sh (or apt-get install them by hand)"; exit 1
  fi
fi

# --- LibTorch from the torch wheel ---------------------------------------------------------------
torch_ok() {
  [ -x .venv/bin/python ] && .venv/bin/python - "$TORCH_VERSION" <<'PY' 2>/dev/null
import sys, torch, torch.utils
assert torch.__version__.split("+")[0] == sys.argv[1], torch.__version__
PY
}
if ! torch_ok; then
  did_something=1
  if [ ! -x .venv/bin/python ]; then
    say "creating .venv with $($PYTHON --version 2>&1)"
    "$PYTHON" -m venv .venv || { say "could not create .venv (is python3-venv installed?)"; exit 1; }
  fi
  # The default PyPI wheel of torch 2.11.0 is the CUDA 13.0 build; pip also brings the CUDA runtime
  # libraries it links (cuBLAS, cuDNN, NCCL, ...). About 2.7 GB to download, 4.7 GB installed.
  say "installing torch==$TORCH_VERSION (LibTorch for C++, and the Python reference) into .venv"
  if ! .venv/bin/python -m pip install --disable-pip-version-check --no-compile -q "torch==$TORCH_VERSION" numpy; then
    say "pip could not install torch==$TORCH_VERSION (network or disk?). Retry: scripts/setup.sh —"
    say "pip keeps what it already downloaded in its cache, so a retry resumes."
    exit 1
  fi
  torch_ok || { say "torch installed but 'import torch' fails in .venv; remove .venv and retry"; exit 1; }
fi

# The reference implementation of safetensors, used by the tests to show that files gclab writes open
# in the Python ecosystem and files it writes open in gclab (a small wheel).
if ! .venv/bin/python -c "import safetensors, numpy" 2>/dev/null; then
  did_something=1
  say "installing safetensors and numpy into .venv (interoperability tests)"
  .venv/bin/python -m pip install --disable-pip-version-check --no-compile -q safetensors numpy ||
    { say "pip could not install safetensors (network?). Retry: scripts/setup.sh"; exit 1; }
fi

# The reference implementations the tests compare gclab with (test-only, pinned): diffusers'
# transformers and LoRA loader (peft), transformers (its Adafactor too), prodigyopt's Prodigy, bitsandbytes'
# 8-bit AdamW / Adam / Lion (its CPU build runs them).
REFERENCE_PACKAGES=(diffusers==0.42.1 peft==0.18.0 transformers==5.24.0 accelerate==1.15.0 prodigyopt==1.1.2
                    bitsandbytes==0.50.2 sentencepiece==0.2.1 protobuf==7.36.2)
if ! .venv/bin/python - "${REFERENCE_PACKAGES[@]}" <<'PY' 2>/dev/null
import sys
from importlib.metadata import version
for spec in sys.argv[1:]:
    name, want = spec.split("==")
    assert version(name) == want, spec
PY
then
  did_something=1
  say "installing the test-only references into .venv: ${REFERENCE_PACKAGES[*]}"
  .venv/bin/python -m pip install --disable-pip-version-check --no-compile -q "${REFERENCE_PACKAGES[@]}" ||
    { say "pip could not install ${REFERENCE_PACKAGES[*]} (network?). Retry: scripts/setup.sh"; exit 1; }
fi

if [ "$did_something" -eq 0 ]; then
  say "everything is already installed (Debian packages, .venv with torch $TORCH_VERSION); nothing to do"
else
  say "done"
fi
