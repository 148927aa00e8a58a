#!/usr/bin/env bash
# Run ON THE GPU MACHINE (device tool), after scripts/gpu/prepare.sh here, carrying third_party/root:
#   command: bash scripts/gpu/check.sh     carry: ["third_party/root"]
# Builds gclab against that machine's own python3 torch and its CUDA, runs every test (the CUDA ones
# run instead of skipping there) and writes logs and a summary to $OUT (or ./gpu-out).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT="${OUT:-$PWD/gpu-out}"
mkdir -p "$OUT"
DEPS="$PWD/third_party/root"
export LD_LIBRARY_PATH="$DEPS/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}"
export PATH="$DEPS/usr/bin:$PATH"
export PKG_CONFIG_PATH="$DEPS/usr/lib/x86_64-linux-gnu/pkgconfig:$DEPS/usr/share/pkgconfig"
PY="$(command -v python3)"
{
  echo "# gclab GPU check, $(date -u +%FT%TZ)"
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1
  "$PY" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name(0))"
  nvcc --version | tail -1
} > "$OUT/summary.txt" 2>&1
cat "$OUT/summary.txt"

cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DGCLAB_PYTHON="$PY" \
      -DCMAKE_PREFIX_PATH="$DEPS/usr;$DEPS/usr/lib/x86_64-linux-gnu/cmake" \
      -DCMAKE_CXX_FLAGS="-isystem $DEPS/usr/include" -DTORCH_CUDA_ARCH_LIST=9.0 \
      > "$OUT/configure.log" 2>&1 || { echo "configure failed"; tail -40 "$OUT/configure.log"; exit 1; }
cmake --build build-gpu -j "$(nproc)" > "$OUT/build.log" 2>&1 || { echo "build failed"; tail -60 "$OUT/build.log"; exit 1; }
(cd build-gpu && ctest -j 8 --output-on-failure --timeout 300) > "$OUT/ctest.log" 2>&1
rc=$?
tail -5 "$OUT/ctest.log" | tee -a "$OUT/summary.txt"
# The CUDA tests by name, with their own output (ran, not skipped).
build-gpu/bin/test_ckpt --gtest_filter='*Cuda*' 2>&1 | grep -E "^\[ +(OK|FAILED|SKIPPED|RUN) +\]" | tee -a "$OUT/summary.txt"
# The issue-level measurements on the GPU, bounded in time: the checkpoint micro-benchmark (CPU stack, for
# reference), then FLUX.1-dev LoRA at 512 and 1024 under AI Toolkit's 24 GB cap, GC off vs full, and the
# prediction beside it.
G=build-gpu/bin/gclab
timeout 120 build-gpu/bin/ckpt_micro --runs 3 --python none > "$OUT/ckpt_micro.md" 2>&1
timeout 60 $G estimate configs/oom/gpu_flux_gc_on_24gb.yaml > "$OUT/estimate_flux_24gb.txt" 2>&1
timeout 240 $G bench configs/oom/gpu_flux_gc_on_24gb.yaml --gc off,full --resolution 512,1024 --steps 2 \
  > "$OUT/bench_flux_24gb.md" 2> "$OUT/bench_flux_24gb.log"
cat "$OUT/bench_flux_24gb.md" | tee -a "$OUT/summary.txt"
exit $rc
