#!/usr/bin/env bash
# One device call: the wide LayerNorm kernels' cluster exchange by st.async into each block's inbox,
# counted on an mbarrier a parity (no cluster barrier a row), against the committed exchange (a
# cluster barrier a row: HFNN_LN_BARRIER_EXCHANGE=1 picks those instantiations), same build, same
# call, after the GPU width test of the wide variants in every dtype.
# bench/experiments/layer_norm_async_exchange.patch. On an H200 it runs the issues' H200 benchmarks
# instead (device_start.sh).
#   bash bench/experiments/ln_async_exchange_run.sh            (on the device, from the repository root)
cd "$(dirname "$0")/../.."
source bench/experiments/device_start.sh
for dt in ${TEST_DTYPES:-bfloat16 float32 float16}; do
  timeout ${TEST_TIMEOUT:-100} python3 -m pytest tests/python/test_layer_norm_widths.py -q -p no:cacheprovider \
    -k "every_variant_at_every_width and wide and $dt" 2>&1 | tail -2
done
only="_c2 _c4 _c8 _c16 _c2_smem _c4_smem _c8_smem _c16_smem _c8_cols _c16_cols _c8_smem_cols _c16_smem_cols"
for n in 16777216 1048576; do
  timeout ${CONF_TIMEOUT:-200} python3 bench/layer_norm_bwd_configs.py --configs async: barrier:HFNN_LN_BARRIER_EXCHANGE=1 \
    --only $only --new NONE --dtypes bfloat16 float32 float16 --elements $n \
    --widths 4096 8192 12288 16384 24576 32768 65536 --widths-fp32 4096 8192 16384 32768 65536 \
    --widths-fp16 8192 16384 32768 65536 --out "$OUT/bwd_$n.json" 2>&1 | tail -30
done
[ "${FWD:-1}" = 1 ] || exit 0
for run in async:0 barrier:1 async2:0; do
  HFNN_LN_BARRIER_EXCHANGE=${run#*:} timeout ${FWD_TIMEOUT:-100} python3 bench/layer_norm_sweep.py --out "$OUT/fwd_${run%:*}.json" \
    --candidates variants --variants 'fwd_wide_c2*' 'fwd_wide_c4*' 'fwd_wide_c8*' 'fwd_wide_c16*' 'fwd_wide_win_c16*' \
    --sizes 16M 1M --dtypes bfloat16 float32 --widths 8192 16384 20480 32768 65536 65538 > "$OUT/fwd_${run%:*}.log" 2>&1 \
    || echo "fwd $run failed: $(tail -3 "$OUT/fwd_${run%:*}.log")"
done
python3 bench/layer_norm_sweep.py --compare "$OUT/fwd_barrier.json" "$OUT/fwd_async.json" > "$OUT/fwd_compare.txt" 2>&1; head -24 "$OUT/fwd_compare.txt"
python3 bench/layer_norm_sweep.py --compare "$OUT/fwd_async.json" "$OUT/fwd_async2.json" 2>&1 | head -12
