#!/usr/bin/env bash
# fwd_regs_tpr32 at 16 accesses a lane (16-bit rows of 2,049 to 4,096 columns, a warp a row) on the
# GPU machine, one call: `git apply bench/experiments/layer_norm_fwd_regs16.patch`, then
# `bash scripts/device_wheel.sh` here (carry .devbuild; not kept: bench/README.md, "A warp a row at
# 16 accesses a lane"). Its width and row-count
# tests alone, then the sweep of it beside the variants that took those widths before
# (fwd_wide_c1 and the persistent cluster forwards), 16M and 1M elements, bf16 and fp16.
#   bash bench/experiments/ln_fwd_regs16_run.sh     -> $OUT/ln-regs16-tests.log, $OUT/layer_norm_sweep-<gpu>.json
# then here: python3 bench/layer_norm_sweep.py --summarize THAT.json (or filter its records).
cd "$(dirname "$0")/../.."
source bench/experiments/device_start.sh
LN_TEST_VARIANTS='fwd_regs_tpr32' timeout 200 python3 -m pytest tests/python/test_layer_norm_widths.py -q -p no:cacheprovider \
  -k "every_width or unaligned or row_count" 2>&1 | tee "$OUT/ln-regs16-tests.log" | tail -8
SWEEP_CANDIDATES="variants torch" SWEEP_TIMEOUT=${SWEEP_TIMEOUT:-240} OUT=$OUT SWEEP_ARGS="--sizes 16M 1M --dtypes bfloat16 float16 \
  --widths 1024 2048 2056 2304 2560 3072 3584 4000 4096 \
  --variants fwd_regs_tpr32 fwd_wide_c1 fwd_wide_c1_ps fwd_wide_c2_ps fwd_wide_c4_ps" \
  bash scripts/device_run.sh sweep 2>&1 | tail -4
