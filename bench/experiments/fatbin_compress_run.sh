#!/usr/bin/env bash
# One device call for the kernels' fatbins compressed for size (CMakeLists.txt, --compress-mode=size)
# against nvcc's default compression: what a script pays once (bench/first_call.py: import, first
# and second call of each family's module, fresh processes) with each wheel, then with the
# compressed one the GPU width test's unaligned-pointer cases and a few sweep points (compare with
# this GPU's committed sweep: python3 bench/layer_norm_sweep.py --compare ... OUT/compress_sweep.json).
# Build both, here (bench/results moved aside for the call: the carry's 64 MiB):
#   bash scripts/device_wheel.sh                     (with --compress-mode=size: .devbuild/)
#   the same with --compress-mode=default, its wheel copied to .devbuild/default/
#   bash bench/experiments/fatbin_compress_run.sh   (on the device)
cd "$(dirname "$0")/../.."
set -uo pipefail
OUT=${OUT:-/tmp/hfnn-out}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name --format=csv,noheader | head -1
bash scripts/device_run.sh none > "$OUT/install.log" 2>&1 || { tail -20 "$OUT/install.log"; exit 1; }
for build in default size; do
  if [ "$build" = default ]; then wheel=$(ls .devbuild/default/hfnn-*.whl); else wheel=$(ls .devbuild/hfnn-*.whl); fi
  python3 -m pip install -q --no-deps --no-index --force-reinstall "$wheel" || exit 1
  python3 bench/first_call.py --runs ${RUNS:-3} --label "fatbins: --compress-mode=$build" \
    --out "$OUT/first_call-$build.json" > "$OUT/first_call-$build.log" 2>&1 || tail -5 "$OUT/first_call-$build.log"
done
timeout ${TEST_TIMEOUT:-200} python3 -m pytest tests/python/test_layer_norm_widths.py -q -p no:cacheprovider -x \
  -k "unaligned" 2>&1 | tail -3
timeout ${SWEEP_TIMEOUT:-120} python3 bench/layer_norm_sweep.py --out "$OUT/compress_sweep.json" --candidates variants \
  --variants fwd_regs_tpr8 bwd_regs_tpr8 fwd_flat_tpr4 fwd_wide_c8_ps bwd_wide_c8_smem --sizes 16M 1M \
  --widths 33 128 1024 16384 > "$OUT/compress_sweep.log" 2>&1 || echo "sweep failed: $(tail -3 "$OUT/compress_sweep.log")"
grep -h wrote "$OUT"/*.log
