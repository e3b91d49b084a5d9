#!/usr/bin/env bash
# The butterfly block sums (bench/experiments/layer_norm_group_total_butterfly.patch) made the window
# backward's dx (bwd_wide_win_c1_cols, bf16 and fp16, 4,097 columns, 16M elements) 1.5x slower on an
# H200 (52 -> 78 us, both rounds), while the forward and the other backward variants gained 0-9%
# (up to 1.9x at float32 widths not 16-byte aligned). One call:
#   1. Nsight Compute on that kernel with HEAD's library and the butterfly's (device_ab.sh base new)
#   2. HEAD (base), the butterfly everywhere (new) and the butterfly but the window backward's old
#      loop over the warps' slots (loop: .devbuild/loop_libhfnn_ops.so.gz, cmake --build of the tree
#      with kLoop for kWin in bwd_wide_kernel), every bwd_wide_win* variant at widths not 16-byte
#      aligned, 16M and 1M elements, three dtypes, each twice -> $OUT/winab.tgz
#   3. The GPU width test's wide and row-count cases on the butterfly build (BUTTERFLY_TESTS=0 skips)
# Built here: git apply the patch, bash scripts/device_wheel.sh --baseline, then the loop library.
cd "$(dirname "$0")/../.."
source bench/experiments/device_start.sh
t0=$SECONDS
AB_RUNS="base new" AB_TIMEOUT=120 AB_TAIL=0 OUT="$OUT/ncu" bash scripts/device_ab.sh \
  'ncu --clock-control none -k regex:bwd_wide_kernel --launch-skip 6 --launch-count 1 --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats --section WarpStateStats --section SchedulerStats python3 bench/profile_variant.py --shape 4096 4097 --dtype bfloat16 --variant bwd_wide_win_c1_cols --runs 8 > $AB_OUT/ncu.log 2>&1'
for r in base new; do
  echo "== ncu $r"; grep -E "Duration|DRAM Throughput|Registers Per|Block Size|Grid Size|Achieved Occupancy|Theoretical Occupancy|Warp Cycles Per Issued|Issue Slots Busy|Executed Ipc|Dynamic Shared|Static Shared|Waves Per SM|Block Limit" "$OUT/ncu/$r/ncu.log" | head -24
done
echo "== ncu done at $((SECONDS - t0)) s"
set -f
AB_RUNS="base new loop base2 new2 loop2" AB_TIMEOUT=60 AB_TAIL=2 OUT="$OUT/winab" bash scripts/device_ab.sh \
  "python3 bench/layer_norm_sweep.py --out \$AB_OUT/ab.json --candidates variants copy --sizes 16M 1M --dtypes float32 bfloat16 float16 --widths 4097 5001 6143 8191 10241 12289 16385 24577 32769 65537 --variants 'bwd_wide_win*'" \
  | grep -E "device_ab|wrote|FAILED"
set +f
tar czf "$OUT/winab.tgz" -C "$OUT" winab ncu && rm -rf "$OUT/winab" "$OUT/ncu"
echo "== A/B done at $((SECONDS - t0)) s"
if [[ "${BUTTERFLY_TESTS:-1}" == 1 ]]; then
  timeout ${TEST_TIMEOUT:-300} python3 -m pytest tests/python/test_layer_norm_widths.py -q -p no:cacheprovider -x \
    -k "wide or row_count" 2>&1 | tail -6
fi
echo "== tests done at $((SECONDS - t0)) s"
