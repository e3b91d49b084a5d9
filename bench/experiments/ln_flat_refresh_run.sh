#!/usr/bin/env bash
# One device call: the flat forward (fwd_flat_tpr*, kernels/layer_norm/layer_norm_flat.cu) and
# bwd_wide_win_c16_smem (its sum slots strided by its own block) swept at every width of the sweep
# where they run, three dtypes, 16M, 1M and 64K elements (fwd_regs_tpr8 and fwd_win_tpr8 as the
# control, not merged), then merged into the committed sweep, and the built-in choice's data made
# from it and checked (defaults-refresh: its files under OUT, "refresh" in their names). In the
# eighteenth session bwd_wide_win_c16_smem's records came from ln_flat_run.sh's call instead.
# Build first, here: bash scripts/device_wheel.sh (carry .devbuild), then on the device
#   bash bench/experiments/ln_flat_refresh_run.sh
cd "$(dirname "$0")/../.."
source bench/experiments/device_start.sh
timeout ${SWEEP_TIMEOUT:-150} python3 bench/layer_norm_sweep.py --out "$OUT/flat_fwd.json" --candidates variants \
  --variants 'fwd_flat_*' bwd_wide_win_c16_smem fwd_regs_tpr8 fwd_win_tpr8 --widths sweep > "$OUT/flat_fwd.log" 2>&1 \
  || { echo "sweep failed: $(tail -5 "$OUT/flat_fwd.log")"; exit 1; }
grep -E "FAILED|wrote" "$OUT/flat_fwd.log" | head
python3 - "$OUT/flat_fwd.json" <<'PY'
import json, sys
path = sys.argv[1]
records = [r for r in json.load(open(path))
           if r["candidate"].startswith("fwd_flat_") or r["candidate"] == "bwd_wide_win_c16_smem"]
with open(path.replace(".json", "-part.json"), "w") as f:
    f.write("[\n" + ",\n".join(json.dumps(r, separators=(",", ":")) for r in records) + "\n]\n")
PY
REFRESH_PARTS="$OUT/flat_fwd-part.json" SWEEP_TIMEOUT=${REFRESH_TIMEOUT:-280} \
  bash scripts/device_run.sh defaults-refresh 2>&1 | tail -4
