#!/usr/bin/env bash
# The row-register variants (fwd_regs_tpr*, bwd_regs_tpr*) holding exactly the accesses that cover
# a 16-bit row in accesses under 16 bytes (3, 5, 6 and 7 besides the powers of two:
# regs_exact_accesses in kernels/layer_norm/layer_norm_variants.h), H100, one device call:
#   1. the GPU width test's cases of widths 1 to 550 and unaligned pointers (every variant that says
#      yes against float64)
#   2. HEAD's library against this build's at the sweep's 16-bit widths whose rows are not 16-byte
#      aligned up to 512 columns (and 160 and 500, 16-byte controls), 16M elements, bf16 and fp16
#      (device_ab.sh: base, new, base2, new2)
# Build first, here: bash scripts/device_wheel.sh --baseline (carry .devbuild; the layer_norm_*.json
# results other than the two sweeps may be moved aside for the 64 MiB carry). With H200_BENCH=1 on
# an H200 it runs the issues' H200 benchmarks instead (device_start.sh).
#   bash bench/experiments/ln_regs_exact_run.sh
# Then here: python3 bench/layer_norm_sweep.py --compare OUT/base/ab.json OUT/new/ab.json
cd "$(dirname "$0")/../.."
source bench/experiments/device_start.sh
if [[ "${REGS_TESTS:-1}" == 1 ]]; then
  timeout ${TEST_TIMEOUT:-280} python3 -m pytest tests/python/test_layer_norm_widths.py -q -p no:cacheprovider -x \
    -k "unaligned or 1-275 or 276-550" 2>&1 | tail -8
fi
widths="33 34 36 63 98 100 127 160 255 257 402 500"
AB_RUNS=${REGS_AB_RUNS:-"base new base2 new2"} AB_TIMEOUT=${REGS_AB_TIMEOUT:-90} OUT="$OUT/ab" bash scripts/device_ab.sh \
  "python3 bench/layer_norm_sweep.py --out \$AB_OUT/ab.json --candidates variants --sizes 16M --dtypes bfloat16 float16 --widths $widths --variants 'fwd_regs_*' 'bwd_regs_*'" \
  | grep -E "device_ab|wrote|FAILED" | tail -12
