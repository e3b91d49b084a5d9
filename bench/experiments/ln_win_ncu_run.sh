#!/usr/bin/env bash
# Nsight Compute (device_run.sh's ncu stage: occupancy, grid, registers, warp states, DRAM) on the
# window kernels at 4,097 bf16 columns beside the aligned ones at 4,096, 16M elements: where rows not
# 16-byte aligned lose 1.5-1.7x. Needs the build of bench/experiments/layer_norm_win_once_pair.patch
# (HFNN_LN_WIN_PAIR: 0 the window backward's own kernel, 1 the two-rows kernel through windows).
# Build first, here: bash scripts/device_wheel.sh (carry .devbuild). Logs in OUT/ncu_logs.tgz.
cd "$(dirname "$0")/../.."
source bench/experiments/device_start.sh > /dev/null
export NCU_KERNELS='wide|reduce_partials'
HFNN_LN_WIN_PAIR=0 NCU_CASES="bwd_wide_win_c2_smem:bfloat16:4095x4097 bwd_wide_c2_smem:bfloat16:4096x4096 fwd_wide_win_c1:bfloat16:4095x4097 fwd_wide_c1_ps:bfloat16:4096x4096 fwd_wide_win_c1_direct:bfloat16:4095x4097 fwd_wide_c1:bfloat16:4096x4096" \
  bash scripts/device_run.sh ncu > "$OUT/ncu_own.txt" 2>&1
HFNN_LN_WIN_PAIR=1 NCU_CASES="bwd_wide_win_c2_smem:bfloat16:4095x4097" OUT="$OUT/pair" bash scripts/device_run.sh ncu \
  > "$OUT/ncu_pair.txt" 2>&1
cd "$OUT" && tar czf ncu_logs.tgz ncu-*.log pair ncu_own.txt ncu_pair.txt && rm -rf ncu-*.log pair
grep -E "^== |Duration|DRAM Throughput|Achieved Occupancy|Registers Per|Block Size|Grid Size|Eligible Warps|Issue Slots Busy" ncu_own.txt ncu_pair.txt | cut -c1-150
