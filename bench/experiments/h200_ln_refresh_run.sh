#!/usr/bin/env bash
# The H200's LayerNorm sweep brought to the kernels of 2026-11-27, eighteenth session (every wide
# variant and the *_cols variants changed since its last sweep: the pushed exchange, the exchange by
# st.async, the one-block backward's own instantiations, the column sums' rows in flight and by row
# count; the window kernels' stores in PTX; new since: the window backward's own sums,
# bwd_wide_win_c*_smem, and the flat forward, fwd_flat_tpr*) and the built-in choice rebuilt from both
# GPUs' sweeps and checked there: three device calls, each about 450 s, on an H200 only (on another
# GPU it says so and stops). Build first, here: bash scripts/device_wheel.sh (carry .devbuild).
#   PART=1 bash bench/experiments/h200_ln_refresh_run.sh    every bwd_wide* variant -> OUT/h200-part1.json
#   PART=2 bash bench/experiments/h200_ln_refresh_run.sh    fwd_wide* and bwd_block*_cols -> OUT/h200-part2.json
#   after each, here: mkdir -p tmp_parts && cp OUT/h200-part<N>.json tmp_parts/   (untracked, not
#   ignored: it travels)
#   PART=3 bash bench/experiments/h200_ln_refresh_run.sh    the row and window variants the stores
#          touched and the flat forward, then defaults-refresh with the three parts (its files under
#          OUT, as scripts/device_run.sh says)
#   then here: copy them as bench/README.md's "Swept again and the built-in choice rebuilt" says, and
#   delete tmp_parts/ before committing.
cd "$(dirname "$0")/../.."
export H200_BENCH=0
source bench/experiments/device_start.sh
if [[ "$gpu" != *H200* ]]; then echo "not an H200 ($gpu): nothing run"; exit 0; fi
part() {  # $1: name, then the variants' patterns
  local name=$1; shift
  SWEEP_CANDIDATES=variants SWEEP_TIMEOUT=${SWEEP_TIMEOUT:-420} SWEEP_ARGS="--variants $*" OUT=/tmp/$name \
    bash scripts/device_run.sh sweep 2>&1 | tail -6
  cp /tmp/$name/layer_norm_sweep-h200.json "$OUT/h200-$name.json"
}
case "${PART:-1}" in
  1) part part1 'bwd_wide*' ;;
  2) part part2 'fwd_wide*' 'bwd_block*_cols' ;;
  3) for n in 1 2; do
       [ -f tmp_parts/h200-part$n.json ] || { echo "tmp_parts/h200-part$n.json missing: run PART=$n and copy its file first"; exit 1; }
     done
     part part3 'fwd_flat_*' 'fwd_win_*' 'bwd_win_*' fwd_block bwd_block_win
     REFRESH_PARTS="tmp_parts/h200-part1.json tmp_parts/h200-part2.json $OUT/h200-part3.json" SWEEP_TIMEOUT=230 \
       bash scripts/device_run.sh defaults-refresh 2>&1 | tail -6 ;;
esac
