#!/usr/bin/env bash
# Builds, on this (CPU) machine, what scripts/device_run.sh installs on the GPU machine: the hfnn
# wheel (py3-none: one wheel for every Python, built against this machine's torch, which must be
# the GPU machine's version) and the C++ test binary, into .devbuild/ (git-ignored; carry it).
set -euo pipefail
cd "$(dirname "$0")/.."
rm -rf .devbuild && mkdir -p .devbuild
python3 -m pip wheel -q --no-build-isolation --no-deps -w .devbuild .
cp build/py3-none-*/hfnn_kernel_tests .devbuild/
echo "built $(ls .devbuild) against torch $(python3 -c 'import torch; print(torch.__version__)')"
