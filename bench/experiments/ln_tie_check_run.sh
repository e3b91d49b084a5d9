#!/usr/bin/env bash
# The built-in choice's data as this tree writes it (src/layer_norm_defaults.json: ties settled by
# the neighbouring widths, bench/layer_norm_sweep.py's tie_order) checked on the GPU before a build
# compiles it in, through HFNN_LAYER_NORM_DEFAULTS: torch and the built-in choice at the sweep's
# widths and between them, 16M, 1M and 64K elements, three dtypes (OUT/layer_norm_default-tie-GPU.json).
# Then the GPU tests: the width tests of the variants in LN_TEST_VARIANTS (default: all),
# test_layer_norm.py and the C++ LayerNorm tests. One device call, about 430 s on an H200.
# test_dispatch.py takes about 320 s there (2026-11-29): a call of its own.
# Build first, here: bash scripts/device_wheel.sh (carry .devbuild). The thirty-sixth session's:
#   LN_TEST_VARIANTS='bwd_wide_c*_smem' bash bench/experiments/ln_tie_check_run.sh
# Then here: python3 bench/layer_norm_sweep.py --summarize bench/results/layer_norm_sweep-h200.json OUT/layer_norm_default-tie-h200.json
cd "$(dirname "$0")/../.."
source bench/experiments/device_start.sh
tag=$(echo "$gpu" | grep -oE "H[0-9]+" | tr A-Z a-z)
HFNN_LAYER_NORM_DEFAULTS=$(pwd)/src/layer_norm_defaults.json timeout ${CHECK_TIMEOUT:-290} python3 -X faulthandler \
  bench/layer_norm_sweep.py --out "$OUT/layer_norm_default-tie-$tag.json" --candidates torch default \
  --widths sweep between > "$OUT/default-check.log" 2>&1 || echo "default-check: exit $? (its log: default-check.log)"
grep -E "FAILED|wrote" "$OUT/default-check.log" | tail -3
timeout ${WIDTH_TIMEOUT:-110} python3 -m pytest tests/python/test_layer_norm_widths.py -q -p no:cacheprovider \
  -k "unaligned or 1-275 or 276-550 or 551-825 or 826-1100 or wide or row_count" 2>&1 | tail -4
timeout ${PYTEST_TIMEOUT:-100} python3 -m pytest tests/python/test_layer_norm.py -q -p no:cacheprovider 2>&1 | tail -4
GTEST_FILTER='*LayerNorm*' GTEST_TIMEOUT=${GTEST_TIMEOUT:-60} bash scripts/device_run.sh gtest 2>&1 | grep -E "PASSED|FAILED" | tail -5
