#!/usr/bin/env bash
# The GPU check: one command on the GPU machine, within a budget (480 s by default), every verdict in $OUT.
#
#   here, once:     scripts/gpu/prepare.sh       builds and packs what travels: third_party/gpu/bundle.tar.xz
#   on the GPU:     bash scripts/gpu/check.sh    (device tool: carry ["third_party/gpu"], timeout_s 540)
#   the plan:       scripts/gpu/check.sh --plan  the stages in the order they run, their limits, the sum
#   rehearsal:      GCLAB_GPU_REHEARSAL=1 scripts/gpu/check.sh   here, on the CPU: the same plan on each
#                   stage's CPU twin, against only what travels; fails if what travels is over 55 MiB or $OUT
#                   would hold more than 8 files
#   your own GPU:   GCLAB_GPU_BIN=build/bin scripts/gpu/check.sh   after scripts/build.sh (nothing unpacked)
#
# Stages run most valuable first. The core stages' limits, start-up included, sum to at most the budget;
# the later ones run only while the budget still holds their whole limit (else they are skipped, and the
# summary says so). A stage that runs over its limit is stopped (exit 124). What comes back: summary.md
# (one line per stage, measured beside predicted), logs.txt (every stage's output, appended as it runs, so
# a kill keeps what ran), metrics.jsonl (every run's step rows and bench cells, tagged with the stage), and
# the OOM reports of the runs that ran out — at most 8 files (docs/gpu.md).
set -uo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
REHEARSAL="${GCLAB_GPU_REHEARSAL:-0}"
if [ "$REHEARSAL" = 1 ]; then BUDGET="${GCLAB_GPU_BUDGET_S:-900}"; else BUDGET="${GCLAB_GPU_BUDGET_S:-480}"; fi
MAX_TRAVEL_MIB=55
MAX_OUT_FILES=8

# name | limit (s) | tier | what it measures. Core stages always run (their limits sum to <= the budget);
# "extra" ones only when the time left holds their whole limit.
PLAN=(
  "setup|15|core|unpack the carried bundle; preflight: nvidia-smi, torch and its CUDA, every library the binaries load; the OOM pair's data"
  "matmul|15|core|the machine's bf16 rate: an 8192^3 matmul, 3 warm-ups then 10 timed (MFU is held against it)"
  "cuda_tests|75|core|the CUDA tests (CheckpointCuda, MemoryCuda, CudaMeter, CudaTrain), each in a process of its own, 4 at a time"
  "estimate|20|core|gclab estimate of the OOM pair: the load and the step's peak per resolution, GC off and full"
  "oom_gc_off|75|core|FLUX.1-dev LoRA under a 24 GiB cap, GC off: runs out (exit 3), the report written"
  "oom_gc_on|90|core|the same with GC on: trains (exit 0); the load's and the steps' measured peaks beside the estimate"
  "bench|120|core|GC off vs full vs auto under 24 GiB at 512^2 and 1024^2, taking turns: CUDA-event step times, allocated and reserved peaks, MFU, auto's plan"
  "preview_decode|75|extra|OOM at the first sample: a 1024^2 preview's whole-image VAE decode under 22 GiB (exit 3)"
  "preview_tiled|75|extra|its twin, the decode tiled: trains and samples (exit 0)"
  "fit|60|extra|the largest batch at 1024^2 per policy under 24 GiB"
  "auto|90|extra|the OOM pair's run with checkpoint_policy auto under its 24 GiB cap: trains (exit 0); the plan, its predicted and measured peaks"
  "uint4|60|extra|the LoRA at 1024^2, GC full, the base as uint4 (dequantized per matmul)"
  "offload|60|extra|the same with layer offloading: the host-to-device cost per step"
  "text_cuda|60|extra|every text encoder at full size in bf16: the encode peak beside text/memory.h's prediction"
  "memory_snapshot|30|extra|oom_gc_off's allocator history (LibTorch's recorder) read back by torch/cuda/_memory_viz.py"
  "wan_frames|120|extra|Wan 2.1 14B LoRA (qfloat8, low_vram, GC on) on 41-frame clips at 632 under 24 GiB: runs out (exit 3), first fix num_frames 21"
  "wan_frames_fixed|120|extra|its twin at 21 frames: trains (exit 0); the load's and the steps' measured peaks beside the estimate"
  "klein_edit|90|extra|FLUX.2 klein 4B LoRA (qfloat8, low_vram) at 1024^2 with a 1024^2 reference image, GC off, under 24 GiB: runs out (exit 3)"
  "klein_edit_fixed|90|extra|its twin with GC on: trains (exit 0); the load's and the steps' measured peaks beside the estimate"
)
field() { echo "$1" | cut -d'|' -f"$2"; }

print_plan() {
  local core=0 name limit tier what
  printf '%-16s %6s  %-5s  %s\n' stage limit tier "what"
  for row in "${PLAN[@]}"; do
    name=$(field "$row" 1) limit=$(field "$row" 2) tier=$(field "$row" 3) what=$(field "$row" 4)
    printf '%-16s %5ss  %-5s  %s\n' "$name" "$limit" "$tier" "$what"
    [ "$tier" = core ] && core=$((core + limit))
  done
  echo "core stages: ${core} s of the ${BUDGET} s budget (start-up included); extra stages run only while the"
  echo "time left holds their whole limit, so the call ends within ${BUDGET} s either way"
  [ "$core" -le "$BUDGET" ] || { echo "check: the core stages (${core} s) exceed the budget (${BUDGET} s)"; return 1; }
}
if [ "${1:-}" = "--plan" ]; then print_plan; exit $?; fi

START=$SECONDS
OUT="${OUT:-$ROOT/gpu-out}"
WORK="${GCLAB_GPU_WORK:-/tmp/gclab-gpu-check}"
rm -rf "$WORK" && mkdir -p "$WORK" "$OUT"
summary="$OUT/summary.md"
logs="$OUT/logs.txt"
: > "$summary"
: > "$logs"
: > "$OUT/metrics.jsonl"
say() { echo "$*" | tee -a "$summary"; }
gpu() { [ "$REHEARSAL" != 1 ]; }

say "# gclab GPU check, $(date -u +%FT%TZ)$(gpu || echo ' — rehearsal on the CPU (each stage its CPU twin)')"
say ""

# ---- the environment (cheap, in this shell): the binaries, torch's libraries ---------------------------------
PY=python3
gpu || PY="$ROOT/.venv/bin/python"
if [ -n "${GCLAB_GPU_BIN:-}" ]; then BIN=$(cd "$GCLAB_GPU_BIN" && pwd); else BIN="$WORK/bundle/bin"; fi
# torch's libraries (and the CUDA runtime wheels beside them) from the machine's python: the bundle was built
# against the same torch and carries none of it.
TORCH_LIB=$("$PY" -c "import os, torch; print(os.path.join(os.path.dirname(torch.__file__), 'lib'))" 2>/dev/null) ||
  { say "check: $PY cannot import torch"; exit 2; }
CUDA_WHEELS=$(ls -d "$TORCH_LIB"/../../nvidia/*/lib 2>/dev/null | tr '\n' ':')
export LD_LIBRARY_PATH="$WORK/bundle/lib:$TORCH_LIB:${CUDA_WHEELS}${LD_LIBRARY_PATH:-}"

# ---- stages ------------------------------------------------------------------------------------------------
stage_setup() {
  if [ -z "${GCLAB_GPU_BIN:-}" ]; then
    local bundle=third_party/gpu/bundle.tar.xz
    [ -f "$bundle" ] || { echo "check: $bundle is missing: run scripts/gpu/prepare.sh here first"; return 2; }
    # Python's tarfile (lzma is in its standard library): the GPU machine need not have xz.
    mkdir -p "$WORK/bundle" && "$PY" -c 'import sys, tarfile
with tarfile.open(sys.argv[1]) as t:
    t.extractall(sys.argv[2], **({"filter": "tar"} if hasattr(tarfile, "tar_filter") else {}))' \
      "$bundle" "$WORK/bundle" || return 2
    cat "$WORK/bundle/MANIFEST.txt"
  fi
  local manifest=()
  [ -f "$WORK/bundle/MANIFEST.txt" ] && manifest=(--manifest "$WORK/bundle/MANIFEST.txt")
  "$PY" "$ROOT/scripts/gpu/preflight.py" --bin "$BIN" --torch-lib "$TORCH_LIB" --bundle-lib "$WORK/bundle/lib" \
    $(gpu && echo --gpu) "${manifest[@]}" || return 2
  if gpu; then
    "$BIN/gclab" synth --out output/oom/data_1024 --count 8 --sizes 1024x1024,1216x832 > /dev/null || return 1
  else
    "$BIN/gclab" synth --out output/oom/data --count 8 --sizes 512x512,640x512,512x640 > /dev/null || return 1
  fi
}

RATE_TFLOPS=0
stage_matmul() {
  local n=8192 dtype=bfloat16 device=cuda
  gpu || n=1024 dtype=float32 device=cpu
  "$PY" - "$n" "$dtype" "$device" <<'PY'
import sys, time, torch
n, dtype, device = int(sys.argv[1]), getattr(torch, sys.argv[2]), sys.argv[3]
a, b = (torch.randn(n, n, device=device, dtype=dtype) for _ in range(2))
sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
for _ in range(3): a @ b
sync(); t0 = time.perf_counter()
for _ in range(10): a @ b
sync(); dt = (time.perf_counter() - t0) / 10
print(f"matmul {n}^3 {sys.argv[2]} on {device}: {dt * 1e3:.2f} ms, rate_tflops {2 * n**3 / dt / 1e12:.1f}")
PY
}

stage_cuda_tests() {
  local list="$WORK/cuda_tests.txt" exe
  : > "$list"
  for exe in test_ckpt test_train; do
    "$BIN/$exe" --gtest_list_tests --gtest_filter='*Cuda*' |
      awk -v exe="$BIN/$exe" '/^[^ ]/ {suite=$1} /^  / {print exe " " suite $1}' >> "$list"
  done
  echo "$(wc -l < "$list") CUDA tests, each in a process of its own"
  # A test in a process of its own: "the cap is the first CUDA call" holds; 4 at a time on the one GPU.
  xargs -P 4 -L 1 bash -c 'out=$("$0" --gtest_filter="$1" 2>&1); rc=$?
    if echo "$out" | grep -q "\[  SKIPPED \]"; then v=SKIPPED; elif [ $rc = 0 ]; then v=PASSED; else v=FAILED; fi
    echo "$v $1"; [ $v = FAILED ] && echo "$out" | tail -25; [ $rc = 0 ]' < "$list"
}

cfg() {  # the stage's config: the GPU-scale one, or its CPU twin in a rehearsal
  if gpu; then echo "$1"; else echo "$2"; fi
}
OOM_OFF=$(cfg configs/oom/gpu_flux_gc_off_24gb.yaml configs/oom/cpu_gc_off.yaml)
OOM_ON=$(cfg configs/oom/gpu_flux_gc_on_24gb.yaml configs/oom/cpu_gc_off_fixed.yaml)
OOM_STEPS=$(cfg 3 4)
stage_estimate() { "$BIN/gclab" estimate "$OOM_OFF" --json > "$WORK/estimate.json" && cat "$WORK/estimate.json"; }
stage_oom_gc_off() {  # with the allocator's history (CUDA: LibTorch's recorder), read in stage memory_snapshot
  "$BIN/gclab" train "$OOM_OFF" --from-scratch --set train.steps="$OOM_STEPS" --memory-snapshot "$WORK/oom_gc_off.pickle"
}
stage_memory_snapshot() { "$PY" "$ROOT/tests/reference/memory_snapshot_check.py" "$WORK/oom_gc_off.pickle"; }
stage_oom_gc_on() { "$BIN/gclab" train "$OOM_ON" --from-scratch --set train.steps="$OOM_STEPS"; }
stage_bench() {  # auto decided under the card's 24 GiB, timed beside off and full, the three taking turns
  "$BIN/gclab" bench "$OOM_ON" --gc off,full,auto --caps "$(cfg 24GiB 100MiB)" --resolution "$(cfg 512,1024 256,512)" \
    --steps 2 --peak-tflops "$RATE_TFLOPS" --set name=gpu_check_bench
}
stage_preview_decode() {
  "$BIN/gclab" train "$(cfg configs/oom/gpu_flux_preview_decode.yaml configs/oom/cpu_preview_decode.yaml)" --from-scratch \
    $(gpu && echo --set datasets.0.folder_path=output/oom/data_1024)
}
stage_preview_tiled() {
  "$BIN/gclab" train "$(cfg configs/oom/gpu_flux_preview_decode_fixed.yaml configs/oom/cpu_preview_decode_fixed.yaml)" --from-scratch \
    $(gpu && echo --set datasets.0.folder_path=output/oom/data_1024)
}
stage_fit() {
  "$BIN/gclab" fit "$OOM_ON" --vram-cap "$(cfg 24GiB 100MiB)" --gc off,full --resolution "$(cfg 1024 512)" \
    --max-batch "$(cfg 8 4)"
}
stage_auto() {
  "$BIN/gclab" train "$OOM_OFF" --from-scratch --set train.steps="$OOM_STEPS" --set train.checkpoint_policy=auto \
    --set name=gpu_check_auto
}
stage_uint4() {
  "$BIN/gclab" bench "$OOM_ON" --gc full --resolution "$(cfg 1024 512)" --steps 2 --peak-tflops "$RATE_TFLOPS" \
    --set model.quantize=true --set model.qtype=uint4 --set name=gpu_check_uint4
}
stage_offload() {
  "$BIN/gclab" bench "$(cfg "$OOM_ON" configs/oom/cpu_offload_fixed.yaml)" --gc full --resolution "$(cfg 1024 256)" \
    --steps 2 --peak-tflops "$RATE_TFLOPS" --set model.layer_offloading=true --set name=gpu_check_offload
}
stage_text_cuda() { "$BIN/text_cpu" "$(cfg --cuda --tiny)"; }
# The frames pair (issue 48): clips as folders of frames (the bundle carries no FFmpeg: docs/build.md).
WAN_FRAMES=$(cfg configs/oom/gpu_wan21_14b_frames_24gb.yaml configs/oom/cpu_frames.yaml)
WAN_FRAMES_FIXED=$(cfg configs/oom/gpu_wan21_14b_frames_24gb_fixed.yaml configs/oom/cpu_frames_fixed.yaml)
wan_clips() {
  local out
  out=$(cfg output/oom/clips_632 output/oom/clips)
  [ -d "$out" ] || "$BIN/gclab" synth --out "$out" --count 2 --frames "$(cfg 41 33)" --sizes "$(cfg 632x632 256x256)" > /dev/null
}
stage_wan_frames() { wan_clips && "$BIN/gclab" train "$WAN_FRAMES" --from-scratch --set train.steps=2; }
stage_wan_frames_fixed() { wan_clips && "$BIN/gclab" train "$WAN_FRAMES_FIXED" --from-scratch --set train.steps=2; }

# The FLUX.2 klein pair (issue 49): images and control images of one size.
KLEIN_EDIT=$(cfg configs/oom/gpu_flux2_klein_4b_edit_24gb.yaml configs/oom/cpu_edit_klein.yaml)
KLEIN_EDIT_FIXED=$(cfg configs/oom/gpu_flux2_klein_4b_edit_24gb_fixed.yaml configs/oom/cpu_edit_klein_fixed.yaml)
klein_data() {
  local size
  size=$(cfg 1024x1024 384x384)
  [ -d output/oom/edit_data ] || "$BIN/gclab" synth --out output/oom/edit_data --count 6 --sizes "$size" > /dev/null
  [ -d output/oom/edit_controls ] ||
    "$BIN/gclab" synth --out output/oom/edit_controls --count 6 --sizes "$(cfg 1024x1024 512x512)" --seed 9 > /dev/null
}
stage_klein_edit() { klein_data && "$BIN/gclab" train "$KLEIN_EDIT" --from-scratch --set train.steps=2; }
stage_klein_edit_fixed() { klein_data && "$BIN/gclab" train "$KLEIN_EDIT_FIXED" --from-scratch --set train.steps=2; }

# The exit code each stage should end with (the OOM halves run out on purpose).
expected_rc() { case "$1" in oom_gc_off | preview_decode | wan_frames | klein_edit) echo 3 ;; *) echo 0 ;; esac; }
# The run folder a training stage writes (its config's training_folder/name), for the summary.
run_dir() {
  case "$1" in
    oom_gc_off) echo "output/oom/$(sed -n 's/^name: //p' "$OOM_OFF")" ;;
    oom_gc_on) echo "output/oom/$(sed -n 's/^name: //p' "$OOM_ON")" ;;
    preview_decode) echo "output/oom/$(gpu && echo flux_preview_decode || echo preview_decode)" ;;
    preview_tiled) echo "output/oom/$(gpu && echo flux_preview_decode_fixed || echo preview_decode_fixed)" ;;
    bench | uint4 | offload | auto) echo "output/oom/gpu_check_$1" ;;
    wan_frames) echo "output/oom/$(sed -n 's/^name: //p' "$WAN_FRAMES")" ;;
    wan_frames_fixed) echo "output/oom/$(sed -n 's/^name: //p' "$WAN_FRAMES_FIXED")" ;;
    klein_edit) echo "output/oom/$(sed -n 's/^name: //p' "$KLEIN_EDIT")" ;;
    klein_edit_fixed) echo "output/oom/$(sed -n 's/^name: //p' "$KLEIN_EDIT_FIXED")" ;;
  esac
}

# ---- the run -----------------------------------------------------------------------------------------------
failed=0
for row in "${PLAN[@]}"; do
  name=$(field "$row" 1) limit=$(field "$row" 2) tier=$(field "$row" 3)
  left=$((START + BUDGET - SECONDS))
  if [ "$tier" = extra ] && [ "$left" -lt "$limit" ]; then
    say "- $name: skipped — ${left} s of the budget left, the stage needs up to ${limit} s"
    continue
  fi
  [ "$left" -lt "$limit" ] && limit=$left
  if [ "$limit" -lt 5 ]; then
    say "- $name: skipped — the budget is spent"
    continue
  fi
  rm -rf "$(run_dir "$name")" 2>/dev/null
  printf '\n===== %s (limit %s s, %s s into the check) =====\n' "$name" "$limit" "$((SECONDS - START))" >> "$logs"
  t0=$SECONDS
  # The stage's output goes to logs.txt as it is written (a kill keeps it) and to its own file here.
  export -f $(declare -F | awk '{print $3}' | grep -E '^(stage_.*|gpu|cfg|wan_clips|klein_data)$')
  export REHEARSAL ROOT BIN PY WORK TORCH_LIB OOM_OFF OOM_ON OOM_STEPS RATE_TFLOPS WAN_FRAMES WAN_FRAMES_FIXED \
    KLEIN_EDIT KLEIN_EDIT_FIXED
  timeout -k 10 "$limit" bash -c "stage_$name" 2>&1 | tee "$WORK/$name.log" >> "$logs"
  rc=${PIPESTATUS[0]}
  if [ "$name" = matmul ] && [ "$rc" = 0 ]; then
    RATE_TFLOPS=$(sed -n 's/.*rate_tflops \([0-9.]*\).*/\1/p' "$WORK/matmul.log")
  fi
  want=$(expected_rc "$name")
  verdict="exit $rc"
  [ "$rc" = "$want" ] && verdict="$verdict (as expected)" || verdict="$verdict (expected $want)"
  [ "$rc" = 124 ] && verdict="stopped at its limit"
  [ "$rc" = "$want" ] || failed=1
  detail=$("$PY" "$ROOT/scripts/gpu/summarize.py" --stage "$name" --log "$WORK/$name.log" --out "$OUT" \
    --run-dir "$(run_dir "$name")" --estimate "$([ "$name" = estimate ] || [ "${name#oom_}" != "$name" ] &&
      echo "$WORK/estimate.json")" 2>&1)
  say "- $name: $verdict in $((SECONDS - t0)) s (limit $limit s)${detail:+ — $detail}"
  if [ "$name" = setup ] && [ "$rc" != 0 ]; then
    tail -20 "$WORK/setup.log" | sed 's/^/    /' | tee -a "$summary"
    say "check: preflight failed; nothing else can run"
    exit 2
  fi
done

say ""
say "total: $((SECONDS - START)) s of the ${BUDGET} s budget"
if [ "$REHEARSAL" = 1 ]; then
  # What the device call would carry: the working tree's tracked and untracked-not-ignored files, and the
  # carried bundle (docs/gpu.md).
  tree_bytes=$(git ls-files -co --exclude-standard -z | xargs -0 du -cb 2>/dev/null | tail -1 | cut -f1)
  bundle_bytes=$(du -cb third_party/gpu 2>/dev/null | tail -1 | cut -f1)
  travel=$(( (tree_bytes + bundle_bytes) / 1048576 ))
  say "travels: $((tree_bytes / 1024)) KiB of tree + $((bundle_bytes / 1024)) KiB carried = ${travel} MiB (limit ${MAX_TRAVEL_MIB} MiB)"
  [ "$travel" -le "$MAX_TRAVEL_MIB" ] || { say "check: what travels is over ${MAX_TRAVEL_MIB} MiB"; failed=1; }
fi
files=$(find "$OUT" -type f | wc -l)
say "\$OUT holds $files files (at most $MAX_OUT_FILES come back): $(cd "$OUT" && ls | tr '\n' ' ')"
[ "$files" -le "$MAX_OUT_FILES" ] || { say "check: \$OUT holds more than $MAX_OUT_FILES files"; failed=1; }
exit $failed
