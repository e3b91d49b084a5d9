#!/usr/bin/env bash
# One device call for the window backward's sum slots strided by its own block instead of 256
# threads (bench/experiments/layer_norm_win_slots.patch; bench/README.md, "The window backward's own
# sums": the small blocks of c8 and c16 took 256 threads' slots, 32-64 KB each; at 65,538 16-bit
# columns, c16's 160-thread blocks, 2 blocks an SM by shared memory, 3 with it; ptxas: registers
# within 4 of before, no spill). bwd_wide_win_c*_smem at every width of the sweep where it runs, with
# bwd_wide_win_c1_cols and bwd_block_win (untouched) as the control against the committed sweep,
# then the GPU width test's cases of rows not 16-byte aligned, wide rows and every output mask.
# It applies with or without layer_norm_win_store.patch (other files); measure one at a time.
# Build first, here:
#   git apply bench/experiments/layer_norm_win_slots.patch && bash scripts/device_wheel.sh   (carry .devbuild)
#   bash bench/experiments/ln_win_slots_run.sh            (on the device, from the repository root)
# Then, here: python3 bench/layer_norm_sweep.py --compare bench/results/layer_norm_sweep-h100.json OUT/win_slots.json
cd "$(dirname "$0")/../.."
source bench/experiments/device_start.sh
timeout ${SWEEP_TIMEOUT:-200} python3 bench/layer_norm_sweep.py --out "$OUT/win_slots.json" --candidates variants \
  --variants 'bwd_wide_win_c*_smem' bwd_wide_win_c1_cols bwd_block_win --widths sweep > "$OUT/win_slots.log" 2>&1 \
  || echo "sweep failed: $(tail -5 "$OUT/win_slots.log")"
grep -E "FAILED|wrote" "$OUT/win_slots.log" | head
timeout ${TEST_TIMEOUT:-200} python3 -m pytest tests/python/test_layer_norm_widths.py -q -p no:cacheprovider -x \
  -k "wide or unaligned or another_lead" 2>&1 | tail -3
