#!/usr/bin/env bash
# A same-machine A/B of any benchmark command, on the GPU machine after scripts/device_run.sh has
# installed this tree's wheel: the command runs with the baseline's op library
# (.devbuild/base_libhfnn_ops.so.gz, from scripts/device_wheel.sh --baseline) swapped into the
# installed package, then with this build's, then with the baseline's again (drift shows as the
# two baseline runs disagreeing). $AB_OUT names each run's folder for the command: $OUT/base1,
# $OUT/new, $OUT/base2. $AB_RUNS lists other runs, in order (a name starting with "base" runs the
# baseline's library, any other this build's): device_run.sh's `ab` stage runs the LayerNorm sweep
# with AB_RUNS="base new". More than two libraries: a run named NAME (or NAME followed by digits)
# for which .devbuild/NAME_libhfnn_ops.so.gz exists runs that library (an experiment's op library:
# `cmake --build build/device-sm90 --target hfnn_ops` with its patch applied, stripped, gzipped),
# so AB_RUNS="base early wide new" times four builds on one machine.
#   AB_TIMEOUT=150 bash scripts/device_ab.sh 'python3 bench/mha.py --configs 0 --out $AB_OUT/mha.json'
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/hfnn-out}
cmd=${1:?usage: scripts/device_ab.sh COMMAND (with \$AB_OUT for its output folder)}
so=$(python3 -c "import hfnn, os; print(os.path.join(os.path.dirname(hfnn.__file__), 'libhfnn_ops.so'))") || exit 1
[[ " ${AB_RUNS:-base1 new base2}" != *" base"* || -f .devbuild/base_libhfnn_ops.so.gz ]] || { echo "device_ab: no .devbuild/base_libhfnn_ops.so.gz (scripts/device_wheel.sh --baseline)"; exit 1; }
mine=$(mktemp)
cp "$so" "$mine" || exit 1
# This build's library goes back however the script ends (a time limit, an interrupt).
trap 'cp "$mine" "$so" && rm -f "$mine" || echo "device_ab: this build'"'"'s library left at $mine"' EXIT
status=0
for run in ${AB_RUNS:-base1 new base2}; do
  named=.devbuild/${run%%[0-9]*}_libhfnn_ops.so.gz
  [[ "$run" == base* ]] && named=.devbuild/base_libhfnn_ops.so.gz
  if [ -f "$named" ]; then gunzip -c "$named" > "$so"; else cp "$mine" "$so"; fi || { echo "device_ab: could not put the $run library in place"; status=1; break; }
  echo "== device_ab: $run ($([ -f "$named" ] && echo "$named" || echo "this build's library"))"
  export AB_OUT=$OUT/$run
  mkdir -p "$AB_OUT"
  timeout "${AB_TIMEOUT:-150}" bash -c "$cmd" > "$AB_OUT/log.txt" 2>&1 || { echo "device_ab: $run exited $?"; status=1; }
  tail -n "${AB_TAIL:-15}" "$AB_OUT/log.txt"
done
exit $status
