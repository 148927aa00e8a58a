#!/usr/bin/env bash
# Data-parallel training without Python: starts N processes of `gclab train` on this machine, one per GPU (or N
# CPU processes), with the environment torchrun gives them — RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR,
# MASTER_PORT — so that they join one c10d process group (NCCL on CUDA, Gloo on the CPU).
#
#   scripts/launch.sh N CONFIG [gclab train options...]
#
# Several machines: run it on each with NNODES (how many), NODE_RANK (this one's, 0 first) and MASTER_ADDR (node
# 0's address) set; MASTER_PORT (default 29500) must be free there. GCLAB names the executable (default
# build/bin/gclab).
#
# Ctrl-C reaches every rank: they agree on a step, rank 0 saves, all stop. When a rank fails, the others stop
# with an error naming it (their collectives fail as its connections close); any still running after
# GCLAB_LAUNCH_GRACE seconds (default 60) are killed. The exit status is the first failing rank's, else 0.
set -u
if ((BASH_VERSINFO[0] < 5 || (BASH_VERSINFO[0] == 5 && BASH_VERSINFO[1] < 1))); then
  echo "launch.sh needs bash 5.1 or later (wait -n -p); this is $BASH_VERSION. torchrun --no-python does the same" >&2
  exit 2
fi

if [ $# -lt 2 ] || ! [[ "$1" =~ ^[1-9][0-9]*$ ]]; then
  echo "usage: scripts/launch.sh N CONFIG [gclab train options...]   (N processes on this machine)" >&2
  exit 2
fi
per_node=$1
config=$2
shift 2
gclab=${GCLAB:-"$(cd "$(dirname "$0")/.." && pwd)/build/bin/gclab"}
if [ ! -x "$gclab" ]; then
  echo "launch.sh: no gclab at $gclab (build it: scripts/build.sh, or set GCLAB)" >&2
  exit 2
fi
nodes=${NNODES:-1}
node=${NODE_RANK:-0}
grace=${GCLAB_LAUNCH_GRACE:-60}
export MASTER_ADDR=${MASTER_ADDR:-127.0.0.1}
export MASTER_PORT=${MASTER_PORT:-29500}
export WORLD_SIZE=$((per_node * nodes))
export LOCAL_WORLD_SIZE=$per_node

pids=()
for ((i = 0; i < per_node; i++)); do
  RANK=$((node * per_node + i)) LOCAL_RANK=$i "$gclab" train "$config" "$@" &
  pids+=($!)
done
trap 'kill -INT "${pids[@]}" 2>/dev/null' INT TERM

status=0
killer=
running=("${pids[@]}")
while [ ${#running[@]} -gt 0 ]; do
  finished=
  wait -n -p finished "${running[@]}"
  code=$?
  if [ -z "$finished" ]; then  # a signal (forwarded by the trap), not a rank that ended
    [ "$code" -gt 128 ] && continue
    echo "launch.sh: wait failed ($code)" >&2
    exit 1
  fi
  still=()
  for p in "${running[@]}"; do [ "$p" != "$finished" ] && still+=("$p"); done
  running=("${still[@]}")
  if [ "$code" -ne 0 ] && [ "$status" -eq 0 ]; then
    status=$code
    echo "launch.sh: a rank exited with status $code; the others stop on their own or in ${grace} s" >&2
    (sleep "$grace" && kill -KILL "${pids[@]}" 2>/dev/null) &
    killer=$!
  fi
done
[ -n "$killer" ] && kill "$killer" 2>/dev/null
exit "$status"
