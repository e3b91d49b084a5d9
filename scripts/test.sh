#!/usr/bin/env bash
# Runs every test: the C++ tests of the build that `pip install .` made (ctest), then the Python
# tests (pytest). GPU tests skip with a printed reason on a machine without a CUDA device.
set -euo pipefail
cd "$(dirname "$0")/.."
build=$(ls -d build/py3-none-* 2>/dev/null | head -n 1 || true)
if [ -z "$build" ] || [ ! -x "$build/hfnn_kernel_tests" ]; then
  echo "hfnn tests: no build under build/py3-none-*: run scripts/setup.sh first" >&2
  exit 1
fi
# The gtest binary directly, so a skipped GPU test prints its reason.
"$build/hfnn_kernel_tests" --gtest_color=no
python3 -m pytest tests/python "$@"
