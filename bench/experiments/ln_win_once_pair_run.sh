#!/usr/bin/env bash
# Rows not 16-byte aligned (16-bit, 16M and 1M elements) through the faster aligned kernels, one
# build and one call (H200): the forward's one-pass kernel through windows (fwd_wide_win_c1, c2 and
# c4 _direct: fwd_once_body's kWin) under register caps, and the backward's two-rows kernel through
# windows (bwd_wide_win_c*_smem: bwd_wide_pair_kernel's kWin) against the window kernel it
# replaces. The build's environment variables (experiment only, bench/experiments/
# layer_norm_win_once_pair.patch on the commit it names):
#   HFNN_LN_WIN_CAP=64|72|80  the one-block window forward (fwd_wide_win_c1_direct) at up to 4
#     accesses a thread under that register cap (__maxnreg__), 0 without;
#   HFNN_LN_WIN_PAIR=0  the window backward's own kernel (bwd_wide_kernel's kWin) everywhere, 1 (the
#     default) the two-rows kernel where it takes the shape.
# First the tests of the window variants: test_layer_norm.py (its past-L2 backward at 4,097 and
# 8,193 columns runs the two-rows window kernel), and every window variant at every width.
# Build first, here: bash scripts/device_wheel.sh (carry .devbuild).
cd "$(dirname "$0")/../.."
source bench/experiments/device_start.sh
widths=${LN_WIN_WIDTHS:-1023 1025 1500 1602 2041 4097 4100 6402 12289 12300 25602 32772 65538}
if [[ "${LN_WIN_TESTS:-1}" == 1 ]]; then
  timeout ${TEST_TIMEOUT:-150} python3 -m pytest tests/python/test_layer_norm.py -q -p no:cacheprovider -x 2>&1 | tail -3
  LN_TEST_VARIANTS='fwd_wide_win_* bwd_wide_win_*_smem' timeout ${TEST_TIMEOUT:-200} python3 -m pytest \
    tests/python/test_layer_norm_widths.py -q -p no:cacheprovider -x 2>&1 | tail -3
fi
timeout ${FWD_TIMEOUT:-150} python3 bench/experiments/ln_fwd_configs.py --out "$OUT/win_fwd_caps.json" \
  --configs base: c64:HFNN_LN_WIN_CAP=64 c72:HFNN_LN_WIN_CAP=72 c80:HFNN_LN_WIN_CAP=80 base2: \
  --variants fwd_wide_win_c1_direct fwd_wide_win_c1 --dtypes bfloat16 float16 float32 --widths $widths 2>&1 | tail -3
for run in own pair own2 pair2; do
  case $run in own*) v=0 ;; *) v=1 ;; esac
  HFNN_LN_WIN_PAIR=$v timeout ${BWD_TIMEOUT:-80} python3 bench/layer_norm_sweep.py --out "$OUT/win_bwd_$run.json" \
    --candidates variants --variants 'bwd_wide_win_c*_smem' --sizes 16M 1M --dtypes bfloat16 float16 \
    --widths $widths 2>&1 | grep -E "FAILED|wrote" | tail -3
done
