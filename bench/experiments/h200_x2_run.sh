#!/usr/bin/env bash
# What an H200 is wanted for, one device call, on whatever the nvidia-h200-x2 or nvidia-h200 kind
# brings (H100s come for either):
#   On H200s, the H200 LayerNorm sweep in three parts, each merged on its own into the committed
#     bench/results/layer_norm_sweep-h200.json (--merge, as bench/layer_norm_sweep.py --help says,
#     then --defaults), by bench/experiments/ln_parts_parallel_run.sh (16M, 1M and 64K elements,
#     every dtype and width of the committed sweeps -> OUT/h200-<part>.json and .log):
#       STAGE=1 (default): the wide forward and column-sum variants on GPU 0, issue 11's attention
#         benchmark (bench/mha.py, every config -> OUT/mha-h200.json) on GPU 1; on one H200 the
#         attention benchmark alone (scripts/device_run.sh mha);
#       STAGE=2 (two GPUs): the window, flat, block and wide-window backward variants, and the
#         row-register variants;
#       STAGE=3: the bwd_wide_c* variants.
#   On H100s: the built-in choice against torch at the sweep's widths and between them on GPU 0
#     (OUT/layer_norm_default-h100.json, as scripts/device_run.sh default-check), and the GPU width
#     test's narrow and unaligned cases on GPU 1 where there is one. H100_FALLBACK=0: nothing runs
#     (the call costs its start only).
# The exit status is non-zero when any part fails. Build first, here: bash scripts/device_wheel.sh
# (carry .devbuild).
#   bash bench/experiments/h200_x2_run.sh          STAGE=2 bash bench/experiments/h200_x2_run.sh
cd "$(dirname "$0")/../.."
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
gpus=$(nvidia-smi -L | wc -l)
stage=${STAGE:-1}
echo "$gpu x $gpus, stage $stage"
if [[ "$gpu" == *H200* ]]; then
  if (( gpus == 1 )) && [[ "$stage" == 1 ]]; then
    MHA_TIMEOUT=${MHA_TIMEOUT:-520} bash scripts/device_run.sh mha 2>&1 | tail -40
    exit "${PIPESTATUS[0]}"
  fi
  beside=none
  case "$stage" in
    1) parts="fwd_wide:fwd_wide*,bwd_block*_cols"; beside=mha ;;
    2) (( gpus > 1 )) || { echo "STAGE=2 runs two parts at once: it needs two GPUs"; exit 1; }
       parts="narrow:bwd_wide_win*,fwd_flat_*,fwd_win_*,bwd_win_*,fwd_block,bwd_block,bwd_block_win regs:fwd_regs_*,bwd_regs_*" ;;
    3) parts="bwd_wide:bwd_wide_c*" ;;
    *) echo "STAGE=$stage: 1, 2 or 3"; exit 2 ;;
  esac
  LN_PARTS="$parts" LN_BESIDE=$beside LN_WIDTHS="sweep 63 257 1025 2041" SWEEP_TIMEOUT=${SWEEP_TIMEOUT:-530} \
    exec bash bench/experiments/ln_parts_parallel_run.sh
fi
if [[ "${H100_FALLBACK:-1}" == 0 ]]; then echo "not an H200: nothing run (H100_FALLBACK=0)"; exit 0; fi
export H200_BENCH=0
source bench/experiments/device_start.sh
# device_run.sh default-check's command, run here: device_run.sh would install the wheel again under
# the test beside it and remove OUT's logs when it ends.
if (( gpus > 1 )); then
  ( CUDA_VISIBLE_DEVICES=1 timeout ${TEST_TIMEOUT:-500} python3 -m pytest tests/python/test_layer_norm_widths.py \
      -q -p no:cacheprovider -k "unaligned or 1-275 or 276-550" > "$OUT/widths.log" 2>&1
    rc=$?; echo "width test on GPU 1: exit $rc: $(tail -1 "$OUT/widths.log")"; exit $rc ) &
fi
tag=$(python3 -c "import torch; n=torch.cuda.get_device_name().lower(); print('h100' if 'h100' in n else n.split()[-1])")
CUDA_VISIBLE_DEVICES=0 timeout ${SWEEP_TIMEOUT:-500} python3 -X faulthandler bench/layer_norm_sweep.py \
  --out "$OUT/layer_norm_default-$tag.json" --candidates torch default --widths sweep between > "$OUT/default-check.log" 2>&1
rc=$?
grep -E "FAILED|wrote|^- |^  - " "$OUT/default-check.log" | head -40
wait -n 2>/dev/null; other=$?  # the width test (none on one GPU: 127)
(( rc == 0 && (other == 0 || other == 127) ))
