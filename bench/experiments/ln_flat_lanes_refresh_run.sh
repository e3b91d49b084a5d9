#!/usr/bin/env bash
# The flat forward with a lane's elements instantiated at every count (ln_flat_lanes_run.sh: the
# width test and the A/B) swept at every width of the sweep where it runs, three dtypes, 16M, 1M
# and 64K elements, merged into the committed sweep, and the built-in choice's data made from it
# and checked (defaults-refresh: its files under OUT, "refresh" in their names); then Nsight
# Compute on two of its kernels (stall reasons, instructions, throughput: one line a case).
# Build first, here: bash scripts/device_wheel.sh (carry .devbuild), then on the device
#   bash bench/experiments/ln_flat_lanes_refresh_run.sh
# FLAT_WIDTHS: other widths than the sweep's (--widths; the committed sweep's 63 and 257 are not
# among the sweep's own, and took a second call with the first call's merged sweep committed here);
# FLAT_NCU=0: no Nsight Compute.
# Then here: cp OUT/layer_norm_sweep-refresh-h100.json bench/results/layer_norm_sweep-h100.json,
# OUT/layer_norm_defaults-refresh.json src/layer_norm_defaults.json (python3 bench/layer_norm_sweep.py
# --defaults of the same files writes the same bytes), OUT/layer_norm_default-refresh-h100.json
# bench/results/layer_norm_default-h100.json.
cd "$(dirname "$0")/../.."
source bench/experiments/device_start.sh
timeout ${SWEEP_TIMEOUT:-150} python3 bench/layer_norm_sweep.py --out "$OUT/flat_fwd.json" --candidates variants \
  --variants 'fwd_flat_*' --widths ${FLAT_WIDTHS:-sweep} > "$OUT/flat_fwd.log" 2>&1 \
  || { echo "sweep failed: $(tail -5 "$OUT/flat_fwd.log")"; exit 1; }
grep -E "FAILED|wrote" "$OUT/flat_fwd.log" | head
python3 - "$OUT/flat_fwd.json" <<'PY'
import json, sys
path = sys.argv[1]
records = [r for r in json.load(open(path)) if r["candidate"].startswith("fwd_flat_")]
with open(path.replace(".json", "-part.json"), "w") as f:
    f.write("[\n" + ",\n".join(json.dumps(r, separators=(",", ":")) for r in records) + "\n]\n")
PY
REFRESH_PARTS="$OUT/flat_fwd-part.json" SWEEP_TIMEOUT=${REFRESH_TIMEOUT:-280} \
  bash scripts/device_run.sh defaults-refresh 2>&1 | tail -4
[[ "${FLAT_NCU:-1}" == 1 ]] || exit 0
m=gpu__time_duration.sum,smsp__inst_executed.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,smsp__issue_active.avg.pct_of_peak_sustained_elapsed,smsp__warps_active.avg.per_cycle_active,smsp__warps_eligible.avg.per_cycle_active,smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio,smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio,smsp__average_warps_issue_stalled_short_scoreboard_per_issue_active.ratio,smsp__average_warps_issue_stalled_mio_throttle_per_issue_active.ratio,smsp__average_warps_issue_stalled_lg_throttle_per_issue_active.ratio,smsp__average_warps_issue_stalled_wait_per_issue_active.ratio,smsp__average_warps_issue_stalled_math_pipe_throttle_per_issue_active.ratio,smsp__average_warps_issue_stalled_not_selected_per_issue_active.ratio,smsp__average_warps_issue_stalled_selected_per_issue_active.ratio,launch__registers_per_thread,launch__occupancy_limit_registers,launch__occupancy_limit_shared_mem,launch__grid_size
for case in fwd_flat_tpr16:bfloat16:132104x127 fwd_flat_tpr4:bfloat16:508400x33 fwd_flat_tpr8:bfloat16:266305x63; do
  IFS=: read -r variant dtype shape <<< "$case"
  ncu --clock-control none -k regex:flat_kernel --launch-skip 6 --launch-count 1 --metrics $m \
    python3 bench/profile_variant.py --shape ${shape/x/ } --dtype $dtype --variant $variant --runs 8 2>&1 \
    | grep -E "^ +[a-z_]+__|launch__" | awk '{print $1, $(NF)}' > "$OUT/ncu-$variant.txt"
  echo "== $case $(tr '\n' ' ' < "$OUT/ncu-$variant.txt")"
done
