#!/usr/bin/env bash
# cuBLASLt's algorithms timed at a shape's first call (HFNN_GEMM_AUTOTUNE=N in kernels/common/gemm.cpp:
# the fastest of the heuristic's first N answers, where beta is 0 and no graph is being captured)
# against the heuristic's first answer, on the attention op's GEMMs, one device call:
#   1. bench/mha_cpu.py --kernels (per-kernel GPU time of a fwd+bwd call, and the GPU's idle time)
#      for each case in MHA_AT_CASES ("B,L,E,H,dtype,core ...", core default sdpa_auto), HFNN_GEMM_AUTOTUNE=0 then
#      $MHA_AT_N, the second with HFNN_GEMM_LOG=1 (each GEMM's candidates and their times;
#      MHA_AT_CASES= runs none);
#   2. with MHA_AT_BENCH=1, bench/mha.py on MHA_AT_BENCH_CONFIG ("B L E H", default config 0) in
#      MHA_AT_BENCH_DTYPES (bf16) once a process for each setting of MHA_AT_BENCH_SETTINGS (default
#      "0 N": wall and graph time per call against torch's module), each with HFNN_GEMM_LOG=1.
# Before them, with MHA_AT_TESTS=1, the attention and LSTM Python tests under HFNN_GEMM_AUTOTUNE=N;
# with LN_TESTS_K set, the LayerNorm width test's cases it selects (LN_TEST_VARIANTS applies).
# Needs bench/experiments/gemm_autotune.patch (not kept: bench/README.md, "Config 0's wall time on an
# H200"): git apply it, then build here: bash scripts/device_wheel.sh (carry .devbuild without the test
# binary's gz). Without the patch HFNN_GEMM_AUTOTUNE does nothing and both settings measure the same.
cd "$(dirname "$0")/../.."
source bench/experiments/device_start.sh
if [[ -n "${LN_TESTS_K:-}" ]]; then
  timeout ${LN_TESTS_TIMEOUT:-200} python3 -m pytest tests/python/test_layer_norm_widths.py -q -p no:cacheprovider \
    -k "$LN_TESTS_K" 2>&1 | tail -6
fi
n=${MHA_AT_N:-8}
if [[ "${MHA_AT_TESTS:-0}" == 1 ]]; then  # the attention and LSTM tests with every GEMM's algorithm timed
  HFNN_GEMM_AUTOTUNE=$n timeout ${MHA_AT_TESTS_TIMEOUT:-240} python3 -m pytest tests/python/test_attention.py \
    tests/python/test_attention_mid.py tests/python/test_attention_short.py tests/python/test_attention_masks.py \
    tests/python/test_lstm.py -q -p no:cacheprovider -x 2>&1 | tail -6
fi
for case in ${MHA_AT_CASES-"200,256,1024,16,bfloat16,hfnn_mid"}; do
  IFS=, read -r b l e h dtype core <<< "$case"
  core=${core:-sdpa_auto}
  calls=50 timed=300
  [[ "$dtype" == float32 ]] && calls=10 timed=60
  for at in 0 "$n"; do
    log="$OUT/kernels-$b-$l-$e-$h-$dtype-at$at.log"
    if [[ "$at" == 0 ]]; then
      HFNN_GEMM_AUTOTUNE=0 timeout 120 python3 bench/mha_cpu.py --config $b $l $e $h --dtype $dtype --core "$core" \
        --kernels --calls $calls --timed-calls $timed --top 12 > "$log" 2>&1
    else
      HFNN_GEMM_LOG=1 HFNN_GEMM_AUTOTUNE=$at timeout 120 python3 bench/mha_cpu.py --config $b $l $e $h --dtype $dtype \
        --core "$core" --kernels --calls $calls --timed-calls $timed --top 12 > "$log" 2>&1
    fi
    echo "== $case autotune=$at (rc $?)"
    grep -E "forward \+ backward|GPU kernels of|GPU timeline" "$log"
  done
done
if [[ "${MHA_AT_BENCH:-0}" == 1 ]]; then
  i=0
  for at in ${MHA_AT_BENCH_SETTINGS:-0 $n}; do
    i=$((i + 1))
    HFNN_GEMM_LOG=1 HFNN_GEMM_AUTOTUNE=$at timeout ${MHA_AT_BENCH_TIMEOUT:-150} python3 bench/mha.py \
      --config ${MHA_AT_BENCH_CONFIG:-200 256 1024 16} --dtypes ${MHA_AT_BENCH_DTYPES:-bfloat16} --need-weights false \
      --no-dispatch --out "$OUT/mha-$i-at$at.json" > "$OUT/mha-$i-at$at.log" 2>&1
    echo "== bench/mha.py, process $i, autotune=$at (rc $?)"
    grep -E " torch  | hfnn_mid|-> hfnn|sdpa_cudnn|picked" "$OUT/mha-$i-at$at.log"
  done
fi
tar czf "$OUT/autotune.tgz" -C "$OUT" $(cd "$OUT" && ls *.log *.json 2>/dev/null | grep -v install) && echo "wrote $OUT/autotune.tgz"
