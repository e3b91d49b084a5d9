# Sourced by the experiments' device scripts (bash, from the repository root): installs the
# carried wheel, then the caller's experiment follows. With H200_BENCH=1, on an H200 it runs the
# issues' H200 benchmarks instead and exits: attention (bench/mha.py, every config, with hfnn_mid,
# which no H200 has run yet: issue 11's config 0 target is the H200's), then with H200_LSTM=1 the
# LSTM's (met there on 2026-11-27). What an H200 is wanted for besides: the LayerNorm sweep
# (bench/experiments/h200_ln_refresh_run.sh). Sets OUT (made) and gpu.
set -uo pipefail
OUT=${OUT:-/tmp/hfnn-out}
mkdir -p "$OUT"
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "gpu: $gpu"
bash scripts/device_run.sh none > "$OUT/install.log" 2>&1 || { tail -20 "$OUT/install.log"; exit 1; }
if [[ "$gpu" == *H200* && "${H200_BENCH:-0}" == 1 ]]; then
  MHA_TIMEOUT=400 bash scripts/device_run.sh mha
  if [[ "${H200_LSTM:-0}" == 1 ]]; then
    LSTM_ARGS="--configs 0 1 --dtypes float32 bfloat16" LSTM_TIMEOUT=180 bash scripts/device_run.sh lstm
  fi
  exit
fi
