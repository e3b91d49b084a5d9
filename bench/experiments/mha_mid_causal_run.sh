#!/usr/bin/env bash
# hfnn_mid with causal steps skipped (bench/experiments/mha_mid_causal_skip.patch, not yet run): a
# warp whose query rows all come before a step's keys skips the step, and the dV/dK tiles start
# their contraction at their own first key. On the GPU: the core's tests (causal cases included),
# then where a call's GPU time goes at config 0, causal and not, with cuDNN's backward and with
# hfnn's. Apply the patch, `bash scripts/device_wheel.sh`, then from the repository root (.devbuild
# carried):
#   bash bench/experiments/mha_mid_causal_run.sh
source bench/experiments/device_start.sh
status=0
timeout 240 python3 -m pytest tests/python/test_attention_mid.py -q -p no:cacheprovider --durations=3 \
  -o faulthandler_timeout=150 2>&1 | tee "$OUT/pytest-mid.log" | tail -8
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1
for causal in "" --causal; do
  echo "== config 0 ${causal:-not causal}"
  python3 bench/mha_core_case.py --config 200 256 1024 16 --cores module sdpa_cudnn hfnn_mid --kernels --iters 3 \
    $causal 2>&1 | grep -E "fwd\+bwd|GPU busy|mid_bwd|cudnn|compute_dot|convert_dq" | tee -a "$OUT/mid-core.log"
done
exit $status
