#!/usr/bin/env bash
# LayerNorm variants swept again after a change (LN_REFRESH_VARIANTS, globs) at every width of the
# sweep where they run (LN_REFRESH_WIDTHS: others, e.g. "sweep 63 257": the committed sweep keeps
# 63 and 257 though they are not among the sweep's own), LN_REFRESH_DTYPES, LN_REFRESH_SIZES (16M,
# 1M and 64K elements where unset), merged into the committed sweep, and the built-in choice's data
# made from it and checked (defaults-refresh: its files under OUT, "refresh" in their names). With
# LN_REFRESH_NCU (variant:dtype:ROWSxD ...), Nsight Compute on those cases after (ln_ncu_lines.sh:
# one line a case, also in OUT/ncu-lines.txt). Build first, here: bash scripts/device_wheel.sh
# (carry .devbuild). The twenty-fourth session's:
#   LN_REFRESH_VARIANTS="fwd_flat_*" LN_REFRESH_NCU="fwd_flat_tpr16:bfloat16:132104x127
#     fwd_flat_tpr4:bfloat16:508400x33 fwd_flat_tpr8:bfloat16:266305x63" bash bench/experiments/ln_variants_refresh_run.sh
#   (then LN_REFRESH_WIDTHS="63 257" with the first call's merged sweep committed here)
#   LN_REFRESH_VARIANTS="bwd_regs_*" LN_REFRESH_DTYPES="bfloat16 float16" LN_REFRESH_WIDTHS="sweep 63 257" \
#     bash bench/experiments/ln_variants_refresh_run.sh
# (Those ran as ln_flat_lanes_refresh_run.sh and ln_regs_exact_refresh_run.sh of 778f495 and b68b220,
# since merged into this one.)
# Then here: cp OUT/layer_norm_sweep-refresh-h100.json bench/results/layer_norm_sweep-h100.json,
# OUT/layer_norm_defaults-refresh.json src/layer_norm_defaults.json (python3 bench/layer_norm_sweep.py
# --defaults of the same files writes the same bytes), OUT/layer_norm_default-refresh-h100.json
# bench/results/layer_norm_default-h100.json.
cd "$(dirname "$0")/../.."
[[ -n "${LN_REFRESH_VARIANTS:-}" ]] || { echo "ln_variants_refresh_run.sh: set LN_REFRESH_VARIANTS (globs of variant names)"; exit 2; }
source bench/experiments/device_start.sh
set -f  # the variants are globs for the sweep, not for the shell
patterns=($LN_REFRESH_VARIANTS)
set +f
timeout ${SWEEP_TIMEOUT:-150} python3 bench/layer_norm_sweep.py --out "$OUT/refresh_part.json" --candidates variants \
  --variants "${patterns[@]}" --dtypes ${LN_REFRESH_DTYPES:-float32 bfloat16 float16} \
  --sizes ${LN_REFRESH_SIZES:-16M 1M 64K} --widths ${LN_REFRESH_WIDTHS:-sweep} \
  > "$OUT/refresh_part.log" 2>&1 || { echo "sweep failed: $(tail -5 "$OUT/refresh_part.log")"; exit 1; }
grep -E "FAILED|wrote" "$OUT/refresh_part.log" | head
# Only the variants' records (the sweep adds its references).
python3 - "$OUT/refresh_part.json" "${patterns[@]}" <<'PY'
import fnmatch, json, sys
path, patterns = sys.argv[1], sys.argv[2:]
records = [r for r in json.load(open(path)) if any(fnmatch.fnmatch(r["candidate"], p) for p in patterns)]
with open(path.replace(".json", "-variants.json"), "w") as f:
    f.write("[\n" + ",\n".join(json.dumps(r, separators=(",", ":")) for r in records) + "\n]\n")
PY
REFRESH_PARTS="$OUT/refresh_part-variants.json" SWEEP_TIMEOUT=${REFRESH_TIMEOUT:-280} \
  bash scripts/device_run.sh defaults-refresh 2>&1 | tail -4
refresh_rc=${PIPESTATUS[0]}
[[ "$refresh_rc" == 0 ]] || echo "defaults-refresh failed (exit $refresh_rc): see its lines above"
[[ -n "${LN_REFRESH_NCU:-}" ]] || exit "$refresh_rc"
LN_NCU_CASES="$LN_REFRESH_NCU" OUT="$OUT" bash bench/experiments/ln_ncu_lines.sh
exit "$refresh_rc"
