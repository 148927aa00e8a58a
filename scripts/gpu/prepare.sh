#!/usr/bin/env bash
# Run HERE (the development machine) before a GPU check: the GPU machine has CUDA, CMake, ninja and a
# python3 with torch 2.11.0, but no network and none of gclab's Debian libraries. This downloads them
# (.deb files for this Debian release) and unpacks them under .deps/root, which the device call carries.
set -euo pipefail
cd "$(dirname "$0")/../.."
PACKAGES=(libyaml-cpp-dev libyaml-cpp0.7 libspdlog-dev libspdlog1.10 libfmt-dev libfmt9 libgtest-dev
          libcli11-dev nlohmann-json3-dev libstb-dev libstb0 libbenchmark-dev libbenchmark1debian)
mkdir -p .deps/debs
(cd .deps/debs && apt-get download "${PACKAGES[@]}" >/dev/null)
rm -rf .deps/root
for f in .deps/debs/*.deb; do dpkg -x "$f" .deps/root; done
du -sh .deps/root | sed 's/^/prepare: .deps\/root is /'
echo "prepare: now run the device check with carry [\".deps\"] and command 'bash scripts/gpu/check.sh'"
