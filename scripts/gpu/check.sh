#!/usr/bin/env bash
# The GPU check, one command. Run ON THE GPU MACHINE (device tool), after scripts/gpu/prepare.sh here:
#   command: bash scripts/gpu/check.sh     carry: ["third_party/root", "third_party/shared"]
# Rehearsal, here on the CPU (the same script, CUDA steps skipped, configured against only what
# prepare.sh carries):
#   scripts/gpu/prepare.sh && GCLAB_GPU_REHEARSAL=1 scripts/gpu/check.sh
# Builds against the machine's own python3 torch, runs the CUDA tests, then measures: FLUX.1-dev LoRA at
# 512² and 1024² under a 24 GB cap, GC off vs full (step time from CUDA events, peak, MFU); the base as
# uint4 and with layer offloading at 1024²; `fit` under 24/48/80 GB; the GPU-scale OOM pairs; the text
# encoders' encode peaks at full size. Everything lands in $OUT (or ./gpu-out); summary.md first.
# Each stage has its own time limit; together they stay under 9 minutes on 16 cores.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT="${OUT:-$PWD/gpu-out}"
REHEARSAL="${GCLAB_GPU_REHEARSAL:-0}"
DEPS="$PWD/third_party/root"
SHARED="$PWD/third_party/shared"
mkdir -p "$OUT"
summary="$OUT/summary.md"
say() { echo "$*" | tee -a "$summary"; }
[ -d "$DEPS/usr" ] && [ -d "$SHARED" ] || { echo "check: run scripts/gpu/prepare.sh first (third_party/root, third_party/shared)"; exit 2; }

# Only what prepare.sh carries: its libraries, pkg-config files and CMake packages. The system's CMake
# packages and .pc files are hidden from the configure step, so a package prepare.sh forgot fails here.
export PATH="$DEPS/usr/bin:$PATH"
export LD_LIBRARY_PATH="$DEPS/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}"
export PKG_CONFIG_LIBDIR="$DEPS/usr/lib/x86_64-linux-gnu/pkgconfig:$DEPS/usr/share/pkgconfig"
if [ "$REHEARSAL" = 1 ]; then  # a 2-core CPU: the build and the tests take longer than on 16 cores
  PY="$PWD/.venv/bin/python"
  BUILD=build-rehearsal
  BUILD_LIMIT=1200
else
  PY="$(command -v python3)"
  BUILD=build-gpu
  BUILD_LIMIT=300
fi

: > "$summary"
say "# gclab GPU check, $(date -u +%FT%TZ)$([ "$REHEARSAL" = 1 ] && echo ' (rehearsal on the CPU)')"
say ""
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || echo "no nvidia-smi"
  "$PY" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'available', torch.cuda.is_available())"
  nvcc --version 2>/dev/null | tail -1; } 2>&1 | sed 's/^/    /' | tee -a "$summary"

table() { sed -n 's/^# |/|/p' "$OUT/$1.log"; }  # the markdown table a command printed as YAML comments

stage() {  # stage NAME SECONDS command...: runs with a limit, logs to $OUT/NAME.log, says how it went
  local name=$1 limit=$2; shift 2
  local t0=$SECONDS
  timeout "$limit" "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  say "- $name: exit $rc in $((SECONDS - t0)) s (limit $limit s)"
  return $rc
}

stage configure 90 cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGCLAB_PYTHON="$PY" \
  -DGCLAB_SHARED_DIR="$SHARED" -DCMAKE_IGNORE_PREFIX_PATH=/usr \
  -DCMAKE_PREFIX_PATH="$DEPS/usr;$DEPS/usr/lib/x86_64-linux-gnu/cmake;$DEPS/usr/share/cmake" \
  -DCMAKE_CXX_FLAGS="-isystem $DEPS/usr/include" -DTORCH_CUDA_ARCH_LIST=9.0 ||
  { tail -30 "$OUT/configure.log"; exit 1; }
stage build "$BUILD_LIMIT" cmake --build "$BUILD" -j "$(nproc)" || { tail -40 "$OUT/build.log"; exit 1; }
if [ "$REHEARSAL" = 1 ]; then
  stage ctest 600 bash -c "cd $BUILD && OMP_NUM_THREADS=1 ctest -j $(nproc) --timeout 300 --output-on-failure"
  rc=$?
  say "- CUDA tests and GPU measurements: skipped (rehearsal)"
  exit $rc
fi
stage ctest 150 bash -c "cd $BUILD && ctest -j 8 --timeout 120 --output-on-failure"
rc=$?
tail -3 "$OUT/ctest.log" | sed 's/^/    /' | tee -a "$summary"
# The CUDA tests by name: they must have run, not skipped.
grep -E "(Cuda|cuda).*(Passed|Failed|Skipped|Not Run)" "$OUT/ctest.log" | sed 's/^ */    /' | tee -a "$summary"

say ""
say "## The text encoders' encode peaks at full size (bf16), against text/memory.h's prediction for CUDA"
stage text_cuda 90 "$BUILD/bin/text_cpu" --cuda
grep '^|' "$OUT/text_cuda.log" | tee -a "$summary"

G="$BUILD/bin/gclab"
FLUX=configs/oom/gpu_flux_gc_on_24gb.yaml
say ""
say "## FLUX.1-dev LoRA under 24 GB, GC off vs full"
stage bench_flux_24gb 150 "$G" bench "$FLUX" --gc off,full --resolution 512,1024 --steps 2 --set device=cuda
table bench_flux_24gb | tee -a "$summary"
say ""
say "## The same LoRA with the base as uint4, and with layer offloading (GC full, 1024²: step time, peak)"
stage bench_flux_uint4 90 "$G" bench "$FLUX" --gc full --resolution 1024 --steps 2 --set device=cuda \
  --set model.qtype=uint4
table bench_flux_uint4 | tee -a "$summary"
stage bench_flux_offload 90 "$G" bench "$FLUX" --gc full --resolution 1024 --steps 2 --set device=cuda \
  --set model.layer_offloading=true
table bench_flux_offload | tee -a "$summary"
say ""
say "## fit under 24 / 48 / 80 GB (1024², batches up to 8)"
for cap in 24GiB 48GiB 80GiB; do  # cards are sized in GiB: a 4090 holds 24,564 MiB
  stage "fit_$cap" 60 "$G" fit "$FLUX" --vram-cap "$cap" --gc off,full --resolution 1024 --max-batch 8
  table "fit_$cap" | grep "^| 1024" | sed "s/^/$cap /" | tee -a "$summary"
done
say ""
say "## The OOM pair (20 steps each: GC off runs out, GC on finishes)"
"$G" synth --out output/oom/data_1024 --count 8 --sizes 1024x1024,1216x832 > /dev/null 2>&1
stage oom_gc_off 90 "$G" train configs/oom/gpu_flux_gc_off_24gb.yaml --set train.steps=4
say "    (exit 3 expected) $(grep -m1 'out of memory at step' "$OUT/oom_gc_off.log")"
stage oom_gc_on 120 "$G" train "$FLUX" --set train.steps=4
say "    $(grep -m1 'loaded:' "$OUT/oom_gc_on.log") (the bf16 transformer quantized on the device)"
say ""
say "## OOM at the first sample: the 1024² preview's VAE decode (exit 3), then decoded in tiles (exit 0)"
stage oom_preview_decode 150 "$G" train configs/oom/gpu_flux_preview_decode.yaml --set datasets.0.folder_path=output/oom/data_1024
say "    (exit 3 expected) $(grep -m1 'out of memory at step' "$OUT/oom_preview_decode.log")"
say "    $(grep -m1 'loaded:' "$OUT/oom_preview_decode.log") (low_vram: quantized in host memory)"
stage oom_preview_tiled 150 "$G" train configs/oom/gpu_flux_preview_decode_fixed.yaml --set datasets.0.folder_path=output/oom/data_1024
exit $rc
