# Sourced by the experiments' device scripts (bash, from the repository root): installs the
# carried wheel, then the caller's experiment follows. With H200_BENCH=1, on an H200 it runs the
# issues' H200 benchmarks (LSTM, then attention) instead and exits (those were last taken on
# 2026-11-27, eighteenth session; what an H200 is wanted for next is the LayerNorm sweep:
# bench/experiments/h200_ln_refresh_run.sh). Sets OUT (made) and gpu.
set -uo pipefail
OUT=${OUT:-/tmp/hfnn-out}
mkdir -p "$OUT"
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "gpu: $gpu"
bash scripts/device_run.sh none > "$OUT/install.log" 2>&1 || { tail -20 "$OUT/install.log"; exit 1; }
if [[ "$gpu" == *H200* && "${H200_BENCH:-0}" == 1 ]]; then
  LSTM_ARGS="--configs 0 1 --dtypes float32 bfloat16" LSTM_TIMEOUT=240 bash scripts/device_run.sh lstm
  MHA_TIMEOUT=300 bash scripts/device_run.sh mha
  exit
fi
