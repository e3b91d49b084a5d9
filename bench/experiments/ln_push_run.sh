#!/usr/bin/env bash
# One device call for the HFNN_LN_PUSH experiment (bench/experiments/layer_norm_push_exchange.patch):
# the wide LayerNorm backward's cluster exchange pushed into each block's inbox (HFNN_LN_PUSH=1),
# with dgamma/dbeta's terms summed between the barrier's arrive and wait (=2), and every warp's sums
# pushed with no block barrier (=3), against the committed pull, same build, same call. On an H200
# it runs the issues' H200 benchmarks instead (LSTM, then attention), which no call had reached
# since the sixth session.
#   bash bench/experiments/ln_push_run.sh            (on the device, from the repository root)
cd "$(dirname "$0")/../.."
source bench/experiments/device_start.sh
# Correct first: every variant at the wide widths (the clusters' exchange only runs there), each mode.
for mode in ${PUSH_MODES:-1 2 3}; do
  HFNN_LN_PUSH=$mode timeout ${PUSH_TEST_TIMEOUT:-100} python3 -m pytest tests/python/test_layer_norm_widths.py -q \
    -p no:cacheprovider -k "every_variant_at_every_width and wide and ${PUSH_TEST_DTYPES:-bfloat16}" 2>&1 | tail -3
done
# The backward: every configuration in one process (the switch is read at every launch).
configs="base:"
for mode in ${PUSH_MODES:-1 2 3}; do configs="$configs push$mode:HFNN_LN_PUSH=$mode"; done
timeout 240 python3 bench/layer_norm_bwd_configs.py --configs $configs \
  --only _c2 _c4 _c8 _c16 _c2_smem _c4_smem _c8_smem _c16_smem --new NONE --dtypes bfloat16 float32 float16 \
  --out "$OUT/bwd_push.json" 2>&1 | tail -40
# The forward (HFNN_LN_PUSH_FWD=1; FWD=1 runs it): the cluster variants, pull, push, pull again (drift).
[ "${FWD:-0}" = 1 ] || exit 0
widths="4096 8192 12288 16384 24576 32768 65536"
for run in base:0 push:1 base2:0; do
  HFNN_LN_PUSH_FWD=${run#*:} timeout 120 python3 bench/layer_norm_sweep.py --out "$OUT/fwd_${run%:*}.json" \
    --candidates variants --variants 'fwd_wide_c2*' 'fwd_wide_c4*' 'fwd_wide_c8*' 'fwd_wide_c16*' \
    --sizes 16M --dtypes bfloat16 float32 --widths $widths > "$OUT/fwd_${run%:*}.log" 2>&1 || echo "fwd $run failed"
done
python3 bench/layer_norm_sweep.py --compare "$OUT/fwd_base.json" "$OUT/fwd_push.json" 2>&1 | tail -40
python3 bench/layer_norm_sweep.py --compare "$OUT/fwd_base.json" "$OUT/fwd_base2.json" 2>&1 | tail -12
