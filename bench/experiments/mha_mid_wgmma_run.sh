#!/usr/bin/env bash
# hfnn_mid's scores and dP by wgmma (issue 11), one device call, from the repository root with
# .devbuild carried (the wheel and the baseline's library from `scripts/device_wheel.sh --baseline`,
# and .devbuild/nowg_libhfnn_ops.so.gz: this build with kHaveWgmma false, the mma.sync path on the
# swizzled layout that a Hopper runs from a build without sm_90a machine code). The third, after
# device_wheel.sh: set `#if defined(__CUDA_ARCH_FEAT_SM90_ALL)` above kHaveWgmma in
# kernels/multihead_attention/mid_attention.cu to `#if 0`, then
#   cmake --build build/device-sm90 --target hfnn_ops && strip -o /tmp/l.so build/device-sm90/libhfnn_ops.so &&
#     gzip -c /tmp/l.so > .devbuild/nowg_libhfnn_ops.so.gz
# and put the line back (and rebuild). Move bench/results/layer_norm_*.json aside for the call (the
# 64 MiB carry), then:
#   bash bench/experiments/mha_mid_wgmma_run.sh
# 1. one grid test first (bf16; a wrong wgmma fails it in a minute and the call stops there);
# 2. config 0 causal and not, HEAD's library against this build's, twice (scripts/device_ab.sh);
# 3. the core's GPU tests, all of them; 4. the mma.sync path's grid and bit-equality tests;
# 5. bench/mha.py on config 0 bf16.
source bench/experiments/device_start.sh
status=0
tag=$(echo "$gpu" | grep -oE "H100|H200" | head -1 | tr A-Z a-z)
t() { PYTHONUNBUFFERED=1 timeout "$1" python3 -m pytest tests/python/test_attention_mid.py -q -p no:cacheprovider -x \
        -o faulthandler_timeout=$(($1 - 10)) "${@:2}" 2>&1; }
t 120 -k "grid and bfloat16" | tee "$OUT/pytest-first.log" | tail -4
[ "${PIPESTATUS[0]}" -eq 0 ] || { echo "the first grid test failed: stopping"; exit 1; }
AB_RUNS="base new base2 new2" AB_TIMEOUT=60 AB_TAIL=40 OUT="$OUT" bash scripts/device_ab.sh \
  'for c in "" --causal; do echo "== config 0 ${c:-not causal}"; python3 bench/mha_core_case.py --config 200 256 1024 16 --cores hfnn_mid --kernels --iters 10 $c 2>&1 | grep -E "fwd\+bwd|GPU busy|mid_bwd|fprop|splitK_NNT"; done' || status=1
t 260 --durations=3 | tee "$OUT/pytest-mid.log" | tail -4
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1
AB_RUNS="nowg" AB_TIMEOUT=120 AB_TAIL=6 OUT="$OUT" bash scripts/device_ab.sh \
  'PYTHONUNBUFFERED=1 python3 -m pytest tests/python/test_attention_mid.py -q -p no:cacheprovider -k "grid and bfloat16 or bit_identical or batch_and_head" 2>&1' || status=1
timeout ${MID_BENCH_TIMEOUT:-120} python3 bench/mha.py --config 200 256 1024 16 --dtypes bfloat16 --need-weights false \
  --no-dispatch --out "$OUT/mha-mid-$tag.json" 2>&1 | tee "$OUT/mha-mid.log" | tail -10
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1
exit $status
