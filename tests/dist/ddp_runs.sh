#!/usr/bin/env bash
# Issue 51: data-parallel `gclab train` over c10d (Gloo on loopback), as a user runs it — scripts/launch.sh or
# torchrun's environment by hand:
#   - two ranks with batch b train the weights one process trains with batch 2b (fp32 rounding), with caption
#     dropout, two buckets, a save and a resume on the way, and with gradient accumulation;
#   - checkpointing on and off give the same weights under data parallelism too;
#   - ZeRO-1 (--shard optimizer) too, each rank holding half the optimizer's state, saved whole and resumed;
#   - a rank killed (SIGKILL) makes the other stop at once with an error naming it, its last good step saved;
#   - a rank out of memory writes its own report (naming the rank) and the other's error says what it said;
#   - a rank that hangs (SIGSTOP) makes the other stop after --dist-timeout instead of waiting for ever.
# usage: ddp_runs.sh GCLAB PYTHON WORKDIR PORT_BASE   (ports PORT_BASE .. PORT_BASE + 9; torchrun beside PYTHON)
set -eu
gclab=$1 python=$2 work=$3/ddp_runs port=$4
launch="$(cd "$(dirname "$0")/../.." && pwd)/scripts/launch.sh"
rm -rf "$work" && mkdir -p "$work" && cd "$work"
export OMP_NUM_THREADS=1
fail() { echo "FAIL: $*" >&2; exit 1; }

"$gclab" synth --out data --count 6 --sizes 64x64,96x64 >/dev/null 2>&1
cat > cfg.yaml <<YAML
name: run
training_folder: $work/out
device: cpu
datasets:
  - folder_path: $work/data
    resolution: [64]
    caption_dropout_rate: 0.3
train: {batch_size: 1, steps: 6, lr: 1e-3}
save: {save_every: 3, dtype: float32}
model: {arch: tiny-flux, vae: dct}
network: {type: lora, linear: 4}
sample: {sample_every: 3, width: 64, height: 64, sample_steps: 2, prompts: [a red square]}
YAML

# Max relative difference between two runs' final LoRAs (fails unless they hold the same tensors).
same_weights() {
  "$python" - "$1" "$2" <<'PY'
import sys
from safetensors.torch import load_file
a, b = load_file(sys.argv[1]), load_file(sys.argv[2])
assert a.keys() == b.keys(), "different tensors"
scale = max(v.abs().max().item() for v in b.values())
diff = max((a[k] - b[k]).abs().max().item() for k in a)
print(f"max |diff| {diff:.3g} of max |w| {scale:.3g}")
sys.exit(0 if diff <= 1e-5 * scale else 1)
PY
}
launch2() { MASTER_PORT=$1 GCLAB="$gclab" "$launch" 2 cfg.yaml "${@:2}"; }

# --- Two ranks of batch 1 = one process of batch 2: 3 steps, a save, stopped; resumed to 6. ---------------
"$gclab" train cfg.yaml --set name=one --set train.batch_size=2 >one.log 2>&1 || fail "one process: $(tail -3 one.log)"
launch2 $port --set name=ddp --set train.steps=3 >ddp.log 2>&1 || fail "two ranks: $(tail -3 ddp.log)"
launch2 $((port + 1)) --set name=ddp >ddp2.log 2>&1 || fail "two ranks resumed: $(tail -3 ddp2.log)"
grep -q "rank 1 of 2.*resum" ddp2.log || fail "rank 1 did not resume: $(grep 'rank 1' ddp2.log | head -3)"
same_weights out/ddp/ddp.safetensors out/one/one.safetensors || fail "two ranks' weights are not one process's"
[ -f out/ddp/rank1/memory.json ] && [ -f out/ddp/rank1/memory_steps.jsonl ] && [ ! -e out/ddp/rank1/metrics.jsonl ] ||
  fail "rank 1's memory (and no metrics of its own)"
[ ! -e out/ddp/rank1/run.safetensors ] && ! ls out/ddp/rank1/*.safetensors >/dev/null 2>&1 || fail "rank 1 saved"
# Rank 0 alone previews (AI Toolkit's sample() returns unless is_main_process): one file per preview step.
[ "$(ls out/ddp/samples | wc -l)" -eq "$(ls out/one/samples | wc -l)" ] && [ "$(ls out/ddp/samples | wc -l)" -ge 2 ] ||
  fail "previews: $(ls out/ddp/samples | tr '\n' ' ') against one process's $(ls out/one/samples | tr '\n' ' ')"
! grep -q "rank 1 of 2.*sample(s) in" ddp.log ddp2.log || fail "rank 1 wrote previews"
grep -q '"world_size": 2' out/ddp/memory.json || fail "memory.json does not say the world size"
# Rank 1's memory as predicted (the reducer's buckets included) and measured; its buckets averaged in the backward.
"$python" - out/ddp/rank1/memory.json out/ddp/rank1/memory_steps.jsonl <<'PY' || fail "rank 1's memory or metrics"
import json, sys
m = json.load(open(sys.argv[1]))
measured, predicted = m["phase_peak_bytes"]["backward"], m["predicted_phase_peak_bytes"]["backward"]
assert m["rank"] == 1 and m["gradient_bucket_bytes"] > 0, m
assert abs(measured - predicted) <= 0.01 * measured, (measured, predicted)
steps = [json.loads(l) for l in open(sys.argv[2])]
assert all(s["dist"]["buckets_started_in_backward"] >= 1 for s in steps), [s["dist"] for s in steps]
print(f"rank 1: backward {measured} B measured, {predicted} predicted; buckets {m['gradient_bucket_bytes']} B")
PY

# --- torchrun itself (the venv's), starting the executable: the same weights. ----------------------------
"$(dirname "$python")/torchrun" --no-python --nproc-per-node 2 --master-port $((port + 7)) "$gclab" train cfg.yaml \
  --set name=torchrun >torchrun.log 2>&1 || fail "torchrun: $(tail -3 torchrun.log)"
same_weights out/torchrun/torchrun.safetensors out/one/one.safetensors || fail "torchrun's weights are not one process's"

# --- ZeRO-1 (--shard optimizer): each rank half the optimizer's state, the same weights, over a save (the state
# gathered at rank 0) and a resume (each rank takes its share back).
launch2 $((port + 8)) --set name=zero1 --set train.steps=3 --shard optimizer >zero1.log 2>&1 ||
  fail "ZeRO-1: $(tail -3 zero1.log)"
launch2 $((port + 9)) --set name=zero1 --shard optimizer >zero1b.log 2>&1 || fail "ZeRO-1 resumed: $(tail -3 zero1b.log)"
same_weights out/zero1/zero1.safetensors out/one/one.safetensors || fail "ZeRO-1's weights are not one process's"
"$python" - out/zero1/rank1/memory.json out/ddp/rank1/memory.json out/zero1/zero1_000000003.state.safetensors \
  out/one/one_000000003.state.safetensors <<'PY' || fail "ZeRO-1's memory or its saved state"
import json, sys
from safetensors.torch import load_file
zero1, ddp = (json.load(open(f)) for f in sys.argv[1:3])
assert 0 < zero1["optimizer_bytes"] <= 0.55 * ddp["optimizer_bytes"], (zero1["optimizer_bytes"], ddp["optimizer_bytes"])
measured, predicted = zero1["phase_peak_bytes"]["optimizer"], zero1["predicted_phase_peak_bytes"]["optimizer"]
assert abs(measured - predicted) <= 0.01 * measured, (measured, predicted)
a, b = load_file(sys.argv[3]), load_file(sys.argv[4])  # the whole state, as one process saves it
opt = sorted(k for k in b if k.startswith("optimizer."))
assert opt == sorted(k for k in a if k.startswith("optimizer.")), "the gathered state's tensors differ"
print(f"ZeRO-1: {len(opt)} optimizer tensors saved whole; rank 1 holds {zero1['optimizer_bytes']} B of {ddp['optimizer_bytes']}")
PY

# --- bench and estimate as one rank of a world: labelled with its size, bench's figures a rank's (its buckets). ----
WORLD_SIZE=2 RANK=0 "$gclab" bench cfg.yaml --set name=bench2 --gc off --steps 1 --json >bench2.json 2>bench2.log ||
  fail "bench as rank 0 of 2: $(tail -2 bench2.log)"
"$gclab" estimate cfg.yaml --world-size 2 --shard optimizer --json >est2.json 2>est2.log || fail "estimate: $(tail -2 est2.log)"
"$python" - bench2.json out/bench2/bench.csv est2.json <<'PY' || fail "bench's or estimate's world size"
import csv, json, sys
bench = json.load(open(sys.argv[1]))
assert bench["world_size"] == 2, bench.keys()
rows = list(csv.DictReader(open(sys.argv[2])))
assert rows and all(r["world_size"] == "2" for r in rows), rows
est = json.load(open(sys.argv[3]))["estimate"]
pr = est["per_rank"]
assert est["world_size"] == 2 and pr["shard"] == "optimizer" and pr["resident"] == est["resident"], pr
assert 0 < pr["optimizer_state"] < est["optimizer_state"] or pr["optimizer_state"] == est["optimizer_state"], pr
print(f"bench as rank 0 of 2; estimate per rank under ZeRO-1: {pr['resident']} B resident")
PY
"$gclab" estimate cfg.yaml --shard grads >/dev/null 2>shard.log && fail "--shard without --world-size was accepted"
grep -q "give --world-size" shard.log || fail "--shard without --world-size: $(tail -1 shard.log)"

# --- Gradient accumulation: two micro-batches of 1 on each of two ranks = one process's two of 2. ----------
"$gclab" train cfg.yaml --set name=acc1 --set train.batch_size=2 --set train.gradient_accumulation=2 \
  >acc1.log 2>&1 || fail "one process accumulating: $(tail -3 acc1.log)"
launch2 $((port + 2)) --set name=acc2 --set train.gradient_accumulation=2 >acc2.log 2>&1 ||
  fail "two ranks accumulating: $(tail -3 acc2.log)"
same_weights out/acc2/acc2.safetensors out/acc1/acc1.safetensors || fail "accumulation under two ranks differs"

# --- Checkpointing off under two ranks: the weights of checkpointing on. -----------------------------------
launch2 $((port + 3)) --set name=gc_off --set train.gradient_checkpointing=false >gc.log 2>&1 ||
  fail "two ranks without checkpointing: $(tail -3 gc.log)"
grep -q "checkpoint policy off" gc.log || fail "checkpointing was not off: $(grep 'checkpoint policy' gc.log | head -1)"
same_weights out/gc_off/gc_off.safetensors out/ddp/ddp.safetensors || fail "checkpointing off changes DDP's weights"

# --- A rank killed: the other stops at once, naming what failed, its last good step saved. -----------------
long="--set train.steps=100000 --set save.save_every=5"
for r in 0 1; do
  WORLD_SIZE=2 RANK=$r MASTER_PORT=$((port + 4)) "$gclab" train cfg.yaml --set name=dead $long >dead$r.log 2>&1 &
  eval "pid$r=$!"
done
for _ in $(seq 120); do [ -s out/dead/metrics.jsonl ] && [ "$(wc -l <out/dead/metrics.jsonl)" -ge 7 ] && break; sleep 0.5; done
kill -KILL "$pid1"
start=$(date +%s)
if wait "$pid0"; then fail "rank 0 went on without rank 1"; fi
[ $(($(date +%s) - start)) -le 30 ] || fail "rank 0 took more than 30 s to stop"
grep -q "rank 0 of 2: averaging the gradients failed: another rank is gone" dead0.log ||
  grep -q "rank 0 of 2: .* failed: another rank is gone" dead0.log || fail "rank 0's error: $(tail -2 dead0.log)"
# Rank 0 saved its last good step: the last step its metrics logged (not only the last due save).
last=$("$python" -c "import json,sys; print([json.loads(l) for l in open(sys.argv[1])][-1]['step'])" out/dead/metrics.jsonl)
[ -f "out/dead/dead_$(printf %09d "$last").state.safetensors" ] ||
  fail "rank 0 did not save its last good step $last: $(ls out/dead | tr '\n' ' ')"

# --- A rank out of memory (its own cap): its report names it; the other's error says what it said. --------
WORLD_SIZE=2 RANK=0 MASTER_PORT=$((port + 5)) "$gclab" train cfg.yaml --set name=oom >oom0.log 2>&1 &
p0=$!
set +e
WORLD_SIZE=2 RANK=1 MASTER_PORT=$((port + 5)) "$gclab" train cfg.yaml --set name=oom --vram-cap 9.7MiB >oom1.log 2>&1
rc1=$?
wait $p0
rc0=$?
set -e
[ $rc1 -eq 3 ] || fail "rank 1 out of memory exited $rc1: $(tail -2 oom1.log)"
[ $rc0 -ne 0 ] || fail "rank 0 went on"
grep -q "| rank | rank 1 of 2" out/oom/rank1/oom_report.md || fail "rank 1's report does not name it"
grep -q "it said: rank 1 of 2: out of memory at step" oom0.log || fail "rank 0's error: $(tail -1 oom0.log)"

# --- A rank that hangs: the other stops after --dist-timeout. ----------------------------------------------
for r in 0 1; do
  WORLD_SIZE=2 RANK=$r MASTER_PORT=$((port + 6)) "$gclab" train cfg.yaml --set name=hung $long --dist-timeout 5 \
    >hung$r.log 2>&1 &
  eval "pid$r=$!"
done
for _ in $(seq 120); do [ -s out/hung/metrics.jsonl ] && break; sleep 0.5; done
kill -STOP "$pid1"
start=$(date +%s)
if wait "$pid0"; then fail "rank 0 went on without rank 1"; fi
elapsed=$(($(date +%s) - start))
kill -KILL "$pid1"
[ $elapsed -le 30 ] || fail "rank 0 took $elapsed s to give up on a hung rank (--dist-timeout 5)"
grep -q "did not answer within the timeout" hung0.log || fail "rank 0's error: $(tail -1 hung0.log)"
echo "ddp_runs: all passed"
