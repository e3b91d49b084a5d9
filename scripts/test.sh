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
# The Python tests run on up to 4 cores (pytest-xdist, which scripts/setup.sh installs): most of
# them run a script or the hfnn executable in a subprocess and wait for it. HFNN_TEST_WORKERS=0 (or
# no pytest-xdist) runs them one at a time.
workers=${HFNN_TEST_WORKERS:-$(( $(nproc) < 4 ? $(nproc) : 4 ))}
if [ "$workers" -gt 1 ] && python3 -c "import xdist" >/dev/null 2>&1; then
  python3 -m pytest tests/python -n "$workers" "$@"
else
  python3 -m pytest tests/python "$@"
fi
