#!/usr/bin/env bash
# Sets up, builds and trains: scripts/run.sh [CONFIG] [gclab train options...]
# With the quickstart config, the synthetic data folder is drawn first when it is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
config="${1:-configs/quickstart.yaml}"
shift || true
scripts/setup.sh
echo "run: building gclab (the first build takes a few minutes on 2 cores; later ones seconds)"
scripts/build.sh
if [ "$config" = "configs/quickstart.yaml" ] && [ ! -d output/quickstart/data ]; then
  build/bin/gclab synth --out output/quickstart/data --count 24 --sizes 256x256,320x256,256x320
fi
exec build/bin/gclab train "$config" "$@"
