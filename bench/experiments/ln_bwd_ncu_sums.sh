#!/usr/bin/env bash
# Nsight Compute on the 16-bit LayerNorm backward with dgamma/dbeta and with dx alone
# (bench/profile_variant.py --dx-only): the wide cluster variants, the one-block wide one and the
# narrow row-register one, 16M elements; stall reasons an issued instruction, instructions,
# throughputs, registers. One line of metric/value pairs a case (results/layer_norm_bwd_ncu-h100.json).
#   bash bench/experiments/ln_bwd_ncu_sums.sh            (on the device, from the repository root)
cd "$(dirname "$0")/../.."
source bench/experiments/device_start.sh
m=gpu__time_duration.sum,smsp__inst_executed.sum,l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum,l1tex__data_pipe_lsu_wavefronts_mem_shared_op_st.sum,l1tex__throughput.avg.pct_of_peak_sustained_elapsed,l1tex__data_pipe_lsu_wavefronts_mem_shared.avg.pct_of_peak_sustained_elapsed,dram__throughput.avg.pct_of_peak_sustained_elapsed,smsp__issue_active.avg.pct_of_peak_sustained_elapsed,smsp__warps_active.avg.per_cycle_active,smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio,smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio,smsp__average_warps_issue_stalled_short_scoreboard_per_issue_active.ratio,smsp__average_warps_issue_stalled_mio_throttle_per_issue_active.ratio,smsp__average_warps_issue_stalled_lg_throttle_per_issue_active.ratio,smsp__average_warps_issue_stalled_membar_per_issue_active.ratio,smsp__average_warps_issue_stalled_wait_per_issue_active.ratio,smsp__average_warps_issue_stalled_math_pipe_throttle_per_issue_active.ratio,smsp__average_warps_issue_stalled_drain_per_issue_active.ratio,smsp__average_warps_issue_stalled_misc_per_issue_active.ratio,smsp__average_warps_issue_stalled_dispatch_stall_per_issue_active.ratio,smsp__average_warps_issue_stalled_no_instruction_per_issue_active.ratio,smsp__average_warps_issue_stalled_selected_per_issue_active.ratio,smsp__average_warps_issue_stalled_not_selected_per_issue_active.ratio,smsp__average_warps_issue_stalled_sleeping_per_issue_active.ratio,launch__registers_per_thread,launch__occupancy_limit_registers,launch__occupancy_limit_shared_mem,sm__maximum_warps_per_active_cycle_pct,launch__grid_size,launch__block_size
for case in bwd_wide_c16_smem:bfloat16:256x65536 bwd_wide_c8_smem:bfloat16:1024x16384 bwd_wide_c1_smem:bfloat16:8192x2048 bwd_regs_tpr16:bfloat16:65536x256; do
  IFS=: read -r variant dtype shape <<< "$case"
  for dx in "" --dx-only; do
    echo "== $case $dx"
    ncu --clock-control none -k regex:"wide_kernel|regs_kernel" --launch-skip 6 --launch-count 1 --metrics $m \
      python3 bench/profile_variant.py --shape ${shape/x/ } --dtype $dtype --variant $variant --runs 8 $dx 2>&1 | grep -E "^ +[a-z_]+__|launch__" | awk '{print $1, $(NF)}' > $OUT/n.txt
    cat $OUT/n.txt | tr '\n' ' ' ; echo
  done
done
