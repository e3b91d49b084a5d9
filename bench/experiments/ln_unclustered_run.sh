#!/usr/bin/env bash
# One device call for "The one-block backward's own instantiations" (bench/README.md): the whole GPU
# width test, then the one-block LayerNorm variants against a committed sweep ($BASE, default this
# tree's; the measurement of 2026-11-27 compared with 1b5eff5's), with controls the change cannot
# touch in the same run, to tell a kernel's loss from the machine's. Build first, on the CPU machine,
# from the tree under test: `bash scripts/device_wheel.sh` (carry .devbuild).
# On an H200 it runs the issues' H200 benchmarks instead (device_start.sh).
#   bash bench/experiments/ln_unclustered_run.sh            (on the device, from the repository root)
# Then, here: python3 bench/layer_norm_sweep.py --compare BASE OUT/c1.json
cd "$(dirname "$0")/../.."
source bench/experiments/device_start.sh
# WIDTHS=1: the whole GPU width test first (about 360 s on an H100; with the sweep, over one call's
# 600 s: the measurement of 2026-11-27 ran it in a call of its own, `bash scripts/device_run.sh widths`).
if [ "${WIDTHS:-0}" = 1 ]; then
  OUT=/tmp/widths bash scripts/device_run.sh widths 2>&1 | tail -25
  cp /tmp/widths/logs.tar.gz "$OUT/widths-logs.tar.gz"
fi
timeout ${SWEEP_TIMEOUT:-300} python3 bench/layer_norm_sweep.py --out "$OUT/c1.json" --candidates variants \
  --variants 'fwd_wide_c1' 'fwd_wide_c1_ps' 'bwd_wide_c1*' 'bwd_wide_win_c1_cols' fwd_regs_tpr32 fwd_block bwd_regs_tpr32 bwd_block_win \
  --sizes 16M 1M 64K --dtypes bfloat16 float16 --widths 1024 2048 4096 4097 4100 8192 12288 16384 32768 \
  > "$OUT/c1.log" 2>&1 || echo "sweep failed: $(tail -3 "$OUT/c1.log")"
python3 bench/layer_norm_sweep.py --compare "${BASE:-bench/results/layer_norm_sweep-h100.json}" "$OUT/c1.json" > "$OUT/c1_compare.txt" 2>&1
head -40 "$OUT/c1_compare.txt"
