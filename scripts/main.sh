#!/usr/bin/env bash
# The main job on the bundled example, the three commands of hfnn in a row:
#   1. hfnn profile examples/evoformer.py     where the time goes, the LayerNorm shapes -> shapes.db
#   2. hfnn tune                              (GPU) torch against every hfnn kernel on those shapes
#   3. HFNN_DISPATCH_DB=shapes.db python ...  (GPU) the same training with the winners, against torch
# then the report as one HTML page (report.html). On a machine without CUDA the profile is the CPU
# path and steps 2 and 3 say why they are skipped. Options: --db FILE (default shapes.db), --steps N.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
db=shapes.db
steps=20
while [ $# -gt 0 ]; do
  case "$1" in
    --db) db="$2"; shift 2 ;;
    --steps) steps="$2"; shift 2 ;;
    -h|--help) sed -n '2,8p' "$0" | cut -c3-; exit 0 ;;
    *) echo "scripts/main.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done
example="$root/examples/evoformer.py"
command -v hfnn >/dev/null || { echo "scripts/main.sh: hfnn is not installed: run bash scripts/setup.sh" >&2; exit 1; }

echo "== 1/3 hfnn profile $example"
hfnn profile --db "$db" --warmup 3 --steps 10 "$example" --steps 10 --warmup 3

if python3 -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  echo "== 2/3 hfnn tune --db $db"
  hfnn tune --db "$db"
  echo "== 3/3 training: torch's kernels, then HFNN_DISPATCH_DB=$db"
  tmp=$(mktemp -d)
  python3 "$example" --steps "$steps" --json "$tmp/torch.json" | tail -n 1
  HFNN_DISPATCH_DB="$db" HFNN_VERBOSE=1 python3 "$example" --steps "$steps" --json "$tmp/hfnn.json" | tail -n 1
  python3 - "$tmp/torch.json" "$tmp/hfnn.json" <<'PY'
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:])
diff = max(abs(x - y) for x, y in zip(a["loss"], b["loss"]))
print(f"step time: torch {a['median_step_ms']:.2f} ms, hfnn {b['median_step_ms']:.2f} ms: "
      f"{a['median_step_ms'] / b['median_step_ms']:.3f}x; largest loss difference {diff:.2e}")
PY
  rm -rf "$tmp"
else
  echo "== 2/3, 3/3 skipped: no CUDA device here (hfnn tune measures kernels on the GPU they will run on)"
fi
hfnn report --db "$db" --format html -o report.html
echo "== report: $(pwd)/report.html (hfnn report --db $db for the text)"
