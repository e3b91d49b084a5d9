#!/usr/bin/env bash
# One device call for the window backward with its own dgamma/dbeta sums (bwd_wide_win_c*_smem,
# kernels/layer_norm/layer_norm_wide.cu; bench/README.md, "The window backward's own sums"): the GPU
# width test's cases of rows not 16-byte aligned, wide rows and every output mask (every variant,
# the new ones among them), then the new variants swept at every width of the sweep (they take the
# rows not 16-byte aligned only) with bwd_wide_win_c1_cols and bwd_block_win, untouched, as the
# control against the committed sweep. Build first, here: bash scripts/device_wheel.sh (carry .devbuild).
#   bash bench/experiments/ln_win_sums_run.sh            (on the device, from the repository root)
# Then, here: python3 bench/layer_norm_sweep.py --compare bench/results/layer_norm_sweep-h100.json OUT/win_sums.json
# (the control), and the best variant per case before and after (--merge into a copy, --summarize).
cd "$(dirname "$0")/../.."
source bench/experiments/device_start.sh
timeout ${TEST_TIMEOUT:-200} python3 -m pytest tests/python/test_layer_norm_widths.py -q -p no:cacheprovider -x \
  -k "wide or unaligned or another_lead" 2>&1 | tail -15
timeout ${SWEEP_TIMEOUT:-300} python3 bench/layer_norm_sweep.py --out "$OUT/win_sums.json" --candidates variants \
  --variants 'bwd_wide_win_c*_smem' bwd_wide_win_c1_cols bwd_block_win --widths sweep > "$OUT/win_sums.log" 2>&1 \
  || echo "sweep failed: $(tail -5 "$OUT/win_sums.log")"
grep -E "FAILED|wrote" "$OUT/win_sums.log" | head
