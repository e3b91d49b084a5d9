#!/usr/bin/env bash
# Sets up a fresh machine for hfnn and installs it: the system packages the build and the tests
# need (Debian or Ubuntu, as root; Chromium renders the HTML report in a test), torch (2.11.0
# unless a torch is already installed), the build and test tools, then
# `pip install --no-build-isolation .`, which builds the CUDA kernels when nvcc is on PATH.
set -euo pipefail
cd "$(dirname "$0")/.."

if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
  missing=()
  for pkg in cmake ninja-build g++ libcli11-dev libfmt-dev nlohmann-json3-dev libsqlite3-dev libgtest-dev chromium; do
    dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    echo "hfnn setup: installing ${missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
  fi
elif ! command -v cmake >/dev/null 2>&1; then
  echo "hfnn setup: cmake, CLI11, fmt, nlohmann-json, SQLite and GoogleTest are needed; install them with your package manager" >&2
  exit 1
fi

if ! python3 -c "import torch" >/dev/null 2>&1; then
  echo "hfnn setup: installing torch ${HFNN_TORCH_VERSION:-2.11.0}"
  python3 -m pip install -q "torch==${HFNN_TORCH_VERSION:-2.11.0}"
fi
python3 -m pip install -q "scikit-build-core>=0.10" "pytest>=7" "pytest-xdist>=3" numpy
echo "hfnn setup: building and installing hfnn (CUDA kernels: $(command -v nvcc >/dev/null && echo yes || echo 'no, nvcc not found'))"
python3 -m pip install -q --no-build-isolation .
echo "hfnn setup: done, $(hfnn --version)"
