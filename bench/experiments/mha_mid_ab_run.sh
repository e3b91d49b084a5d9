#!/usr/bin/env bash
# hfnn_mid, this tree against a baseline on one GPU (issue 11): build with
# `scripts/device_wheel.sh --baseline` (the baseline library: HEAD without this tree's changes),
# then, from the repository root with .devbuild carried (over 64 MiB with the tracked files? move
# bench/results/layer_norm_sweep-h100.json aside for the call):
#   bash bench/experiments/mha_mid_ab_run.sh
# The core's GPU tests on this build (tests/python/test_attention_mid.py; MID_ATTENTION_TESTS=1:
# test_attention.py's GPU tests too, every core, another 3 minutes); config 0 with cuDNN's backward
# and hfnn's, causal and not, the baseline's library then this build's (scripts/device_ab.sh); then
# bench/mha.py on config 0 bf16 (issue 11's 1.8x) with this build. MID_TESTS=0: no tests (about
# 225 s; an A/B of a kernel experiment first, its tests once it wins); MID_AB=0: no A/B (build
# without --baseline); MID_AB_RUNS: the libraries, in order (default "base new"; see
# scripts/device_ab.sh for experiments' own libraries), MID_AB_CORES (default "sdpa_cudnn hfnn_mid"),
# MID_AB_ITERS (calls timed, default 3); MID_BENCH=0: no bench/mha.py (on an H200 it runs first);
# MID_SHORT_TESTS=1: tests/python/test_attention_short.py too, last; MID_GAPS=1: where the GPU waits between kernels at config 0, cuDNN's backward and
# hfnn's. On an H200 with H200_BENCH=1, device_start.sh runs the every-config benchmark
# instead.
source bench/experiments/device_start.sh
status=0
tag=$(echo "$gpu" | grep -oE "H100|H200" | head -1 | tr A-Z a-z)
if [[ "${MID_TESTS:-1}" == 1 ]]; then
  PYTHONUNBUFFERED=1 timeout ${MID_TEST_TIMEOUT:-300} python3 -m pytest tests/python/test_attention_mid.py -q \
    -p no:cacheprovider --durations=3 -o faulthandler_timeout=280 2>&1 | tee "$OUT/pytest-mid.log" | tail -6
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
fi
if [[ -n "${MID_ATTENTION_TESTS:-}" ]]; then
  PYTHONUNBUFFERED=1 timeout 220 python3 -m pytest tests/python/test_attention.py -q -p no:cacheprovider -k gpu \
    -o faulthandler_timeout=200 2>&1 | tee "$OUT/pytest-attention.log" | tail -6
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
fi
bench() {
  timeout ${MID_BENCH_TIMEOUT:-150} python3 bench/mha.py --config 200 256 1024 16 --dtypes bfloat16 --need-weights false \
    --no-dispatch --out "$OUT/mha-mid-$tag.json" 2>&1 | tee "$OUT/mha-mid.log" | tail -10
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
}
# On an H200 the benchmark goes first: config 0's 1.8x is the H200's target.
[[ "$tag" == h200 && "${MID_BENCH:-1}" == 1 ]] && bench
if [[ "${MID_AB:-1}" == 1 ]]; then
  AB_RUNS="${MID_AB_RUNS:-base new}" AB_TIMEOUT=${MID_AB_TIMEOUT:-100} AB_TAIL=40 OUT="$OUT" bash scripts/device_ab.sh \
    'for c in "" --causal; do echo "== config 0 ${c:-not causal}"; python3 bench/mha_core_case.py --config 200 256 1024 16 --cores '"${MID_AB_CORES:-sdpa_cudnn hfnn_mid}"' --kernels --iters '"${MID_AB_ITERS:-3}"' $c 2>&1 | grep -E "fwd\+bwd|GPU busy|mid_bwd|cudnn|compute_dot|convert_dq|splitK_NNT"; done' || status=1
fi
[[ "$tag" != h200 && "${MID_BENCH:-1}" == 1 ]] && bench
if [[ -n "${MID_SHORT_TESTS:-}" ]]; then
  PYTHONUNBUFFERED=1 timeout ${MID_SHORT_TIMEOUT:-200} python3 -m pytest tests/python/test_attention_short.py -q -p no:cacheprovider \
    --durations=3 -o faulthandler_timeout=190 2>&1 | tee "$OUT/pytest-short.log" | tail -6
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
fi
if [[ -n "${MID_GAPS:-}" ]]; then
  timeout 90 python3 bench/mha_core_case.py --config 200 256 1024 16 --cores sdpa_cudnn hfnn_mid --gaps --iters 5 \
    2>&1 | tee "$OUT/gaps.log" | grep -v Warning | head -60
fi
exit $status
