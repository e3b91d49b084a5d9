#!/usr/bin/env bash
# Nsight Compute on LayerNorm variants, one line of metric/value pairs a case (stall reasons an
# issued instruction, instructions, throughputs, DRAM bytes, registers, launch shape), printed and
# appended to $OUT/ncu-lines.txt. The variant's main kernel of its 7th call (launches of hfnn's
# fwd_/bwd_ kernels after six, clocks unlocked). Run by ln_fwd16_ncu_run.sh and
# ln_variants_refresh_run.sh after they have installed hfnn (device_start.sh):
#   LN_NCU_CASES="variant:dtype:ROWSxD ..." OUT=DIR bash bench/experiments/ln_ncu_lines.sh
cd "$(dirname "$0")/../.."
set -uo pipefail
: "${LN_NCU_CASES:?set LN_NCU_CASES (variant:dtype:ROWSxD ...)}" "${OUT:?set OUT}"
m=gpu__time_duration.sum,smsp__inst_executed.sum,dram__bytes_read.sum,dram__bytes_write.sum,l1tex__data_pipe_lsu_wavefronts_mem_shared.sum,l1tex__throughput.avg.pct_of_peak_sustained_elapsed,dram__throughput.avg.pct_of_peak_sustained_elapsed,smsp__issue_active.avg.pct_of_peak_sustained_elapsed,smsp__warps_active.avg.per_cycle_active,smsp__warps_eligible.avg.per_cycle_active,smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio,smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio,smsp__average_warps_issue_stalled_short_scoreboard_per_issue_active.ratio,smsp__average_warps_issue_stalled_mio_throttle_per_issue_active.ratio,smsp__average_warps_issue_stalled_lg_throttle_per_issue_active.ratio,smsp__average_warps_issue_stalled_membar_per_issue_active.ratio,smsp__average_warps_issue_stalled_wait_per_issue_active.ratio,smsp__average_warps_issue_stalled_math_pipe_throttle_per_issue_active.ratio,smsp__average_warps_issue_stalled_drain_per_issue_active.ratio,smsp__average_warps_issue_stalled_misc_per_issue_active.ratio,smsp__average_warps_issue_stalled_no_instruction_per_issue_active.ratio,smsp__average_warps_issue_stalled_selected_per_issue_active.ratio,smsp__average_warps_issue_stalled_not_selected_per_issue_active.ratio,smsp__average_warps_issue_stalled_sleeping_per_issue_active.ratio,launch__registers_per_thread,launch__occupancy_limit_registers,launch__occupancy_limit_shared_mem,launch__occupancy_limit_warps,sm__maximum_warps_per_active_cycle_pct,launch__grid_size,launch__block_size,launch__cluster_size
for case in $LN_NCU_CASES; do
  IFS=: read -r variant dtype shape <<< "$case"
  ncu --clock-control none -k regex:"(fwd|bwd)_" --launch-skip 6 --launch-count 1 --metrics $m \
    python3 bench/profile_variant.py --shape ${shape/x/ } --dtype $dtype --variant $variant --runs 8 2>&1 \
    | grep -E "^ +[a-z_]+__|launch__" | awk '{print $1, $(NF)}' > "$OUT/n.txt"
  echo "$case $(tr '\n' ' ' < "$OUT/n.txt")" | tee -a "$OUT/ncu-lines.txt"
done
