#!/usr/bin/env bash
# One device call for the flat-tile LayerNorm variants (kernels/layer_norm/layer_norm_flat.cu:
# fwd_flat_tpr*, and bwd_flat_tpr* from bench/experiments/layer_norm_flat_bwd.patch, not kept;
# bench/README.md, "Narrow rows through flat tiles") and the window
# backward's sum slots strided by its own block in clusters of 16 (bwd_wide_win_c16_smem): first
# the GPU width test's cases of widths 1 to 550, unaligned pointers, every output mask and the column sums (every
# variant that says yes against float64, and the flat variants taking exactly the rows they
# claim), then a sweep of the new variants at every width of the sweep where they run, three
# dtypes, 16M, 1M and 64K elements, with bwd_wide_win_c16_smem and the untouched fwd_regs_tpr8,
# bwd_regs_tpr8, fwd_win_tpr8 and bwd_win_tpr8_smem as the control against the committed sweep.
# Build first, here: git apply bench/experiments/layer_norm_flat_bwd.patch && bash
# scripts/device_wheel.sh (carry .devbuild), then on the device
#   bash bench/experiments/ln_flat_run.sh
# Then, here: python3 bench/layer_norm_sweep.py --compare bench/results/layer_norm_sweep-h100.json OUT/flat.json
cd "$(dirname "$0")/../.."
source bench/experiments/device_start.sh
timeout ${TEST_TIMEOUT:-260} python3 -m pytest tests/python/test_layer_norm_widths.py -q -p no:cacheprovider -x \
  -k "unaligned or another_lead or column_sums or 1-275 or 276-550" 2>&1 | tail -15
timeout ${SWEEP_TIMEOUT:-200} python3 bench/layer_norm_sweep.py --out "$OUT/flat.json" --candidates variants \
  --variants 'fwd_flat_*' 'bwd_flat_*' bwd_wide_win_c16_smem fwd_regs_tpr8 bwd_regs_tpr8 fwd_win_tpr8 \
  bwd_win_tpr8_smem --widths sweep > "$OUT/flat.log" 2>&1 || echo "sweep failed: $(tail -5 "$OUT/flat.log")"
grep -E "FAILED|wrote" "$OUT/flat.log" | head
