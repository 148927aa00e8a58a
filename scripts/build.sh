#!/usr/bin/env bash
# Configures (once) and builds gclab into build/ (Release, ccache when present). Extra args go to cmake.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -f build/CMakeCache.txt ]; then
  cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE="${GCLAB_BUILD_TYPE:-Release}" "$@"
fi
cmake --build build -j "$(nproc)"
