#!/usr/bin/env bash
# One device call for the window kernels' 16-byte stores (bench/experiments/layer_norm_win_store.patch:
# store_window's 16-byte store written in PTX; bench/README.md, "The window backward's own sums"):
# every variant that writes through a window, at every width of the sweep where it runs (rows not
# 16-byte aligned), three dtypes, 16M, 1M and 64K elements, with fwd_wide_c1, fwd_regs_tpr32,
# bwd_wide_c1_smem and bwd_regs_tpr32 (untouched) as the machine's control against the committed
# sweep; then that sweep merged and the built-in choice's data made from it and checked
# (defaults-refresh: its files under OUT, to keep if the sweep shows a gain, else to drop). The
# sweep of the seven bwd_wide_win_c* variants took 30 s; this one's 40-odd should take 3-4 minutes.
# Build first, here:
#   git apply bench/experiments/layer_norm_win_store.patch && bash scripts/device_wheel.sh   (carry .devbuild)
#   bash bench/experiments/ln_win_store_run.sh            (on the device, from the repository root)
# Then, here: python3 bench/layer_norm_sweep.py --compare bench/results/layer_norm_sweep-h100.json OUT/win_store.json
# (the controls first), and in a second call the whole GPU width test (bash scripts/device_run.sh widths, 450 s).
cd "$(dirname "$0")/../.."
source bench/experiments/device_start.sh
timeout ${SWEEP_TIMEOUT:-280} python3 bench/layer_norm_sweep.py --out "$OUT/win_store.json" --candidates variants \
  --variants 'fwd_win_*' 'fwd_wide_win_*' fwd_block 'bwd_win_*' 'bwd_wide_win_*' bwd_block_win bwd_block_win_cols \
  fwd_wide_c1 fwd_regs_tpr32 bwd_wide_c1_smem bwd_regs_tpr32 --widths sweep > "$OUT/win_store.log" 2>&1 \
  || { echo "sweep failed: $(tail -5 "$OUT/win_store.log")"; exit 1; }
grep -E "FAILED|wrote" "$OUT/win_store.log" | head
REFRESH_PARTS=$OUT/win_store.json SWEEP_TIMEOUT=${REFRESH_TIMEOUT:-260} bash scripts/device_run.sh defaults-refresh 2>&1 | tail -4
