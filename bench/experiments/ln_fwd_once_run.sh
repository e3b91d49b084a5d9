#!/usr/bin/env bash
# The one-pass wide forward (fwd_wide_once_kernel: fwd_wide_c1, c2 and c4) against the loop kernel it
# replaced, in one build and one call (H200): the width tests of fwd_wide_c1, c2 and c4 (every width
# 1-1,100 and the wide set, unaligned pointers, every row count, the mean far from zero; three
# dtypes), then the forward under launch configurations, in rounds (bench/experiments/ln_fwd_configs.py),
# at each of LN_ONCE_ELEMENTS. The configurations need the experiment's build, whose environment
# variables the launches read (bench/experiments/layer_norm_fwd_once_ab.patch, applied to the commit
# that kept the kernel):
#   HFNN_LN_FWD_ONCE=0 the loop kernel everywhere, 1 (or unset) as kept, 2 / 3 fwd_wide_c1's kernel
#   bound to 2 / 3 blocks of 512 threads an SM, 4 the one-pass kernel at every cluster size;
#   HFNN_LN_FWD_NV=8 the wide forward's rows at 8 accesses a thread instead of 4.
# Build first, here: git apply bench/experiments/layer_norm_fwd_once_ab.patch && bash scripts/device_wheel.sh
# (carry .devbuild), and git apply -R it after.
cd "$(dirname "$0")/../.."
source bench/experiments/device_start.sh
if [[ "${LN_ONCE_TESTS:-1}" == 1 ]]; then
  LN_TEST_VARIANTS="fwd_wide_c1 fwd_wide_c2 fwd_wide_c4" timeout ${TEST_TIMEOUT:-240} python3 -m pytest tests/python/test_layer_norm_widths.py \
    -q -p no:cacheprovider -x -k "every_width or unaligned or row_count or far_from_zero" 2>&1 | tail -6
fi
for n in ${LN_ONCE_ELEMENTS:-16777216}; do
  timeout ${AB_TIMEOUT:-300} python3 bench/experiments/ln_fwd_configs.py --out "$OUT/fwd_once_$n.json" --elements $n \
    --configs ${LN_ONCE_CONFIGS:-loop:HFNN_LN_FWD_ONCE=0 once: cap2:HFNN_LN_FWD_ONCE=2 cap3:HFNN_LN_FWD_ONCE=3 nv8:HFNN_LN_FWD_NV=8 loop2:HFNN_LN_FWD_ONCE=0 once2:} \
    --variants ${LN_ONCE_VARIANTS:-fwd_wide_c1} --dtypes ${LN_ONCE_DTYPES:-bfloat16 float16} \
    --widths ${LN_ONCE_WIDTHS:-2048 2560 3072 4096 5120 6144 7168 8192 10240 12288 16384 24576}
done
