#!/usr/bin/env bash
# The H200's LayerNorm sweep brought to this build's kernels, and the built-in choice rebuilt from both
# GPUs' sweeps and checked there: four device calls of up to about 450 s each, on an H200 only (on
# another GPU it says so and stops). The committed H200 sweep is of 2026-11-26 (checked on
# 2026-11-28: it has no fwd_flat_* and none of the wide window variants, and the row-register,
# window and wide kernels have changed since). Build first, here: bash scripts/device_wheel.sh
# (carry .devbuild).
#   PART=1 bash bench/experiments/h200_ln_refresh_run.sh    every bwd_wide* variant -> OUT/h200-part1.json
#   PART=2 ...                                               fwd_wide* and bwd_block*_cols -> OUT/h200-part2.json
#   PART=3 ...                                               the flat, window and block variants -> OUT/h200-part3.json
#   after each, here: mkdir -p tmp_parts && cp OUT/h200-part<N>.json tmp_parts/   (untracked, not
#   ignored: it travels)
#   PART=4 ...   the row-register variants, then defaults-refresh with the four parts (its files under
#                OUT, as scripts/device_run.sh says)
#   PART=wide, then PART=wide-defaults: every fwd_wide* and bwd_wide* variant alone, then the
#                built-in choice from that part (a change to layer_norm_wide.cu alone)
#   then here: copy them as bench/README.md's "Swept again and the built-in choice rebuilt" says, and
#   delete tmp_parts/ before committing.
# The sweep writes its file after every case, so a part cut short by its timeout still brings back
# what it measured (the merge keeps the committed records of the rest).
cd "$(dirname "$0")/../.."
export H200_BENCH=0
source bench/experiments/device_start.sh
if [[ "$gpu" != *H200* ]]; then echo "not an H200 ($gpu): nothing run"; exit 0; fi
part() {  # $1: name, then the variants' patterns
  local name=$1; shift
  SWEEP_CANDIDATES=variants SWEEP_TIMEOUT=${SWEEP_TIMEOUT:-420} SWEEP_ARGS="--widths sweep 63 257 1025 2041 --variants $*" OUT=/tmp/$name \
    bash scripts/device_run.sh sweep 2>&1 | tail -6
  cp /tmp/$name/layer_norm_sweep-h200.json "$OUT/h200-$name.json"
}
case "${PART:-1}" in
  1) part part1 'bwd_wide*' ;;
  2) part part2 'fwd_wide*' 'bwd_block*_cols' ;;
  3) part part3 'fwd_flat_*' 'fwd_win_*' 'bwd_win_*' fwd_block bwd_block bwd_block_win ;;
  4) for n in 1 2 3; do
       [ -f tmp_parts/h200-part$n.json ] || { echo "tmp_parts/h200-part$n.json missing: run PART=$n and copy its file first"; exit 1; }
     done
     part part4 'fwd_regs_*' 'bwd_regs_*'
     REFRESH_PARTS="tmp_parts/h200-part1.json tmp_parts/h200-part2.json tmp_parts/h200-part3.json $OUT/h200-part4.json" \
       SWEEP_TIMEOUT=230 bash scripts/device_run.sh defaults-refresh 2>&1 | tail -6 ;;
  # A change to the wide kernels alone (layer_norm_wide.cu; thirty-second session, the block sums by
  # butterfly): every wide variant in one part, then the built-in choice from it in a second call.
  wide) part wide 'bwd_wide*' 'fwd_wide*' ;;
  wide-defaults)
     [ -f tmp_parts/h200-wide.json ] || { echo "tmp_parts/h200-wide.json missing: run PART=wide and copy its file first"; exit 1; }
     REFRESH_PARTS="tmp_parts/h200-wide.json" SWEEP_TIMEOUT=${CHECK_TIMEOUT:-300} \
       bash scripts/device_run.sh defaults-refresh 2>&1 | tail -6 ;;
  *) echo "PART=${PART}: 1, 2, 3, 4, wide or wide-defaults"; exit 2 ;;
esac
