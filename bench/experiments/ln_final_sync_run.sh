#!/usr/bin/env bash
# One device call: the wide LayerNorm backward without its final cluster barrier (the committed
# form) against the same build with it (HFNN_LN_FINAL_SYNC=1, bench/experiments/
# layer_norm_final_sync.patch), same call, after the GPU width test of the wide variants. On an
# H200 it runs the issues' H200 benchmarks instead (device_start.sh).
#   bash bench/experiments/ln_final_sync_run.sh            (on the device, from the repository root)
cd "$(dirname "$0")/../.."
source bench/experiments/device_start.sh
timeout ${TEST_TIMEOUT:-120} python3 -m pytest tests/python/test_layer_norm_widths.py -q -p no:cacheprovider \
  -k "every_variant_at_every_width and wide and ${TEST_DTYPE:-bfloat16}" 2>&1 | tail -3
only="_c2 _c4 _c8 _c16 _c2_smem _c4_smem _c8_smem _c16_smem _c8_cols _c16_cols _c8_smem_cols _c16_smem_cols"
for n in 16777216 1048576; do
  timeout ${CONF_TIMEOUT:-200} python3 bench/layer_norm_bwd_configs.py --configs nosync: sync:HFNN_LN_FINAL_SYNC=1 \
    --only $only --new NONE --dtypes bfloat16 float32 --elements $n \
    --widths 4096 8192 12288 16384 24576 32768 65536 --widths-fp32 4096 8192 16384 32768 65536 \
    --out "$OUT/final_sync_$n.json" 2>&1 | tail -30
done
