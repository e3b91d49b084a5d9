#!/usr/bin/env bash
# LayerNorm variants swept again in parts at once, one GPU each, on a machine of several GPUs (the
# nvidia-h200-x4 or -x2 kinds; on H100s the same), then the built-in choice rebuilt from them. Two
# device calls:
#   1. (STAGE=sweep, the default) each part of LN_PARTS on a GPU of its own (parts beyond the GPUs
#      queue on them in turn: keep to one part a GPU, a part takes up to about 450 s on an H200),
#      16M, 1M and 64K elements, every dtype and width, the variants alone (torch and torch.compile
#      stay the committed sweep's) -> OUT/<gpu>-<part>.json and .log. Then here:
#        mkdir -p tmp_parts && cp OUT/<gpu>-*.json tmp_parts/   (untracked, not ignored: it travels)
#   2. STAGE=refresh: tmp_parts/<gpu>-*.json merged into this GPU's committed sweep, the built-in
#      choice's data written from every GPU's sweep and checked against torch (device_run.sh
#      defaults-refresh: its files under OUT). Then copy them as bench/README.md's "Swept again and
#      the built-in choice rebuilt" says, and delete tmp_parts/ before committing.
# Build first, here: bash scripts/device_wheel.sh (carry .devbuild).
#   LN_PARTS: "name:glob,glob name:glob ..." (default: the H200's stale set, every variant but the
#   block ones: the wide backward; the wide forward and the column sums; the narrow and window
#   variants; the row-register variants). Where the parts leave a GPU free, LN_BESIDE runs on it:
#   widths (the default), the GPU width test's cases of widths 1 to 550 and unaligned pointers
#   (OUT/widths.log); mha, issue 11's bench/mha.py (OUT/mha-<gpu>.json, .log); none (LN_TESTS=0 too).
#   The exit status is non-zero when a part or that job fails.
#   LN_WIDTHS: the sweep's --widths (default: sweep; the committed sweeps also hold 63 and 257).
#   bash bench/experiments/ln_parts_parallel_run.sh
#   STAGE=refresh bash bench/experiments/ln_parts_parallel_run.sh
#       (on an H200 with a second GPU, bench/mha.py runs on it meanwhile: MHA=0 leaves it out)
cd "$(dirname "$0")/../.."
export H200_BENCH=0
source bench/experiments/device_start.sh
tag=$(python3 -c "import torch; n=torch.cuda.get_device_name().lower(); print('h200' if 'h200' in n else 'h100' if 'h100' in n else n.split()[-1])")
if [[ "${STAGE:-sweep}" == refresh ]]; then
  parts=$(ls tmp_parts/"$tag"-*.json 2>/dev/null | tr '\n' ' ')
  [ -n "$parts" ] || { echo "ln_parts_parallel_run.sh: no tmp_parts/$tag-*.json: run the sweep stage and copy its files first"; exit 1; }
  echo "refresh with: $parts"
  # On an H200 with a second GPU, issue 11's attention benchmark beside it (bench/mha.py, every
  # config: no H200 has run hfnn_mid yet), started once device_run.sh has reinstalled the wheel.
  if [[ "$tag" == h200 && $(nvidia-smi -L | wc -l) -ge 2 && "${MHA:-1}" == 1 ]]; then
    (sleep 60; CUDA_VISIBLE_DEVICES=1 timeout ${MHA_TIMEOUT:-420} python3 bench/mha.py --out "$OUT/mha-h200.json" \
       > "$OUT/mha.log" 2>&1; echo "mha: exit $?"; tail -30 "$OUT/mha.log") &
  fi
  CUDA_VISIBLE_DEVICES=0 REFRESH_PARTS="$parts" SWEEP_TIMEOUT=${SWEEP_TIMEOUT:-400} \
    bash scripts/device_run.sh defaults-refresh 2>&1 | tail -8
  rc=${PIPESTATUS[0]}
  wait
  exit "$rc"
fi
set -f  # the variants are globs for the sweep, not for the shell
gpus=$(nvidia-smi -L | wc -l)
parts=(${LN_PARTS:-bwd_wide:bwd_wide* fwd_wide:fwd_wide*,bwd_block*_cols narrow:fwd_flat_*,fwd_win_*,bwd_win_*,fwd_block,bwd_block_win regs:fwd_regs_*,bwd_regs_*})
echo "$gpu x $gpus: ${#parts[@]} parts"
beside=${LN_BESIDE:-widths}
[[ "${LN_TESTS:-1}" == 1 ]] || beside=none
jobs_run=()
# A GPU no part needs runs LN_BESIDE.
if (( ${#parts[@]} < gpus )) && [[ "$beside" != none ]]; then
  free=${#parts[@]}
  ( start=$SECONDS
    if [[ "$beside" == mha ]]; then
      CUDA_VISIBLE_DEVICES=$free timeout ${MHA_TIMEOUT:-520} python3 bench/mha.py --out "$OUT/mha-$tag.json" > "$OUT/mha.log" 2>&1
      rc=$?; echo "mha on GPU $free: exit $rc, $((SECONDS - start)) s"; tail -40 "$OUT/mha.log"
    else
      CUDA_VISIBLE_DEVICES=$free timeout ${TEST_TIMEOUT:-540} python3 -m pytest tests/python/test_layer_norm_widths.py \
        -q -p no:cacheprovider -x -k "unaligned or 1-275 or 276-550" > "$OUT/widths.log" 2>&1
      rc=$?; echo "width test on GPU $free: exit $rc: $(tail -1 "$OUT/widths.log")"
    fi
    exit $rc ) &
  jobs_run+=($!)
fi
for ((g = 0; g < gpus && g < ${#parts[@]}; ++g)); do
  (
    failed=0
    for ((i = g; i < ${#parts[@]}; i += gpus)); do
      name=${parts[i]%%:*}
      variants=$(echo "${parts[i]#*:}" | tr ',' ' ')
      start=$SECONDS
      CUDA_VISIBLE_DEVICES=$g timeout ${SWEEP_TIMEOUT:-560} python3 -X faulthandler bench/layer_norm_sweep.py \
        --out "$OUT/$tag-$name.json" --candidates variants --variants $variants --widths ${LN_WIDTHS:-sweep} \
        > "$OUT/$tag-$name.log" 2>&1
      rc=$?
      echo "part $name ($variants) on GPU $g: exit $rc, $((SECONDS - start)) s, $(grep -c FAILED "$OUT/$tag-$name.log") FAILED lines"
      (( rc == 0 )) || failed=1
    done
    exit $failed
  ) &
  jobs_run+=($!)
done
status=0
for pid in "${jobs_run[@]}"; do wait "$pid" || status=1; done
exit $status
