#!/usr/bin/env bash
# The thirty-second session's first H200 call: what the thirty-first prepared, in one call.
# Built here first, with both LayerNorm patches applied:
#   git apply bench/experiments/layer_norm_group_total_butterfly.patch
#   git apply bench/experiments/layer_norm_fwd_nv8.patch
#   bash scripts/device_wheel.sh --baseline        (carry .devbuild; move bench/results/layer_norm_*.json aside)
# 1. The butterfly block sums against HEAD (device_ab.sh: base new base2 new2): the wide variants
#    that win somewhere at 1M+ elements on the H200, ten widths, 16M elements, three dtypes -> $OUT/ab.tgz
# 2. The wide forward at 8 accesses a thread against 4, on the butterfly build (one library,
#    HFNN_LN_FWD_NV): the forward variants that win, 17 widths, 16M and 1M -> $OUT/nv8.tgz
# 3. The causal fewer-queries attention test over its 124 shapes x bf16/fp16.
# 4. mha_dispatch_cost.py, reversed order and with --profile 200 -> $OUT/dispatch_cost_rev.json
# Then here: tar xzf each; python3 bench/layer_norm_sweep.py --compare BASE.json NEW.json
cd "$(dirname "$0")/../.."
t0=$SECONDS
LN_AB_TESTS=0 LN_AB_TIMEOUT=${S32_AB_TIMEOUT:-80} \
LN_AB_VARIANTS="fwd_wide_c1 fwd_wide_c8_ps fwd_wide_c16_ps fwd_wide_win_c1 fwd_wide_c16 fwd_wide_c4_ps fwd_wide_c1_ps fwd_wide_c8 bwd_wide_c1_smem bwd_wide_c8_smem bwd_wide_c2_smem bwd_wide_c1_smem_cols bwd_wide_c16_smem bwd_wide_c4_smem bwd_wide_c8_smem_cols bwd_wide_win_c1_cols bwd_wide_c16_smem_cols" \
LN_AB_DTYPES="bfloat16 float16 float32" LN_AB_WIDTHS="1024 2048 4096 4097 8192 12288 12289 16384 32768 65536" \
  bash bench/experiments/ln_variants_ab_run.sh
OUT=${OUT:-/tmp/hfnn-out}
echo "== ab done at $((SECONDS - t0)) s"
mkdir -p "$OUT/nv8runs"
OUT="$OUT/nv8runs" NV8_TIMEOUT=${S32_NV8_TIMEOUT:-70} \
NV8_VARIANTS="fwd_wide_c1 fwd_wide_c8_ps fwd_wide_c16_ps fwd_wide_win_c1 fwd_wide_c16 fwd_wide_c4_ps fwd_wide_c1_ps fwd_wide_c8" \
  bash bench/experiments/ln_fwd_nv8_run.sh
tar czf "$OUT/nv8.tgz" -C "$OUT" nv8runs && rm -rf "$OUT/nv8runs"
echo "== nv8 done at $((SECONDS - t0)) s"
timeout ${S32_TEST_TIMEOUT:-150} python3 -m pytest tests/python/test_attention_mid.py -q -p no:cacheprovider -k fewer_queries 2>&1 | tail -4
echo "== attention test done at $((SECONDS - t0)) s"
timeout ${S32_COST_TIMEOUT:-150} python3 bench/experiments/mha_dispatch_cost.py --rounds 15 --reverse --profile 200 \
  --out "$OUT/dispatch_cost_rev.json" 2>&1 | tail -45
echo "== dispatch cost done at $((SECONDS - t0)) s"
