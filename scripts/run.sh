#!/usr/bin/env bash
# Sets up, builds the gclab executable (nothing else: no tests, no benchmarks) and trains:
#   scripts/run.sh [CONFIG] [gclab train options...]
# With the quickstart config, the synthetic data folder is drawn first when it is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
config="${1:-configs/quickstart.yaml}"
shift || true
t0=$SECONDS
scripts/setup.sh
t_setup=$((SECONDS - t0))
echo "run: setup took ${t_setup} s; building the gclab executable (a cold build takes a few minutes on 2 cores,"
echo "run: a warm one seconds; each [n/N] line below is one compiled file)"
scripts/build.sh --target gclab
echo "run: built in $((SECONDS - t0 - t_setup)) s; training with $config"
if [ "$config" = "configs/quickstart.yaml" ] && [ ! -d output/quickstart/shapes ]; then
  build/bin/gclab synth --out output/quickstart/shapes --count 24 --sizes 256x256 --simple
fi
exec build/bin/gclab train "$config" "$@"
