#!/usr/bin/env bash
# The wide forward at 8 accesses a thread instead of 4 (half the threads a row, twice the elements
# a thread, so each row's fixed work - two block sums, the accesses' addresses - is spread over
# twice the elements): an experiment for the H200, whose 16-bit wide kernels run 26-41 instructions
# an element (bench/README.md, "The H200 swept again with this build"). Run in the thirty-second session
# (NV8_RUNS, NV8_VARIANTS of bench/experiments/s32_h200_run.sh): not kept, 0.77-1.05x the best at 4
# (bench/README.md, "The wide kernels' block sums by butterfly"). On this machine:
#   git apply bench/experiments/layer_norm_fwd_nv8.patch && bash scripts/device_wheel.sh
# then on the device (carry .devbuild; move bench/results/layer_norm_*.json aside for the 64 MiB):
#   bash bench/experiments/ln_fwd_nv8_run.sh
# NV8_VARIANTS (globs, default fwd_wide*) and NV8_RUNS (default base nv8 base2 nv8b) narrow it.
# One library, the switch HFNN_LN_FWD_NV (4, the default, or 8) read once a process: the fwd_wide*
# variants at the sweep's widths from 1,024 up, 16M and 1M elements, three dtypes, each setting twice
# in turn (base, nv8, base2, nv8b), files under $OUT/<run>/. Then here:
#   python3 bench/layer_norm_sweep.py --compare OUT/base/layer_norm_sweep.json OUT/nv8/layer_norm_sweep.json
cd "$(dirname "$0")/../.."
source bench/experiments/device_start.sh
widths="1024 1536 2048 2560 3072 4096 5120 6144 8192 10240 12288 16384 20480 24576 32768 49152 65536"
set -f  # the variants are globs for the sweep, not for the shell
variants=${NV8_VARIANTS:-'fwd_wide*'}
set +f
for run in ${NV8_RUNS:-base nv8 base2 nv8b}; do
  case $run in nv8*) nv=8 ;; *) nv=4 ;; esac
  mkdir -p "$OUT/$run"
  HFNN_LN_FWD_NV=$nv timeout ${NV8_TIMEOUT:-130} python3 -X faulthandler bench/layer_norm_sweep.py \
    --out "$OUT/$run/layer_norm_sweep.json" --candidates variants --variants $variants \
    --sizes 16M 1M --widths $widths 2>&1 | grep -E "FAILED|wrote" | head -5
  echo "$run (HFNN_LN_FWD_NV=$nv) done"
done
