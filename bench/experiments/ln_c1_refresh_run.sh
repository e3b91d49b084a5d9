#!/usr/bin/env bash
# One device call after the one-block backward variants got instantiations of their own (without
# the clusters' exchange): those variants swept again and merged into this GPU's committed sweep,
# and the built-in choice's data made again and checked (device_run.sh's defaults-refresh). The
# whole GPU width test takes a call of its own (`bash scripts/device_run.sh widths`, about 360 s).
# Build first, here: bash scripts/device_wheel.sh (carry .devbuild).
#   bash bench/experiments/ln_c1_refresh_run.sh            (on the device, from the repository root)
# Then, here: the files under OUT as scripts/device_run.sh's defaults-refresh says.
cd "$(dirname "$0")/../.."
source bench/experiments/device_start.sh
SWEEP_CANDIDATES=variants SWEEP_TIMEOUT=150 \
  SWEEP_ARGS="--variants bwd_wide_c1 bwd_wide_c1_smem bwd_wide_c1_cols bwd_wide_c1_smem_cols bwd_wide_win_c1_cols" \
  OUT=/tmp/c1 bash scripts/device_run.sh sweep 2>&1 | tail -8
c1=$(ls /tmp/c1/layer_norm_sweep-*.json | head -1)
cp "$c1" "$OUT/c1-sweep.json"
REFRESH_PARTS=$c1 SWEEP_TIMEOUT=230 bash scripts/device_run.sh defaults-refresh 2>&1 | tail -20
