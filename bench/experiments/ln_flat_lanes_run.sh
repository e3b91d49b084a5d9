#!/usr/bin/env bash
# The flat forward (fwd_flat_tpr*, kernels/layer_norm/layer_norm_flat.cu) instantiated for every
# count of elements a lane, 1 to 16, instead of the powers of two (33 columns at 4 lanes: 9
# elements a lane in 16 slots before), H100, one device call:
#   1. the GPU width test's cases of widths 1 to 550 and unaligned pointers (every variant that says
#      yes against float64, the flat ones taking exactly the rows they claim)
#   2. HEAD's library against this build's at the sweep's widths up to 512 where the flat variants
#      run, 16M elements, three dtypes (device_ab.sh: base, new, base2, new2)
# Build first, here: bash scripts/device_wheel.sh --baseline (carry .devbuild; the layer_norm_*.json
# results other than the two sweeps may be moved aside for the 64 MiB carry). With H200_BENCH=1 on
# an H200 it runs the issues' H200 benchmarks instead (device_start.sh).
#   bash bench/experiments/ln_flat_lanes_run.sh
# Then here: python3 bench/layer_norm_sweep.py --compare OUT/base/ab.json OUT/new/ab.json
cd "$(dirname "$0")/../.."
source bench/experiments/device_start.sh
if [[ "${FLAT_TESTS:-1}" == 1 ]]; then
  timeout ${TEST_TIMEOUT:-280} python3 -m pytest tests/python/test_layer_norm_widths.py -q -p no:cacheprovider -x \
    -k "unaligned or 1-275 or 276-550" 2>&1 | tail -8
fi
widths="32 33 34 36 48 63 64 96 98 100 127 128 160 192 255 256 257 320 384 402 500 512"
AB_RUNS=${FLAT_AB_RUNS:-"base new base2 new2"} AB_TIMEOUT=${FLAT_AB_TIMEOUT:-90} OUT="$OUT/ab" bash scripts/device_ab.sh \
  "python3 bench/layer_norm_sweep.py --out \$AB_OUT/ab.json --candidates variants copy --sizes 16M --widths $widths --variants 'fwd_flat_*'" \
  | grep -E "device_ab|wrote|FAILED" | tail -12
