# Sourced by the experiments' device scripts (bash, from the repository root): installs the
# carried wheel and, on an H200, runs the issues' H200 benchmarks (LSTM, then attention) and
# exits, since no call reached an H200 from the sixth session to the fourteenth; on an H100 the
# caller's experiment follows (also on an H200 with H200_BENCH=0). Sets OUT (made) and gpu.
set -uo pipefail
OUT=${OUT:-/tmp/hfnn-out}
mkdir -p "$OUT"
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "gpu: $gpu"
bash scripts/device_run.sh none > "$OUT/install.log" 2>&1 || { tail -20 "$OUT/install.log"; exit 1; }
if [[ "$gpu" == *H200* && "${H200_BENCH:-1}" == 1 ]]; then
  LSTM_ARGS="--configs 0 1 --dtypes float32 bfloat16" LSTM_TIMEOUT=240 bash scripts/device_run.sh lstm
  MHA_TIMEOUT=300 bash scripts/device_run.sh mha
  exit
fi
