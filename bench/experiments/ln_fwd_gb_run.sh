#!/usr/bin/env bash
# The one-pass wide forward (fwd_wide_once_kernel, fwd_wide_c1) under launch and load forms, in one
# build and one call (H200): Nsight Compute's source page of fwd_wide_c1 as kept (LN_GB_NCU cases,
# where its warps stall), then the forward under configurations, in rounds
# (bench/experiments/ln_fwd_configs.py). The configurations need the experiment's build, whose
# environment variables the launches read (bench/experiments/layer_norm_fwd_gb_ab.patch, applied to
# the commit it names):
#   HFNN_LN_FWD_NV=2 the forward's rows at 2 accesses a thread instead of 4;
#   HFNN_LN_FWD_MAXT=1024 fwd_wide_c1's row-groups up to 1,024 threads (registers capped at 40 for
#     2 accesses, 64 for 4) instead of 512;
#   HFNN_LN_FWD_GB=1 gamma and beta prefetched into L1 once x's loads are issued, 2 their loads all
#     issued before the output loop, 4 x loaded without L1 allocation, 5 both 1 and 4.
# Build first, here: git apply bench/experiments/layer_norm_fwd_gb_ab.patch && bash scripts/device_wheel.sh
# (carry .devbuild), and git apply -R it after.
# The register caps of 48 and 40 (bench/experiments/layer_norm_fwd_cap48_ab.patch, on 1255507, the
# commit that kept the cap of 56): HFNN_LN_FWD_CAP=48 or 40 takes that cap where it fits more blocks than 56, 0
# the plain kernel; LN_GB_CONFIGS="base: nocap:HFNN_LN_FWD_CAP=0 cap48:HFNN_LN_FWD_CAP=48
# cap40:HFNN_LN_FWD_CAP=40 base2:" LN_GB_DTYPES="bfloat16 float16" LN_GB_ELEMENTS="16777216 1048576"
# LN_GB_WIDTHS="4096 6144 8192 10240 12288 14336 16384" bash bench/experiments/ln_fwd_gb_run.sh.
cd "$(dirname "$0")/../.."
source bench/experiments/device_start.sh
if [[ -n "${LN_GB_NCU:-}" ]]; then
  LN_NCU_CASES="$LN_GB_NCU" OUT="$OUT" bash bench/experiments/ln_ncu_source_run.sh 2>&1 | grep -v "^gpu:" | tail -8
fi
for n in ${LN_GB_ELEMENTS:-16777216}; do
  timeout ${AB_TIMEOUT:-400} python3 bench/experiments/ln_fwd_configs.py --out "$OUT/fwd_gb_$n.json" --elements $n \
    --configs ${LN_GB_CONFIGS:-base: nv2:HFNN_LN_FWD_NV=2,HFNN_LN_FWD_MAXT=1024 t1024:HFNN_LN_FWD_MAXT=1024 gb1:HFNN_LN_FWD_GB=1 gb2:HFNN_LN_FWD_GB=2 gb4:HFNN_LN_FWD_GB=4 gb5:HFNN_LN_FWD_GB=5 nv2gb1:HFNN_LN_FWD_NV=2,HFNN_LN_FWD_MAXT=1024,HFNN_LN_FWD_GB=1 base2:} \
    --variants ${LN_GB_VARIANTS:-fwd_wide_c1} --dtypes ${LN_GB_DTYPES:-bfloat16 float16 float32} \
    --widths ${LN_GB_WIDTHS:-1024 2048 3072 4096 5120 6144 8192 10240 12288 14336 16384 24576 32768}
done
