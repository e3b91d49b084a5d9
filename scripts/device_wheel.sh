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
# The build directory pip just used: the newest one (a stale one of another Python may sit beside it).
build=$(ls -dt build/py3-none-* 2>/dev/null | head -n 1)
if [ -z "$build" ] || [ ! -x "$build/hfnn_kernel_tests" ]; then
  echo "scripts/device_wheel.sh: no test binary under build/py3-none-*: the build made none (GoogleTest missing? run scripts/setup.sh)" >&2
  exit 1
fi
strip -o .devbuild/hfnn_kernel_tests "$build/hfnn_kernel_tests" && gzip -f .devbuild/hfnn_kernel_tests
if [ "$phases" = 1 ]; then
  log=.devbuild/phases-build.log
  # CMake and Ninja print compiler errors on stdout: into the log, its tail shown on a failure.
  quiet() { "$@" >>"$log" 2>&1 || { tail -30 "$log" >&2; return 1; }; }
  restore() {
    quiet cmake -DHFNN_LSTM_PHASES=OFF "$build" && quiet cmake --build "$build" --target hfnn_kernel_tests ||
      echo "scripts/device_wheel.sh: could not set $build back to HFNN_LSTM_PHASES=OFF (see $log)" >&2
  }
  trap restore EXIT
  quiet cmake -DHFNN_LSTM_PHASES=ON "$build"
  quiet cmake --build "$build" --target hfnn_kernel_tests
  strip -o .devbuild/hfnn_kernel_tests_phases "$build/hfnn_kernel_tests" && gzip -f .devbuild/hfnn_kernel_tests_phases
fi
echo "built $(ls .devbuild | tr '\n' ' ')against torch $(python3 -c 'import torch; print(torch.__version__)')"
