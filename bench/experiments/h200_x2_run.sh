#!/usr/bin/env bash
# Two GPUs at once (the nvidia-h200-x2 kind, which may come as two H100s), one device call:
#   On H200s, STAGE=1 (default): issue 11's attention benchmark (bench/mha.py, every config) on GPU 1
#     -> OUT/mha-h200.json, and the LayerNorm sweep's wide forward and column-sum variants on GPU 0
#     -> OUT/h200-fwd_wide.json (16M, 1M and 64K elements, every dtype and width of the committed
#     sweeps). STAGE=2: the window, flat, block and wide-window backward variants on GPU 0, the
#     row-register variants on GPU 1 -> OUT/h200-narrow.json, OUT/h200-regs.json. The bwd_wide_c*
#     variants are a third part (STAGE=3, GPU 0 alone). Each part merges on its own into the H200's
#     committed sweep (--merge, as bench/layer_norm_sweep.py --help says), then --defaults.
#   On H100s: the built-in choice against torch at the sweep's widths and between them on GPU 0
#     (OUT/layer_norm_default-h100.json), and the GPU width test's narrow and unaligned cases on GPU 1
#     where there is one.
#   On one H200 (the nvidia-h200 kind), STAGE=1 runs the attention benchmark alone, STAGE=3 its part,
#     STAGE=2 nothing (two GPUs' worth). The exit status is non-zero when any part fails. H100_FALLBACK=0:
#     on H100s nothing runs (the call costs its start only).
# Build first, here: bash scripts/device_wheel.sh (carry .devbuild).
#   bash bench/experiments/h200_x2_run.sh          STAGE=2 bash bench/experiments/h200_x2_run.sh
cd "$(dirname "$0")/../.."
export H200_BENCH=0
source bench/experiments/device_start.sh
gpus=$(nvidia-smi -L | wc -l)
echo "$gpu x $gpus, stage ${STAGE:-1}"
widths="sweep 63 257 1025 2041"
sweep_part() {  # GPU, name, variant globs...
  local g=$1 name=$2; shift 2
  local start=$SECONDS
  CUDA_VISIBLE_DEVICES=$g timeout ${SWEEP_TIMEOUT:-530} python3 -X faulthandler bench/layer_norm_sweep.py \
    --out "$OUT/h200-$name.json" --candidates variants --variants "$@" --widths $widths > "$OUT/h200-$name.log" 2>&1
  local rc=$?
  echo "part $name on GPU $g: exit $rc, $((SECONDS - start)) s, $(grep -c FAILED "$OUT/h200-$name.log") FAILED lines"
  return $rc
}
if [[ "$gpu" == *H200* && "$gpus" == 1 && "${STAGE:-1}" == 1 ]]; then  # one H200: the attention benchmark alone
  MHA_TIMEOUT=${MHA_TIMEOUT:-520} bash scripts/device_run.sh mha 2>&1 | tail -40
  exit
fi
if [[ "$gpu" == *H200* ]]; then
  if [[ "$gpus" == 1 && "${STAGE:-1}" == 2 ]]; then echo "STAGE=2 needs two GPUs: nothing run"; exit 1; fi
  case "${STAGE:-1}" in
    1)
      ( start=$SECONDS
        CUDA_VISIBLE_DEVICES=1 timeout ${MHA_TIMEOUT:-520} python3 bench/mha.py --out "$OUT/mha-h200.json" > "$OUT/mha.log" 2>&1
        rc=$?; echo "mha on GPU 1: exit $rc, $((SECONDS - start)) s"; tail -40 "$OUT/mha.log"; exit $rc ) &
      sweep_part 0 fwd_wide 'fwd_wide*' 'bwd_block*_cols' ;;
    2)
      sweep_part 1 regs 'fwd_regs_*' 'bwd_regs_*' &
      sweep_part 0 narrow 'bwd_wide_win*' 'fwd_flat_*' 'fwd_win_*' 'bwd_win_*' fwd_block bwd_block bwd_block_win ;;
    3)
      sweep_part 0 bwd_wide 'bwd_wide_c*' ;;
    *) echo "STAGE=$STAGE: 1, 2 or 3"; exit 2 ;;
  esac
  rc=$?
  wait -n 2>/dev/null; other=$?  # the job beside it (none: 127)
  (( rc == 0 && (other == 0 || other == 127) )); exit $?
fi
if [[ "${H100_FALLBACK:-1}" == 0 ]]; then echo "not an H200: nothing run (H100_FALLBACK=0)"; exit 0; fi
# H100s: the built-in choice's check (device_run.sh default-check's command: the wheel is installed
# once, above, so the test beside it never imports a package being reinstalled), and on a second
# GPU the width test to 550 columns.
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
wait -n 2>/dev/null; other=$?
(( rc == 0 && (other == 0 || other == 127) )); exit $?
