#!/usr/bin/env bash
# The dgamma/dbeta partial rows dropped from L2 as the reduction reads them (discard.global.L2,
# where the pass's bytes are more than L2 holds; bench/README.md, "The dgamma/dbeta partials dropped
# from L2"), H100, one call. Build first, here: bash scripts/device_wheel.sh --baseline (carry
# .devbuild; bench/results/layer_norm_sweep-h{100,200}.json travel, the other layer_norm_*.json
# results may be moved aside for the 64 MiB carry).
#   1. HEAD's library against this build's, twice each, at 16M and 1M elements (no line is dropped
#      at 1M: there the two must match)
#   2. every backward variant at 16M elements, every width and dtype of the sweep
#   3. defaults-refresh with it: merged into the committed sweep, the built-in choice's data written
#      from both GPUs' sweeps and checked (torch against the built-in choice, every width and size)
# Then here: cp OUT/layer_norm_sweep-refresh-h100.json bench/results/layer_norm_sweep-h100.json,
# OUT/layer_norm_defaults-refresh.json src/layer_norm_defaults.json (python3 bench/layer_norm_sweep.py
# --defaults of the same files writes the same bytes), OUT/layer_norm_default-refresh-h100.json
# bench/results/layer_norm_default-h100.json.
cd "$(dirname "$0")/../.."
source bench/experiments/device_start.sh
if [[ "${DISCARD_AB:-1}" == 1 ]]; then
  AB_RUNS="base new base2 new2" AB_TIMEOUT=120 OUT="$OUT/ab" bash scripts/device_ab.sh \
    'python3 bench/layer_norm_sweep.py --out $AB_OUT/ab.json --candidates variants copy --sizes 16M 1M --dtypes bfloat16 float32 --widths 256 1536 4096 8192 12288 32768 --variants "bwd_wide_c?_smem" "bwd_wide_c??_smem" bwd_regs_tpr16 bwd_block' \
    | tail -3
fi
[[ "${DISCARD_SWEEP:-1}" == 1 ]] || exit 0
SWEEP_CANDIDATES=variants SWEEP_TIMEOUT=${DISCARD_SWEEP_TIMEOUT:-260} SWEEP_ARGS="--sizes 16M --variants bwd_*" \
  bash scripts/device_run.sh sweep 2>&1 | grep -E "wrote|FAILED" | tail -3
REFRESH_PARTS="$OUT/layer_norm_sweep-h100.json" SWEEP_TIMEOUT=${DISCARD_CHECK_TIMEOUT:-260} \
  bash scripts/device_run.sh defaults-refresh 2>&1 | tail -12
