#!/usr/bin/env bash
# hfnn_mid's backward with and without its L2 prefetch of the next round's inputs (issue 11,
# MidBwdParams::l2_prefetch; HFNN_MID_L2_PREFETCH=0 turns it off in a process), one build, one
# device call. Build here first: bash scripts/device_wheel.sh (carry .devbuild), then
#   bash bench/experiments/mha_mid_prefetch_run.sh
#   1. the core's GPU tests (tests/python/test_attention_mid.py) with the prefetch on (MID_TESTS=0: none)
#   2. config 0's GPU kernels a call (bench/mha_core_case.py --kernels), off then on, twice, not
#      causal and causal
#   3. sustained (bench/experiments/mha_clocks_probe.py, hfnn's op alone: graph, back to back,
#      short rounds; nvidia-smi's clocks and power beside), off, on, off, on
#   4. bench/mha.py on config 0 bf16 with the prefetch on (MID_BENCH=0: none)
# Results under $OUT: probe-{off,on}{1,2}.json, mha-mid-<gpu>.json, the logs.
source bench/experiments/device_start.sh
status=0
tag=$(echo "$gpu" | grep -oE "H100|H200" | head -1 | tr A-Z a-z)
if [[ "${MID_TESTS:-1}" == 1 ]]; then
  PYTHONUNBUFFERED=1 timeout ${MID_TEST_TIMEOUT:-200} python3 -m pytest tests/python/test_attention_mid.py -q \
    -p no:cacheprovider --durations=3 -o faulthandler_timeout=190 2>&1 | tee "$OUT/pytest-mid.log" | tail -5
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
fi
for round in 1 2; do
  for pf in 0 1; do
    for c in "" --causal; do
      echo "== round $round, prefetch $pf, config 0 ${c:-not causal}"
      HFNN_MID_L2_PREFETCH=$pf timeout 60 python3 bench/mha_core_case.py --config 200 256 1024 16 --cores hfnn_mid \
        --kernels --iters 3 $c 2>&1 | grep -E "fwd\+bwd|GPU busy|mid_bwd|cudnn" | head -6
    done
  done
done 2>&1 | tee "$OUT/kernels.log"
for run in off1 on1 off2 on2; do
  pf=1; [[ "$run" == off* ]] && pf=0
  echo "== probe $run"
  HFNN_MID_L2_PREFETCH=$pf timeout 60 python3 bench/experiments/mha_clocks_probe.py --candidates hfnn \
    --seconds ${PROBE_SECONDS:-3} --out "$OUT/probe-$run.json" 2>&1 | grep -v Warning | tail -5
done 2>&1 | tee "$OUT/probe.log"
if [[ "${MID_BENCH:-1}" == 1 ]]; then
  timeout ${MID_BENCH_TIMEOUT:-150} python3 bench/mha.py --config 200 256 1024 16 --dtypes bfloat16 --need-weights false \
    --no-dispatch --out "$OUT/mha-mid-$tag.json" 2>&1 | tee "$OUT/mha-mid.log" | tail -10
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
fi
exit $status
