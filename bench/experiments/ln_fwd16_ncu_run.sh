#!/usr/bin/env bash
# Nsight Compute on the 16-bit LayerNorm forward where it is under 80% of copy (H100 sweep, 16M
# elements): narrow odd widths (flat tiles, row registers), odd wide ones (windows), and the widest
# rows split over clusters, with an aligned control of each kind. One line of metric/value pairs a
# case: stall reasons an issued instruction, instructions, throughputs, DRAM bytes, registers.
# With H200_BENCH=1 on an H200 it runs the issues' H200 benchmarks instead (device_start.sh).
#   bash bench/experiments/ln_fwd16_ncu_run.sh            (on the device, from the repository root)
#   LN_NCU_CASES="variant:dtype:ROWSxD ..." for other cases; every case's line also in OUT/ncu-lines.txt
#   (the loop: bench/experiments/ln_ncu_lines.sh)
# (the first run's printed tail lost its first cases: results/layer_norm_fwd16_ncu-h100.json)
cd "$(dirname "$0")/../.."
source bench/experiments/device_start.sh
LN_NCU_CASES=${LN_NCU_CASES:-"fwd_regs_tpr4:bfloat16:524288x32 fwd_flat_tpr4:bfloat16:508400x33 fwd_regs_tpr16:bfloat16:266305x63 fwd_flat_tpr16:bfloat16:266305x63 fwd_win_tpr32:bfloat16:16400x1023 fwd_wide_c1:bfloat16:4096x4096 fwd_wide_win_c1:bfloat16:4095x4097 fwd_wide_c8_ps:bfloat16:1365x12288 fwd_wide_c16_ps:bfloat16:512x32768 fwd_wide_c4_ps:bfloat16:341x49152 fwd_wide_c8_ps:bfloat16:2048x8192"} OUT="$OUT" bash bench/experiments/ln_ncu_lines.sh
