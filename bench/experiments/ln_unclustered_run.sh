#!/usr/bin/env bash
# One device call for the next step of "The clusters' exchange by st.async and mbarriers"
# (bench/README.md): the one-block LayerNorm variants against the committed sweep, with controls the
# change cannot touch in the same run, to tell a kernel's loss from the machine's. Build first, on
# the CPU machine, from the tree under test (e.g. `git apply
# bench/experiments/layer_norm_bwd_unclustered.patch`, then `bash scripts/device_wheel.sh`).
# On an H200 it runs the issues' H200 benchmarks instead (device_start.sh).
#   bash bench/experiments/ln_unclustered_run.sh            (on the device, from the repository root)
# Then, here: python3 bench/layer_norm_sweep.py --compare bench/results/layer_norm_sweep-h100.json OUT/c1.json
cd "$(dirname "$0")/../.."
source bench/experiments/device_start.sh
timeout ${TEST_TIMEOUT:-100} python3 -m pytest tests/python/test_layer_norm_widths.py -q -p no:cacheprovider \
  -k "every_variant_at_every_width and wide and (bfloat16 or float16)" 2>&1 | tail -1
timeout ${SWEEP_TIMEOUT:-300} python3 bench/layer_norm_sweep.py --out "$OUT/c1.json" --candidates variants \
  --variants 'fwd_wide_c1' 'fwd_wide_c1_ps' 'bwd_wide_c1*' 'bwd_wide_win_c1_cols' fwd_regs_tpr32 fwd_block bwd_regs_tpr32 bwd_block_win \
  --sizes 16M 1M 64K --dtypes bfloat16 float16 --widths 1024 2048 4096 4097 4100 8192 12288 16384 32768 \
  > "$OUT/c1.log" 2>&1 || echo "sweep failed: $(tail -3 "$OUT/c1.log")"
python3 bench/layer_norm_sweep.py --compare bench/results/layer_norm_sweep-h100.json "$OUT/c1.json" > "$OUT/c1_compare.txt" 2>&1
head -40 "$OUT/c1_compare.txt"
