#!/usr/bin/env bash
# Configures and builds gclab into build/ (Release, ccache when present). Extra args go to cmake's configure
# step; the build re-configures whenever they (or GCLAB_BUILD_TYPE) differ from the last configure.
set -euo pipefail
cd "$(dirname "$0")/.."
args=(-DCMAKE_BUILD_TYPE="${GCLAB_BUILD_TYPE:-Release}" "$@")
stamp=build/.gclab-configure-args
wanted="$(printf '%q ' "${args[@]}")"
if [ ! -f build/CMakeCache.txt ] || [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$wanted" ]; then
  echo "build: configuring (${wanted% })"
  cmake -S . -B build -G Ninja "${args[@]}"
  echo "$wanted" > "$stamp"
fi
cmake --build build -j "$(nproc)"
