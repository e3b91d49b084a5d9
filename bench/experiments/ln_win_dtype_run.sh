#!/usr/bin/env bash
# One device call: why the 16-bit window backward (rows not 16-byte aligned) differs between bf16
# and fp16 at the same width (bench/README.md, "The one-block backward's own instantiations":
# `bwd_wide_win_c1_cols` at 4,097 columns, 16M elements, bf16 98-104 us against fp16 56). The sweep
# at a few odd widths with the dtypes in the other order, the kernels of a call split
# (layer_norm_bwd_parts.py), then Nsight Compute on both dtypes. Build first, here:
# bash scripts/device_wheel.sh (carry .devbuild).
#   bash bench/experiments/ln_win_dtype_run.sh            (on the device, from the repository root)
#   NCU_ONLY=1 NCU_KERNELS=param_cols_kernel bash bench/experiments/ln_win_dtype_run.sh   (the sums' kernel alone)
cd "$(dirname "$0")/../.."
source bench/experiments/device_start.sh
[ "${NCU_ONLY:-0}" = 1 ] || {
timeout 120 python3 bench/layer_norm_sweep.py --out "$OUT/win_dtype_sweep.json" --candidates variants \
  --variants bwd_wide_win_c1_cols bwd_wide_win_c8_cols bwd_block_win --sizes 16M --dtypes float16 bfloat16 \
  --widths 1023 1500 4097 > "$OUT/win_dtype_sweep.log" 2>&1 || echo "sweep failed: $(tail -3 "$OUT/win_dtype_sweep.log")"
timeout 120 python3 bench/layer_norm_bwd_parts.py --out "$OUT/win_dtype_parts.json" --cases \
  bwd_wide_win_c1_cols:bfloat16:4095x4097 bwd_wide_win_c1_cols:float16:4095x4097 \
  bwd_wide_win_c1_cols:bfloat16:16400x1023 bwd_wide_win_c1_cols:float16:16400x1023 2>&1 | tail -14
}
# NCU_KERNELS=param_cols_kernel: the column sums' kernel (the dx kernel's were alike in both dtypes).
NCU_CASES="bwd_wide_win_c1_cols:bfloat16:4095x4097 bwd_wide_win_c1_cols:float16:4095x4097" \
  OUT=/tmp/ncu timeout 240 bash scripts/device_run.sh ncu 2>&1 | grep -v "^hfnn 0.1.0" | tail -130
cp /tmp/ncu/logs.tar.gz "$OUT/ncu-logs.tar.gz"
