#!/usr/bin/env bash
# One device call for the next step of "The column sums' rows in flight" (bench/README.md): the
# column sums' 2-byte kernel with 16 rows in flight only where a slice has a step of 16 rows, the
# 4-row kernel (32 registers, not 40) below, against 16 rows at every row count, same build, same
# call (HFNN_LN_COLS_DEEP_ALWAYS=1: what a64503b runs). The *_cols variants at the 16-bit odd widths,
# 16M, 1M and 64K elements, runs in the order new, old, new. Build first, here:
#   git apply bench/experiments/layer_norm_cols_rows_by_count.patch && bash scripts/device_wheel.sh
# (carry .devbuild). On an H200 it runs the issues' H200 benchmarks instead (device_start.sh).
#   bash bench/experiments/ln_cols_by_count_run.sh            (on the device, from the repository root)
# Then, here: python3 bench/layer_norm_sweep.py --compare OUT/deep.json OUT/bycount1.json (and bycount2)
cd "$(dirname "$0")/../.."
source bench/experiments/device_start.sh
sweep() {
  timeout 150 python3 bench/layer_norm_sweep.py --out "$OUT/$1.json" --candidates variants \
    --variants '*_cols' bwd_block_win --dtypes bfloat16 float16 \
    --widths 33 63 127 255 257 1023 1025 2041 4097 12289 > "$OUT/$1.log" 2>&1 || echo "$1 failed: $(tail -3 "$OUT/$1.log")"
}
sweep bycount1
HFNN_LN_COLS_DEEP_ALWAYS=1 sweep deep
sweep bycount2
for run in bycount1 bycount2; do
  python3 bench/layer_norm_sweep.py --compare "$OUT/deep.json" "$OUT/$run.json" | grep -E "^\| (bwd_block_win|bwd_wide_win_c1_cols|bwd_wide_win_c2_cols|bwd_block_win_cols) "
done
timeout 150 python3 -m pytest tests/python/test_layer_norm_widths.py -q -p no:cacheprovider -k "wide or unaligned or column_sums" 2>&1 | tail -2
