#!/usr/bin/env bash
# Prepares .deps/: the Debian -dev packages the build needs, unpacked, for a GPU machine that has
# the CUDA Toolkit, torch, cmake and scikit-build-core but no network. Run here (with network),
# then carry .deps with the device run: scripts/device_run.sh points CMake at it.
set -euo pipefail
cd "$(dirname "$0")/.."
pkgs=(libcli11-dev libfmt-dev libfmt9 nlohmann-json3-dev libgtest-dev libsqlite3-dev)
rm -rf .deps && mkdir -p .deps/debs
apt-get update -qq
(cd .deps/debs && apt-get download "${pkgs[@]}" >/dev/null)
for deb in .deps/debs/*.deb; do dpkg -x "$deb" .deps/root; done
rm -rf .deps/debs
echo "prepared .deps ($(du -sh .deps | cut -f1)): ${pkgs[*]}"
