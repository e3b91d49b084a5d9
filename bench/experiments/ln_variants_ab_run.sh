#!/usr/bin/env bash
# A LayerNorm kernel change against HEAD on one H100, one device call:
#   1. the GPU width test's cases of widths 1 to 550 and unaligned pointers (every variant that says
#      yes against float64; LN_AB_TESTS=0 skips it; LN_AB_TEST_K another -k selection, e.g.
#      "wide or row_count" for the wide variants, 46 tests in about 190 s on an H100)
#   2. HEAD's library against this build's (device_ab.sh: base, new, base2, new2) for the variants
#      LN_AB_VARIANTS (globs) at LN_AB_WIDTHS, LN_AB_SIZES (default 16M; e.g. "16M 1M"), LN_AB_DTYPES
# Build first, here: bash scripts/device_wheel.sh --baseline (carry .devbuild; the layer_norm_*.json
# results other than the two sweeps may be moved aside for the 64 MiB carry). With H200_BENCH=1 on
# an H200 it runs the issues' H200 benchmarks instead (device_start.sh). The twenty-fourth session's:
#   LN_AB_VARIANTS="fwd_flat_*" bash bench/experiments/ln_variants_ab_run.sh
#       (the flat forward at every count of elements a lane; copy as a candidate too, three dtypes)
#   LN_AB_VARIANTS="fwd_regs_* bwd_regs_*" LN_AB_DTYPES="bfloat16 float16" LN_AB_COPY= \
#   LN_AB_WIDTHS="33 34 36 63 98 100 127 160 255 257 402 500" bash bench/experiments/ln_variants_ab_run.sh
#       (the row-register variants with exact access counts; that run had no copy candidate: LN_AB_COPY=)
# (Those two ran as ln_flat_lanes_run.sh and ln_regs_exact_run.sh of 778f495 and b68b220, since
# merged into this one.)
# Then here: tar xzf OUT/ab.tgz -C OUT && python3 bench/layer_norm_sweep.py --compare OUT/ab/base/ab.json OUT/ab/new/ab.json
cd "$(dirname "$0")/../.."
[[ -n "${LN_AB_VARIANTS:-}" ]] || { echo "ln_variants_ab_run.sh: set LN_AB_VARIANTS (globs of variant names)"; exit 2; }
source bench/experiments/device_start.sh
if [[ "${LN_AB_TESTS:-1}" == 1 ]]; then
  timeout ${TEST_TIMEOUT:-280} python3 -m pytest tests/python/test_layer_norm_widths.py -q -p no:cacheprovider -x \
    -k "${LN_AB_TEST_K:-unaligned or 1-275 or 276-550}" 2>&1 | tail -8
fi
set -f  # the variants are globs for the sweep, not for the shell
variants=$(for v in $LN_AB_VARIANTS; do printf "'%s' " "$v"; done)
set +f
widths=${LN_AB_WIDTHS:-"32 33 34 36 48 63 64 96 98 100 127 128 160 192 255 256 257 320 384 402 500 512"}
AB_RUNS=${LN_AB_RUNS:-"base new base2 new2"} AB_TIMEOUT=${LN_AB_TIMEOUT:-90} OUT="$OUT/ab" bash scripts/device_ab.sh \
  "python3 bench/layer_norm_sweep.py --out \$AB_OUT/ab.json --candidates variants ${LN_AB_COPY-copy} --sizes ${LN_AB_SIZES:-16M} --dtypes ${LN_AB_DTYPES:-float32 bfloat16 float16} --widths $widths --variants $variants" \
  | grep -E "device_ab|wrote|FAILED" | tail -12
# One file back instead of eight (a call returns at most eight: the twenty-fifth session lost three
# runs' files to that limit when other steps followed in the same call).
tar czf "$OUT/ab.tgz" -C "$OUT" ab && rm -rf "$OUT/ab"
