#!/usr/bin/env bash
# One device call for the flat variants' tile size (kernels/layer_norm/layer_norm_flat.cu with
# bench/experiments/layer_norm_flat_bwd.patch, whose HFNN_LN_FLAT_TILE sets a tensor's tile bytes): fwd_flat_* and bwd_flat_* at
# 2, 4, 8 and 16 KB tiles, at 32, 33, 64, 127, 255 and 512 columns, three dtypes, 16M and 1M
# elements, fwd_regs_tpr8 and bwd_regs_tpr8 (untouched) as the control; each record's `build` says
# its tile. Build first, here: git apply bench/experiments/layer_norm_flat_bwd.patch && bash
# scripts/device_wheel.sh (carry .devbuild), then on the device
#   bash bench/experiments/ln_flat_tile_run.sh
cd "$(dirname "$0")/../.."
source bench/experiments/device_start.sh
for tile in ${TILES:-2048 4096 8192 16384}; do
  HFNN_LN_FLAT_TILE=$tile timeout ${SWEEP_TIMEOUT:-100} python3 bench/layer_norm_sweep.py --out "$OUT/tile$tile.json" \
    --candidates variants --variants 'fwd_flat_*' 'bwd_flat_*' fwd_regs_tpr8 bwd_regs_tpr8 --sizes 16M 1M \
    --widths 32 33 64 127 255 512 > "$OUT/tile$tile.log" 2>&1 || echo "sweep $tile failed: $(tail -3 "$OUT/tile$tile.log")"
  python3 - "$OUT/tile$tile.json" "$tile" <<'PY'
import json, sys
path, tile = sys.argv[1], sys.argv[2]
records = json.load(open(path))
for r in records:
    r["build"] = f"HFNN_LN_FLAT_TILE={tile}"
with open(path, "w") as f:
    f.write("[\n" + ",\n".join(json.dumps(r, separators=(",", ":")) for r in records) + "\n]\n")
PY
done
grep -h wrote "$OUT"/tile*.log
