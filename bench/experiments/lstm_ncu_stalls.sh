#!/usr/bin/env bash
# Nsight Compute's stall reasons on the persistent LSTM kernels (float32; bench/lstm_profile_case.py,
# the second forward and backward): whether the per-step exchange (the backward's st.release.gpu
# publish after a __syncthreads, the forward's values as readiness) waits on memory barriers
# ("membar"), as the LayerNorm cluster exchange's release did (bench/README.md, "The clusters'
# exchange by st.async and mbarriers"). One line of metric/value pairs a kernel and shape.
#   bash bench/experiments/lstm_ncu_stalls.sh            (on the device, from the repository root)
cd "$(dirname "$0")/../.."
source bench/experiments/device_start.sh
m=gpu__time_duration.sum,smsp__inst_executed.sum,smsp__issue_active.avg.pct_of_peak_sustained_elapsed,smsp__warps_active.avg.per_cycle_active,launch__registers_per_thread,launch__grid_size,launch__block_size
for r in barrier membar long_scoreboard short_scoreboard wait mio_throttle lg_throttle drain math_pipe_throttle not_selected selected no_instruction sleeping; do
  m=$m,smsp__average_warps_issue_stalled_${r}_per_issue_active.ratio
done
for shape in ${LSTM_NCU_SHAPES:-"985 4 100" "512 32 100" "1024 64 100"}; do
  echo "== $shape"
  ncu --clock-control none -k regex:"persistent_(fwd|bwd)_kernel" --launch-skip 2 --launch-count 2 --metrics $m \
    python3 bench/lstm_profile_case.py $shape 2>&1 | grep -E "persistent_(fwd|bwd)_kernel|^ +[a-z_]+__|launch__" \
    | awk '/kernel/{printf "\n%s\n", $1; next} {printf "%s %s  ", $1, $NF}'
  echo
done
