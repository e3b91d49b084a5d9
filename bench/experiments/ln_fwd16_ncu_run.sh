#!/usr/bin/env bash
# Nsight Compute on the 16-bit LayerNorm forward where it is under 80% of copy (H100 sweep, 16M
# elements): narrow odd widths (flat tiles, row registers), odd wide ones (windows), and the widest
# rows split over clusters, with an aligned control of each kind. One line of metric/value pairs a
# case: stall reasons an issued instruction, instructions, throughputs, DRAM bytes, registers.
# With H200_BENCH=1 on an H200 it runs the issues' H200 benchmarks instead (device_start.sh).
#   bash bench/experiments/ln_fwd16_ncu_run.sh            (on the device, from the repository root)
#   LN_NCU_CASES="variant:dtype:ROWSxD ..." for other cases; every case's line also in OUT/ncu-lines.txt
# (the first run's printed tail lost its first cases: results/layer_norm_fwd16_ncu-h100.json)
cd "$(dirname "$0")/../.."
source bench/experiments/device_start.sh
m=gpu__time_duration.sum,smsp__inst_executed.sum,dram__bytes_read.sum,dram__bytes_write.sum,l1tex__data_pipe_lsu_wavefronts_mem_shared.sum,l1tex__throughput.avg.pct_of_peak_sustained_elapsed,dram__throughput.avg.pct_of_peak_sustained_elapsed,smsp__issue_active.avg.pct_of_peak_sustained_elapsed,smsp__warps_active.avg.per_cycle_active,smsp__warps_eligible.avg.per_cycle_active,smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio,smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio,smsp__average_warps_issue_stalled_short_scoreboard_per_issue_active.ratio,smsp__average_warps_issue_stalled_mio_throttle_per_issue_active.ratio,smsp__average_warps_issue_stalled_lg_throttle_per_issue_active.ratio,smsp__average_warps_issue_stalled_membar_per_issue_active.ratio,smsp__average_warps_issue_stalled_wait_per_issue_active.ratio,smsp__average_warps_issue_stalled_math_pipe_throttle_per_issue_active.ratio,smsp__average_warps_issue_stalled_drain_per_issue_active.ratio,smsp__average_warps_issue_stalled_misc_per_issue_active.ratio,smsp__average_warps_issue_stalled_no_instruction_per_issue_active.ratio,smsp__average_warps_issue_stalled_selected_per_issue_active.ratio,smsp__average_warps_issue_stalled_not_selected_per_issue_active.ratio,smsp__average_warps_issue_stalled_sleeping_per_issue_active.ratio,launch__registers_per_thread,launch__occupancy_limit_registers,launch__occupancy_limit_shared_mem,launch__occupancy_limit_warps,sm__maximum_warps_per_active_cycle_pct,launch__grid_size,launch__block_size,launch__cluster_size
cases=${LN_NCU_CASES:-"fwd_regs_tpr4:bfloat16:524288x32 fwd_flat_tpr4:bfloat16:508400x33 fwd_regs_tpr16:bfloat16:266305x63 fwd_flat_tpr16:bfloat16:266305x63 fwd_win_tpr32:bfloat16:16400x1023 fwd_wide_c1:bfloat16:4096x4096 fwd_wide_win_c1:bfloat16:4095x4097 fwd_wide_c8_ps:bfloat16:1365x12288 fwd_wide_c16_ps:bfloat16:512x32768 fwd_wide_c4_ps:bfloat16:341x49152 fwd_wide_c8_ps:bfloat16:2048x8192"}
for case in $cases; do
  IFS=: read -r variant dtype shape <<< "$case"
  echo "== $case"
  ncu --clock-control none -k regex:"fwd_|_kernel" --launch-skip 6 --launch-count 1 --metrics $m \
    python3 bench/profile_variant.py --shape ${shape/x/ } --dtype $dtype --variant $variant --runs 8 2>&1 \
    | grep -E "^ +[a-z_]+__|launch__|^  [a-zA-Z_]" | awk '{print $1, $(NF)}' > "$OUT/n.txt"
  echo "$case $(tr '\n' ' ' < "$OUT/n.txt")" >> "$OUT/ncu-lines.txt"
  tr '\n' ' ' < "$OUT/n.txt"; echo
done
