#!/usr/bin/env bash
# hfnn_mid with causal steps skipped (twentieth session), on the GPU: the core's tests (every
# length, causal cases included), then the Transformer example (causal attention, config 1 =
# [200, 256, 1024, 16]) through profile -> tune -> HFNN_DISPATCH_DB with
# whatever time is left of a 590-second call. From the repository root, .devbuild carried:
#   bash bench/experiments/mha_mid_causal_e2e_run.sh
source bench/experiments/device_start.sh
status=0
PYTHONUNBUFFERED=1 timeout ${MID_TEST_TIMEOUT:-330} python3 -m pytest tests/python/test_attention_mid.py -v \
  -p no:cacheprovider --durations=6 -o faulthandler_timeout=300 2>&1 | tee "$OUT/pytest-mid.log" | tail -16
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1
left=$((580 - SECONDS))
echo "e2e: $left s left"
if (( left > 120 )); then
  tag=$(echo "$gpu" | grep -oE "H100|H200" | head -1 | tr A-Z a-z)
  timeout $left python3 bench/e2e.py --example transformer --config 1 --dtype bfloat16 \
    --out "$OUT/e2e-transformer-c1-$tag-bfloat16.json" --plot "$OUT/e2e-transformer-c1-$tag-bfloat16.svg" \
    > "$OUT/e2e-transformer-c1.log" 2>&1 || status=1
  tail -30 "$OUT/e2e-transformer-c1.log"
fi
exit $status
