#!/usr/bin/env bash
# Builds, on this (CPU) machine, what scripts/device_run.sh installs on the GPU machine: the hfnn
# wheel (py3-none: one wheel for every Python, built against this machine's torch, which must be
# the GPU machine's version) and the C++ test binary, into .devbuild/ (git-ignored; carry it).
# The GPU machines are Hopper (H100, H200): both are built for sm_90a machine code alone (90a-real: no
# PTX), in a build directory of their own (build/device-sm90; the installed package keeps
# 80-virtual;90-virtual;90a-real), which leaves out the PTX that made up most of the op library (with it, a 45 MB
# wheel and a 22 MB gzipped test binary on 2026-11-26, over the 64 MiB carry together). The test
# binary is stripped and gzipped; device_run.sh unpacks it.
#   --lstm-phases  also a test binary whose persistent LSTM kernels time their phases
#                  (CMake option HFNN_LSTM_PHASES, a diagnostic: device_run.sh stage lstm-phases);
#                  the build directory is set back after it. Carry .devbuild alone then (.deps is
#                  only needed where the wheel does not load).
#   --baseline     first the wheel of HEAD without this tree's uncommitted changes to tracked files
#                  (git stash, build, git stash pop; the build directory is shared, so only what the
#                  changes touch is rebuilt, twice), into build/devbuild_base/ (git-ignored), and its
#                  op library alone, gzipped, into .devbuild/base_libhfnn_ops.so.gz. A same-machine
#                  A/B is then one device call (carry .devbuild): device_run.sh's `ab` stage runs the
#                  sweep ($SWEEP_ARGS) with that library swapped into the installed package, results
#                  under $OUT/base, then with this build's, under $OUT/new:
#                    SWEEP_CANDIDATES=variants SWEEP_ARGS="--variants ... --widths ..." bash scripts/device_run.sh ab
#                  then here: python3 bench/layer_norm_sweep.py --compare BASE.json NEW.json
#                  The Python package is this tree's in both runs: right for kernel changes. The test
#                  binary is left out (the 64 MiB carry: wheel, baseline library and tree fit without
#                  it); build again without --baseline for the gtest stages.
set -euo pipefail
cd "${HFNN_WHEEL_REPO:-$(dirname "$0")/..}"
# --baseline stashes this very script with the rest of the changes, and bash reads a script as it
# runs: run a copy instead.
if [[ " $* " == *" --baseline "* && -z "${HFNN_WHEEL_REPO:-}" ]]; then
  copy=$(mktemp /tmp/device_wheel.XXXXXX.sh)
  cp scripts/device_wheel.sh "$copy"
  HFNN_WHEEL_REPO=$(pwd) exec bash "$copy" "$@"
fi
# The copy removes itself: bash keeps reading it through the file it has open.
[[ -n "${HFNN_WHEEL_REPO:-}" && "$0" == /tmp/device_wheel.*.sh ]] && rm -f "$0"
phases=0
baseline=0
for arg in "$@"; do
  case "$arg" in
    --lstm-phases) phases=1 ;;
    --baseline) baseline=1 ;;
    *) echo "scripts/device_wheel.sh: unknown option $arg (--lstm-phases and --baseline are the options)" >&2; exit 2 ;;
  esac
done
build=build/device-sm90
device_settings=(--config-settings=build-dir=$build --config-settings=cmake.define.HFNN_CUDA_ARCHITECTURES=90a-real
  --config-settings=cmake.define.HFNN_LSTM_PHASES=OFF)
if [ "$baseline" = 1 ]; then
  if git diff --quiet HEAD --; then
    echo "scripts/device_wheel.sh: --baseline: no uncommitted changes to tracked files, so no baseline to build (HEAD is the tree)" >&2
    exit 2
  fi
  git stash push --quiet
  # The changes come back whatever happens to the baseline's build.
  trap 'git stash pop --quiet || echo "scripts/device_wheel.sh: git stash pop failed: your changes are in git stash list" >&2' EXIT
  rm -rf build/devbuild_base && mkdir -p build/devbuild_base
  python3 -m pip wheel -q --no-build-isolation --no-deps "${device_settings[@]}" -w build/devbuild_base .
  git stash pop --quiet
  trap - EXIT
  unzip -p build/devbuild_base/hfnn-*.whl hfnn/libhfnn_ops.so | gzip -6 > build/devbuild_base/base_libhfnn_ops.so.gz
  echo "built the baseline (HEAD $(git rev-parse --short HEAD)) into build/devbuild_base/"
fi
rm -rf .devbuild && mkdir -p .devbuild
python3 -m pip wheel -q --no-build-isolation --no-deps "${device_settings[@]}" -w .devbuild .
if [ ! -x "$build/hfnn_kernel_tests" ]; then
  echo "scripts/device_wheel.sh: no test binary in $build: the build made none (GoogleTest missing? run scripts/setup.sh)" >&2
  exit 1
fi
if [ "$baseline" = 1 ]; then
  cp build/devbuild_base/base_libhfnn_ops.so.gz .devbuild/
else
  strip -o .devbuild/hfnn_kernel_tests "$build/hfnn_kernel_tests" && gzip -f .devbuild/hfnn_kernel_tests
fi
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
