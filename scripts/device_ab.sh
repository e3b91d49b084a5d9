#!/usr/bin/env bash
# A same-machine A/B of any benchmark command, on the GPU machine after scripts/device_run.sh has
# installed this tree's wheel: the command runs with the baseline's op library
# (.devbuild/base_libhfnn_ops.so.gz, from scripts/device_wheel.sh --baseline) swapped into the
# installed package, then with this build's, then with the baseline's again (drift shows as the
# two baseline runs disagreeing). $AB_OUT names each run's folder for the command: $OUT/base1,
# $OUT/new, $OUT/base2. $AB_RUNS lists other runs, in order: a run named new (or new followed by
# digits) runs this build's library, any other NAME (or NAME followed by digits) the library in
# .devbuild/NAME_libhfnn_ops.so.gz, which must be there: base_ is the baseline's, and an
# experiment's own (`cmake --build build/device-sm90 --target hfnn_ops` with its patch applied,
# stripped, gzipped) lets AB_RUNS="base early wide new" time four builds on one machine.
# device_run.sh's `ab` stage runs the LayerNorm sweep with AB_RUNS="base new".
#   AB_TIMEOUT=150 bash scripts/device_ab.sh 'python3 bench/mha.py --configs 0 --out $AB_OUT/mha.json'
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/hfnn-out}
cmd=${1:?usage: scripts/device_ab.sh COMMAND (with \$AB_OUT for its output folder)}
so=$(python3 -c "import hfnn, os; print(os.path.join(os.path.dirname(hfnn.__file__), 'libhfnn_ops.so'))") || exit 1
runs=${AB_RUNS:-base1 new base2}
library() { [[ "$1" == new* ]] || echo ".devbuild/${1%%[0-9]*}_libhfnn_ops.so.gz"; }  # none: this build's
for run in $runs; do
  named=$(library "$run")
  [[ -z "$named" || -f "$named" ]] || {
    echo "device_ab: no $named for the run $run (the baseline's: scripts/device_wheel.sh --baseline)"; exit 1; }
done
mine=$(mktemp)
cp "$so" "$mine" || exit 1
# This build's library goes back however the script ends (a time limit, an interrupt).
trap 'cp "$mine" "$so" && rm -f "$mine" || echo "device_ab: this build'"'"'s library left at $mine"' EXIT
status=0
this_build="this build's library"
for run in $runs; do
  named=$(library "$run")
  if [ -n "$named" ]; then gunzip -c "$named" > "$so"; else cp "$mine" "$so"; fi || { echo "device_ab: could not put the $run library in place"; status=1; break; }
  echo "== device_ab: $run (${named:-$this_build})"
  export AB_OUT=$OUT/$run
  mkdir -p "$AB_OUT"
  timeout "${AB_TIMEOUT:-150}" bash -c "$cmd" > "$AB_OUT/log.txt" 2>&1 || { echo "device_ab: $run exited $?"; status=1; }
  tail -n "${AB_TAIL:-15}" "$AB_OUT/log.txt"
done
exit $status
