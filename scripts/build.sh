#!/usr/bin/env bash
# Configures and builds gclab into build/ (Release, ccache when present).
#   scripts/build.sh [--target NAME ...] [cmake configure args ...]
# --target builds only those targets (and what they need), e.g. `--target gclab` for the executable alone;
# without it, everything (tests and benchmarks too). Other args go to cmake's configure step; the build
# re-configures whenever they (or GCLAB_BUILD_TYPE) differ from the last configure.
set -euo pipefail
cd "$(dirname "$0")/.."
targets=()
args=(-DCMAKE_BUILD_TYPE="${GCLAB_BUILD_TYPE:-Release}")
while [ $# -gt 0 ]; do
  case "$1" in
    --target) targets+=(--target "$2"); shift 2 ;;
    *) args+=("$1"); shift ;;
  esac
done
stamp=build/.gclab-configure-args
wanted="$(printf '%q ' "${args[@]}")"
if [ ! -f build/CMakeCache.txt ] || [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$wanted" ]; then
  echo "build: configuring (${wanted% })"
  cmake -S . -B build -G Ninja "${args[@]}"
  echo "$wanted" > "$stamp"
fi
# Ninja prints one line per step ([n/N] ...) when its output is not a terminal too, so a cold build shows
# where it is.
cmake --build build -j "$(nproc)" "${targets[@]}"
