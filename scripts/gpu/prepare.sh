#!/usr/bin/env bash
# Run HERE (the development machine) before a GPU check: the GPU machine has CUDA, CMake, ninja and a
# python3 with torch 2.11.0, but no network and none of gclab's Debian libraries. This downloads them
# (.deb files for this Debian release, listed with their versions in third_party/MANIFEST.md) and unpacks
# them under third_party/root, which the device call carries. pkg-config files are rewritten to point there.
set -euo pipefail
cd "$(dirname "$0")/../.."
PACKAGES=(libyaml-cpp-dev libyaml-cpp0.7 libspdlog-dev libspdlog1.10 libfmt-dev libfmt9 libgtest-dev
          libcli11-dev nlohmann-json3-dev libstb-dev libstb0 libwebp-dev libwebp7 libwebpdemux2 libwebpmux3
          libsentencepiece-dev libsentencepiece0 libicu-dev libicu72 pkgconf pkgconf-bin libpkgconf3)
ROOT=third_party/root
mkdir -p third_party/debs
(cd third_party/debs && apt-get download "${PACKAGES[@]}" >/dev/null)
rm -rf "$ROOT"
for f in third_party/debs/*.deb; do dpkg -x "$f" "$ROOT"; done
# The .pc files say prefix=/usr (ICU's: prefix = /usr); on the GPU machine the files are under the carried root.
find "$ROOT/usr/lib" -name '*.pc' -exec sed -i -E 's|^prefix ?= ?/usr$|prefix=${pcfiledir}/../../..|' {} +
find "$ROOT/usr/share" -name '*.pc' -exec sed -i -E 's|^prefix ?= ?/usr$|prefix=${pcfiledir}/../..|' {} +
# The tests read the project's shared folder (AI Toolkit's configs, golden outputs); the GPU machine has
# only the working tree.
rm -rf third_party/shared && mkdir -p third_party/shared
cp -r ../shared/aitk-configs ../shared/golden third_party/shared/
du -sh "$ROOT" third_party/shared | sed 's/^/prepare: /'
echo "prepare: now run the device check with carry [\"third_party/root\", \"third_party/shared\"] and command 'bash scripts/gpu/check.sh'"
