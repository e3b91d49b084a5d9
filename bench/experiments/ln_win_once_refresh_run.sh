#!/usr/bin/env bash
# The one-block and small-cluster window forward (fwd_wide_win_c1, c2 and c4 _direct) on the one-pass
# kernel (fwd_once_body's kWin), one call (H200): HEAD's library against this build's at 1M and 64K
# elements, where those variants are the fastest forward at several widths not 16-byte aligned
# (device_ab.sh: base, new; OUT/ab.tgz), then the three swept again at every width, size and dtype,
# merged and the built-in choice's data made and checked (ln_variants_refresh_run.sh). The 16M A/B
# ran in an earlier call (bench/experiments/ln_variants_ab_run.sh).
# Build first, here: bash scripts/device_wheel.sh --baseline (carry .devbuild).
cd "$(dirname "$0")/../.."
source bench/experiments/device_start.sh
AB_RUNS=${LN_AB_RUNS:-"base new"} AB_TIMEOUT=${LN_AB_TIMEOUT:-90} OUT="$OUT/ab" bash scripts/device_ab.sh \
  "python3 bench/layer_norm_sweep.py --out \$AB_OUT/ab.json --candidates variants --sizes 1M 64K --dtypes float32 bfloat16 float16 --widths 255 257 1023 1025 1500 1602 2041 4097 4100 6402 12289 12300 25602 32772 65538 --variants 'fwd_wide_win_c1_direct' 'fwd_wide_win_c2_direct' 'fwd_wide_win_c4_direct'" \
  | grep -E "device_ab|wrote|FAILED" | tail -6
tar czf "$OUT/ab.tgz" -C "$OUT" ab && rm -rf "$OUT/ab"
LN_REFRESH_VARIANTS="fwd_wide_win_c1_direct fwd_wide_win_c2_direct fwd_wide_win_c4_direct" \
  LN_REFRESH_WIDTHS="sweep 63 257 1025 2041" bash bench/experiments/ln_variants_refresh_run.sh
