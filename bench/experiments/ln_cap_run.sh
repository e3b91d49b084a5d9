#!/usr/bin/env bash
# One device call for the HFNN_LN_CAP_DIV experiment (bench/experiments/layer_norm_cap_div.patch, on 033ef77):
# the wide backward's cluster cap (partial rows within rows x esize / DIV clusters, DIV = 16
# committed) at other divisors, after the pushed exchange, same build, same call. On an H200 it
# runs the issues' H200 benchmarks instead (LSTM, then attention).
#   bash bench/experiments/ln_cap_run.sh            (on the device, from the repository root)
cd "$(dirname "$0")/../.."
source bench/experiments/device_start.sh
configs="base:"
for div in ${CAP_DIVS:-8 24 32}; do configs="$configs d$div:HFNN_LN_CAP_DIV=$div"; done
timeout 300 python3 bench/layer_norm_bwd_configs.py --configs $configs \
  --only _c1 _c2 _c4 _c8 _c16 _c1_smem _c2_smem _c4_smem _c8_smem _c16_smem --new NONE \
  --dtypes bfloat16 float32 float16 --out "$OUT/bwd_cap.json" 2>&1 | tail -40
