#!/usr/bin/env python3
"""Summarizes ln_ncu_source_run.sh's CSVs (Nsight Compute's source page, one SASS instruction a row)
into one JSON record a case: instructions an element, and the shares of executed instructions and
stall samples in each stretch of code between barriers (BAR.SYNC, DEPBAR: the copy into shared
memory, the rows, the stores) and by opcode.

    tar xzf OUT/ncu_source.tgz -C DIR
    python3 bench/experiments/ln_ncu_source_summary.py --out bench/results/layer_norm_flat_ncu_source-h100.json \\
        --build b43c9ef DIR/ncu_source/*-sass.csv
"""
import argparse
import collections
import csv
import datetime
import json
import os
import sys

ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
ap.add_argument("csvs", nargs="+", help="VARIANT-DTYPE-ROWSxD-sass.csv files")
ap.add_argument("--out", required=True)
ap.add_argument("--build", required=True, help="the commit the profiled library was built from")
ap.add_argument("--gpu", default="NVIDIA H100 80GB HBM3")
ap.add_argument("--torch", default="2.11.0+cu130")
ap.add_argument("--date", default=datetime.date.today().isoformat())
args = ap.parse_args()


def opcode(source):
    words = source.split()
    op = words[1] if words[0].startswith("@") else words[0]  # past a predicate
    return op.split(".")[0]


records = []
for path in args.csvs:
    rows = list(csv.reader(open(path)))
    columns = ("Source", "Instructions Executed", "Warp Stall Sampling (All Samples)")
    if len(rows) < 3 or len(rows[0]) < 2 or not all(c in rows[1] for c in columns):
        sys.exit(f"{path}: not ncu's source page of one kernel "
                 "(ncu -i REPORT --page source --csv --print-source sass): run bench/experiments/ln_ncu_source_run.sh")
    kernel, header, data = rows[0][1], rows[1], [r for r in rows[2:] if len(r) > 2]
    src, ex, smp = (header.index(c) for c in columns)
    total, samples = sum(int(r[ex]) for r in data), sum(int(r[smp]) for r in data)
    stretches = collections.defaultdict(lambda: {"from_instruction": None, "static_instructions": 0, "e": 0, "s": 0})
    by_op, by_op_samples = collections.Counter(), collections.Counter()
    k = 0
    for r in data:
        text = r[src].strip()
        st = stretches[k]
        st["from_instruction"] = st["from_instruction"] or text
        st["static_instructions"] += 1
        st["e"] += int(r[ex])
        st["s"] += int(r[smp])
        if text:
            by_op[opcode(text)] += int(r[ex])
            by_op_samples[opcode(text)] += int(r[smp])
        if "BAR.SYNC" in text or "DEPBAR" in text:
            k += 1
    variant, dtype, shape = os.path.basename(path).replace("-sass.csv", "").split("-")
    n_rows, cols = (int(v) for v in shape.split("x"))
    records.append({
        "gpu": args.gpu, "torch": args.torch, "date": args.date, "build": args.build, "variant": variant,
        "dtype": dtype, "shape": [n_rows, cols], "kernel": kernel, "warp_instructions": total,
        "instructions_per_element": round(total * 32 / (n_rows * cols), 2), "stall_samples": samples,
        "regions": [{"from_instruction": st["from_instruction"], "static_instructions": st["static_instructions"],
                     "instructions_pct": round(100 * st["e"] / total, 1),
                     "samples_pct": round(100 * st["s"] / samples, 1)}
                    for st in stretches.values() if st["e"] > 0.005 * total or st["s"] > 0.005 * samples],
        "opcodes_instructions_pct": {o: round(100 * c / total, 1) for o, c in by_op.most_common(20)},
        "opcodes_samples_pct": {o: round(100 * c / samples, 1) for o, c in by_op_samples.most_common(12)},
        "note": "regions: the SASS between barriers (BAR.SYNC, DEPBAR), in address order",
    })
with open(args.out, "w") as f:
    json.dump(records, f, indent=1)
print(f"wrote {len(records)} records to {args.out}")
