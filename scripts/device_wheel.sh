#!/usr/bin/env bash
# Builds, on this (CPU) machine, what scripts/device_run.sh installs on the GPU machine: the hfnn
# wheel (py3-none: one wheel for every Python, built against this machine's torch, which must be
# the GPU machine's version) and the C++ test binary, into .devbuild/ (git-ignored; carry it).
# The test binary is stripped and gzipped (16 MB): with the wheel (33 MB) and .deps (9 MB) it fits
# the device tool's 64 MiB carry; device_run.sh unpacks it.
#   --lstm-phases  also a test binary whose persistent LSTM kernels time their phases
#                  (CMake option HFNN_LSTM_PHASES, a diagnostic: device_run.sh stage lstm-phases);
#                  the build directory is set back after it. Carry .devbuild alone then (66 MB
#                  with .deps is over the limit; .deps is only needed where the wheel does not load).
set -euo pipefail
cd "$(dirname "$0")/.."
phases=0
for arg in "$@"; do
  case "$arg" in
    --lstm-phases) phases=1 ;;
    *) echo "scripts/device_wheel.sh: unknown option $arg (--lstm-phases is the only one)" >&2; exit 2 ;;
  esac
done
rm -rf .devbuild && mkdir -p .devbuild
python3 -m pip wheel -q --no-build-isolation --no-deps --config-settings=cmake.define.HFNN_LSTM_PHASES=OFF -w .devbuild .
build=$(ls -d build/py3-none-* | head -n 1)
strip -o .devbuild/hfnn_kernel_tests "$build/hfnn_kernel_tests" && gzip -f .devbuild/hfnn_kernel_tests
if [ "$phases" = 1 ]; then
  restore() { cmake -DHFNN_LSTM_PHASES=OFF "$build" >/dev/null && cmake --build "$build" --target hfnn_kernel_tests >/dev/null; }
  trap restore EXIT
  cmake -DHFNN_LSTM_PHASES=ON "$build" >/dev/null
  cmake --build "$build" --target hfnn_kernel_tests >/dev/null
  strip -o .devbuild/hfnn_kernel_tests_phases "$build/hfnn_kernel_tests" && gzip -f .devbuild/hfnn_kernel_tests_phases
fi
echo "built $(ls .devbuild | tr '\n' ' ')against torch $(python3 -c 'import torch; print(torch.__version__)')"
