#!/usr/bin/env bash
# The row-register backward with exactly the accesses that cover a 16-bit row in accesses under 16
# bytes (ln_regs_exact_run.sh: the width test and the A/B, the forward's part since reverted) swept
# at every width of the sweep where it runs, bf16 and fp16 (float32 and 16-byte rows run the same
# kernels as before), 16M, 1M and 64K elements, merged into the committed sweep, and the built-in
# choice's data made from it and checked (defaults-refresh: its files under OUT, "refresh" in their
# names). Build first, here: bash scripts/device_wheel.sh (carry .devbuild), then on the device
#   bash bench/experiments/ln_regs_exact_refresh_run.sh
# Then here: cp OUT/layer_norm_sweep-refresh-h100.json bench/results/layer_norm_sweep-h100.json,
# OUT/layer_norm_defaults-refresh.json src/layer_norm_defaults.json (python3 bench/layer_norm_sweep.py
# --defaults of the same files writes the same bytes), OUT/layer_norm_default-refresh-h100.json
# bench/results/layer_norm_default-h100.json.
cd "$(dirname "$0")/../.."
source bench/experiments/device_start.sh
timeout ${SWEEP_TIMEOUT:-150} python3 bench/layer_norm_sweep.py --out "$OUT/regs_bwd.json" --candidates variants \
  --variants 'bwd_regs_*' --dtypes bfloat16 float16 --widths sweep 63 257 > "$OUT/regs_bwd.log" 2>&1 \
  || { echo "sweep failed: $(tail -5 "$OUT/regs_bwd.log")"; exit 1; }
grep -E "FAILED|wrote" "$OUT/regs_bwd.log" | head
python3 - "$OUT/regs_bwd.json" <<'PY'
import json, sys
path = sys.argv[1]
records = [r for r in json.load(open(path)) if r["candidate"].startswith("bwd_regs_")]
with open(path.replace(".json", "-part.json"), "w") as f:
    f.write("[\n" + ",\n".join(json.dumps(r, separators=(",", ":")) for r in records) + "\n]\n")
PY
REFRESH_PARTS="$OUT/regs_bwd-part.json" SWEEP_TIMEOUT=${REFRESH_TIMEOUT:-280} \
  bash scripts/device_run.sh defaults-refresh 2>&1 | tail -4
