#!/usr/bin/env bash
# Run HERE (the development machine) before a GPU check. Builds what the check runs — the gclab executable,
# the two test executables that hold the CUDA tests, text_cpu — against the venv's torch (2.11.0, the CUDA
# 13.0 build the GPU machine's python3 also has; nvcc here compiles the CUDA parts), and packs them with the
# runtime libraries the GPU machine lacks (yaml-cpp, spdlog, fmt, libwebp, SentencePiece, ICU: the ones
# `ldd` resolves outside torch and the base system) into one archive the device call carries:
#
#   third_party/gpu/bundle.tar.xz    carry ["third_party/gpu"]; check.sh unpacks it in a second
#
# Why binaries rather than a build there: a cold build of these targets is minutes of the GPU machine's 8
# (docs/gpu.md has the figures); the archive is ~20 MiB and unpacks in seconds. Nothing of torch travels:
# the GPU machine's own torch libraries are loaded (LD_LIBRARY_PATH), the preflight checks the version.
set -euo pipefail
cd "$(dirname "$0")/../.."
TARGETS=(gclab test_ckpt test_train text_cpu)
STAGE=build-gpu-bundle
OUTDIR=third_party/gpu

args=()
for t in "${TARGETS[@]}"; do args+=(--target "$t"); done
scripts/build.sh "${args[@]}"

rm -rf "$STAGE" && mkdir -p "$STAGE/bin" "$STAGE/lib"
for t in "${TARGETS[@]}"; do
  cp build/bin/"$t" "$STAGE/bin/"
  strip --strip-unneeded "$STAGE/bin/$t"
done
# The libraries the binaries load from outside torch's folder, the CUDA wheels and the base system.
torch_lib=$(.venv/bin/python -c "import os, torch; print(os.path.join(os.path.dirname(torch.__file__), 'lib'))")
site=$(cd "$torch_lib/../.." && pwd)
base=$(python3 scripts/gpu/preflight.py --base-pattern)  # the one list of what every machine has
for t in "${TARGETS[@]}"; do
  LD_LIBRARY_PATH="$torch_lib" ldd "$STAGE/bin/$t" | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}'
done | sort -u | while read -r lib path; do
  echo "$lib" | grep -Eq "$base" && continue
  # torch's CUDA wheels (nvidia/*/lib) hold the CUDA runtime the GPU machine's torch loads: the system
  # toolkit's copy (/usr/local/cuda) stays here, so that one libcudart is loaded there, not two.
  case "$(readlink -f "$path")" in "$site"/* | /usr/local/cuda*) continue ;; esac
  cp -L "$path" "$STAGE/lib/$lib"
  strip --strip-unneeded "$STAGE/lib/$lib" 2>/dev/null || true
done
{
  echo "torch: $(.venv/bin/python -c 'import torch; print(torch.__version__)')"
  echo "commit: $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- src include bench tests || echo ' (with local changes)')"
  echo "built: $(date -u +%FT%TZ) on $(uname -m) with $(c++ --version | head -1)"
  echo "binaries: ${TARGETS[*]}"
  echo "libraries: $(cd "$STAGE/lib" && ls | tr '\n' ' ')"
} > "$STAGE/MANIFEST.txt"
rm -rf "$OUTDIR" && mkdir -p "$OUTDIR"
tar -cJf "$OUTDIR/bundle.tar.xz" -C "$STAGE" .
du -sh "$STAGE/bin" "$STAGE/lib" "$OUTDIR/bundle.tar.xz" | sed 's/^/prepare: /'
tree_kib=$(($(git ls-files -co --exclude-standard -z | xargs -0 du -cb | tail -1 | cut -f1) / 1024))
echo "prepare: the device call carries ${tree_kib} KiB of tree + $(du -k "$OUTDIR/bundle.tar.xz" | cut -f1) KiB of bundle"
echo "prepare: rehearse with GCLAB_GPU_REHEARSAL=1 scripts/gpu/check.sh; on the GPU: command 'bash scripts/gpu/check.sh'," \
  "carry [\"third_party/gpu\"], timeout_s 540"
