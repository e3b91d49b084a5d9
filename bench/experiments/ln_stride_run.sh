#!/usr/bin/env bash
# The dgamma/dbeta partial rows padded to whole 128-byte lines from 1,024 columns on (partials_ld),
# so the reduction drops them from L2 there at every width, not only at multiples of 32 columns
# (bench/README.md, "The dgamma/dbeta partials dropped from L2"): the wide rows not 16-byte aligned
# and the odd widths, whose window variants lead there. Tried, not kept:
# bench/experiments/layer_norm_partials_stride.patch. H100, one call. Build first, here:
#   git apply bench/experiments/layer_norm_partials_stride.patch && bash scripts/device_wheel.sh --baseline
# (carry .devbuild; bench/results/layer_norm_sweep-h{100,200}.json travel for PART 2, the other
# layer_norm_*.json results may be moved aside for the 64 MiB carry).
#   PART=1: HEAD's library against this build's, twice each, at 16M and 1M elements, widths whose
#           rows are not whole lines (narrow ones, whose layout the patch keeps, and 256); then the
#           LayerNorm GPU tests (the past-L2 test at 63, 4,097, 8,193 and 8,194 columns among them)
#           and the width tests of unaligned pointers, other leads, every output mask and every
#           row step
#   PART=2: every backward variant at 16M elements at the sweep's widths from 1,024 on that are not
#           multiples of 32, merged (defaults-refresh: the built-in choice's data written and checked)
# Then here, for PART 2: as bench/experiments/ln_discard_run.sh says.
cd "$(dirname "$0")/../.."
source bench/experiments/device_start.sh
odd="1025 1500 1602 2041 4097 4100 6402 12289 12300 25602 32772 65538"  # not multiples of 32, from 1,024 on
if [[ "${PART:-1}" == 1 ]]; then
  AB_RUNS="base new base2 new2" AB_TIMEOUT=150 OUT=/tmp/stride_ab bash scripts/device_ab.sh \
    'python3 bench/layer_norm_sweep.py --out $AB_OUT/ab.json --candidates variants copy --sizes 16M 1M --dtypes bfloat16 float32 --widths 63 256 257 1023 1025 1500 2041 4097 6402 12289 65538 --variants "bwd_regs_*" "bwd_win_*" "bwd_wide_win_*_smem" bwd_block_win bwd_block "bwd_wide_c?_smem"' \
    | tail -3
  (cd /tmp && tar czf "$OUT/stride_ab.tar.gz" stride_ab)
  timeout 120 python3 -m pytest tests/python/test_layer_norm.py -q -p no:cacheprovider -x 2>&1 | tail -2
  timeout ${WIDTHS_TIMEOUT:-300} python3 -m pytest tests/python/test_layer_norm_widths.py -q -p no:cacheprovider -x \
    -k "unaligned or another_lead or row_step or trains_through" --durations=4 2>&1 | tail -7
else
  SWEEP_CANDIDATES=variants SWEEP_TIMEOUT=${STRIDE_SWEEP_TIMEOUT:-260} SWEEP_ARGS="--sizes 16M --variants bwd_* --widths $odd" \
    bash scripts/device_run.sh sweep 2>&1 | grep -E "wrote|FAILED" | tail -3
  REFRESH_PARTS="$OUT/layer_norm_sweep-h100.json" SWEEP_TIMEOUT=${STRIDE_CHECK_TIMEOUT:-260} \
    bash scripts/device_run.sh defaults-refresh 2>&1 | tail -8
fi
