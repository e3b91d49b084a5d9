#!/usr/bin/env bash
# hfnn_mid on the GPU (issue 11, nineteenth session): cuDNN's log-sum-exp as the backward reads it,
# the core's tests (tests/python/test_attention_mid.py, then every core of test_attention.py's
# sweep), where a call's GPU time goes with cuDNN's backward and with hfnn's, then bench/mha.py on
# config 0 (and MID_CONFIGS more). Run from the repository root with .devbuild carried:
#   bash bench/experiments/mha_mid_run.sh
# MID_TESTS: a pytest -k selection of the core's tests (default: all); MID_NCU=1: Nsight Compute on
# the backward kernel at config 0; MID_SWEEP=1: test_attention.py's every-core sweeps too.
source bench/experiments/device_start.sh
status=0
python3 - > "$OUT/lse.log" 2>&1 <<'PY'
import torch
torch.manual_seed(0)
q, k, v = (torch.randn(2, 4, 256, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
t = torch.ops.aten._scaled_dot_product_cudnn_attention(q, k, v, None, True, 0.0, False, False)
lse = t[1]
ref = torch.logsumexp((q.float() @ k.float().transpose(-1, -2)) / 8.0, -1)
got = lse.reshape(ref.shape) if lse.numel() == ref.numel() else lse
print("lse", tuple(lse.shape), lse.stride(), lse.dtype)
print("natural-log error", (got - ref).abs().max().item(), "base-2 error", (got - ref * 1.4426950408889634).abs().max().item())
PY
cat "$OUT/lse.log"
timeout ${MID_TEST_TIMEOUT:-240} python3 -m pytest tests/python/test_attention_mid.py -v -p no:cacheprovider --durations=5 \
  -k "${MID_TESTS:-gpu}" -o faulthandler_timeout=150 2>&1 | tee "$OUT/pytest-mid.log" | tail -25
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1
python3 bench/mha_core_case.py --config 200 256 1024 16 --cores sdpa_cudnn hfnn_mid --kernels --iters 3 2>&1 \
  | tee "$OUT/mid-core.log" | head -60
timeout ${MID_BENCH_TIMEOUT:-150} python3 bench/mha.py --configs 0 ${MID_CONFIGS:-} --dtypes bfloat16 \
  --need-weights false --no-dispatch --out "$OUT/mha-mid.json" 2>&1 | tee "$OUT/mha-mid.log" | tail -30
if [[ -n "${MID_NCU:-}" ]]; then  # Nsight Compute on the backward kernel of the second call
  MHA_NCU_CONFIG="200 256 1024 16" MHA_NCU_CORE=hfnn_mid MHA_NCU_KERNELS=mid_bwd MHA_NCU_SKIP=1 MHA_NCU_COUNT=1 \
    bash scripts/device_run.sh ncu-mha 2>&1 | tail -70 || status=1
fi
if [[ -n "${MID_STALLS:-}" ]]; then  # where the backward kernel's warps wait (per issued instruction), and its hot lines
  ncu --clock-control none -k regex:mid_bwd --launch-skip 1 --launch-count 1 --import-source yes \
    --section WarpStateStats --section SourceCounters --section InstructionStats \
    --metrics regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio \
    python3 bench/mha_core_case.py --config 200 256 1024 16 --cores hfnn_mid --iters 1 > "$OUT/ncu-stalls.log" 2>&1
  grep -E "stalled|Stall|stall|Executed Instructions|Source|mid_attention" "$OUT/ncu-stalls.log" | grep -v "^==" | head -80
fi
if [[ -n "${MID_SWEEP:-}" ]]; then
  timeout 200 python3 -m pytest tests/python/test_attention.py -p no:cacheprovider -q -k "every_core or batch_shapes" \
    -o faulthandler_timeout=150 2>&1 | tee "$OUT/pytest-attention.log" | tail -15; [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
fi
exit $status
