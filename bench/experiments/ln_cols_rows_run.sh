#!/usr/bin/env bash
# One device call for the *_cols variants' column sums with 16 rows' loads in flight at 2-byte
# accesses (kernels/layer_norm/layer_norm_cols.cu, kRowsAtOnce; bench/README.md, "The column sums'
# rows in flight"): the kernels of a call split (layer_norm_bwd_parts.py), the *_cols variants swept
# at the 16-bit odd widths (the only rows with 2-byte accesses) with bwd_block_win (untouched) as
# the machine's control and merged into this GPU's sweep, the built-in choice's data made again and
# checked (defaults-refresh), then the GPU width test's cases of rows not 16-byte aligned.
# Build first, here: bash scripts/device_wheel.sh (carry .devbuild).
#   bash bench/experiments/ln_cols_rows_run.sh            (on the device, from the repository root)
# Then, here: python3 bench/layer_norm_sweep.py --compare OLD_SWEEP OUT/cols.json, and the files of
# defaults-refresh as scripts/device_run.sh says.
cd "$(dirname "$0")/../.."
source bench/experiments/device_start.sh
timeout 90 python3 bench/layer_norm_bwd_parts.py --out "$OUT/cols_parts.json" --cases \
  bwd_wide_win_c1_cols:bfloat16:4095x4097 bwd_wide_win_c1_cols:float16:4095x4097 \
  bwd_wide_win_c1_cols:bfloat16:16400x1023 bwd_wide_win_c1_cols:float16:16400x1023 2>&1 | grep -v Warn | tail -8
mkdir -p /tmp/cols
timeout 150 python3 bench/layer_norm_sweep.py --out /tmp/cols/layer_norm_sweep-cols.json --candidates variants \
  --variants '*_cols' bwd_block_win --dtypes bfloat16 float16 \
  --widths 33 63 127 255 257 1023 1025 2041 4097 12289 > /tmp/cols/cols.log 2>&1 || echo "sweep failed: $(tail -3 /tmp/cols/cols.log)"
cp /tmp/cols/layer_norm_sweep-cols.json "$OUT/cols.json"
REFRESH_PARTS=/tmp/cols/layer_norm_sweep-cols.json SWEEP_TIMEOUT=230 bash scripts/device_run.sh defaults-refresh 2>&1 | tail -4
timeout ${TEST_TIMEOUT:-150} python3 -m pytest tests/python/test_layer_norm_widths.py -q -p no:cacheprovider \
  -k "wide or unaligned" 2>&1 | tail -3
