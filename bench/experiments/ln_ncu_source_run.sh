#!/usr/bin/env bash
# Nsight Compute's source page for LayerNorm variants: every SASS instruction of the variant's main
# kernel (its 7th call, as ln_ncu_lines.sh) with its executions and its warp-stall samples, one CSV
# a case (ncu --page source --print-source sass), all in OUT/ncu_source.tgz with each case's log.
# Where an instruction count an element goes (copy loops, row loops, reductions), which a kernel's
# totals (ln_ncu_lines.sh) do not say. Build first, here: bash scripts/device_wheel.sh (carry
# .devbuild); with H200_BENCH=1 an H200 runs the issues' H200 benchmarks instead (device_start.sh).
#   LN_NCU_CASES="fwd_flat_tpr64:bfloat16:16400x1023 fwd_regs_tpr32:bfloat16:16384x1024" \
#     bash bench/experiments/ln_ncu_source_run.sh
# Then here: tar xzf OUT/ncu_source.tgz -C DIR; the CSVs' columns are ncu's (Address, Source,
# Warp Stall Sampling (All Samples), Instructions Executed, ...), and
# bench/experiments/ln_ncu_source_summary.py sums them between barriers and by opcode.
cd "$(dirname "$0")/../.."
: "${LN_NCU_CASES:?set LN_NCU_CASES (variant:dtype:ROWSxD ...)}"
source bench/experiments/device_start.sh
reps=$(mktemp -d)
mkdir -p "$OUT/ncu_source"
for case in $LN_NCU_CASES; do
  IFS=: read -r variant dtype shape <<< "$case"
  name="$variant-$dtype-$shape"
  ncu --clock-control none -k regex:"(fwd|bwd)_" --launch-skip 6 --launch-count 1 \
    --section SourceCounters --section WarpStateStats --section InstructionStats -f -o "$reps/$name" \
    python3 bench/profile_variant.py --shape ${shape/x/ } --dtype "$dtype" --variant "$variant" --runs 8 \
    > "$OUT/ncu_source/$name.log" 2>&1
  ncu -i "$reps/$name.ncu-rep" --page source --csv --print-source sass > "$OUT/ncu_source/$name-sass.csv" \
    2>> "$OUT/ncu_source/$name.log"
  echo "$case: $(wc -l < "$OUT/ncu_source/$name-sass.csv") lines; $(tail -1 "$OUT/ncu_source/$name.log")"
done
tar czf "$OUT/ncu_source.tgz" -C "$OUT" ncu_source && rm -rf "$OUT/ncu_source" "$reps"
