#!/usr/bin/env bash
# Sets up, builds and runs the main job for a config: scripts/run.sh configs/quickstart.yaml
# Until `gclab train` lands (issue 5), this validates the config and prints it resolved.
set -euo pipefail
cd "$(dirname "$0")/.."
config="${1:-configs/quickstart.yaml}"
shift || true
scripts/setup.sh
scripts/build.sh >/dev/null
exec build/bin/gclab check "$config" "$@"
