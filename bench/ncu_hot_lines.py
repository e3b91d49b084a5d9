#!/usr/bin/env python3
"""The SASS lines of a kernel where its warps stall most, from an Nsight Compute report:

    ncu --set full -k regex:persistent_fwd_kernel --launch-skip 2 --launch-count 1 -o fwd python3 ...
    ncu --import fwd.ncu-rep --page source --csv --print-source sass > fwd.csv
    python3 bench/ncu_hot_lines.py fwd.csv [--top 40]

Prints the lines with the most warp-stall samples, each with its share of all samples and its
instruction, then the sample totals by stall reason (the columns whose names say "Stall").
"""
import argparse
import csv
import sys


def number(v):
    try:
        return float(str(v).replace(",", ""))
    except ValueError:
        return 0.0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("csv")
    ap.add_argument("--top", type=int, default=40)
    args = ap.parse_args()
    text = open(args.csv, newline="").read().splitlines()
    start = next((i for i, l in enumerate(text) if l.startswith('"#') or "Address" in l and "Source" in l), None)
    if start is None:
        sys.exit(f"bench/ncu_hot_lines.py: {args.csv}: no source table (export with --page source --csv)")
    rows = list(csv.DictReader(text[start:]))
    if not rows:
        sys.exit(f"bench/ncu_hot_lines.py: {args.csv}: the source table has no lines")
    cols = rows[0].keys()
    samples = next((c for c in cols if "Warp Stall Sampling (All" in c), None) or \
        next((c for c in cols if "Sampling" in c), None)
    if samples is None:
        sys.exit(f"bench/ncu_hot_lines.py: no stall-sampling column among {list(cols)[:12]}...")
    total = sum(number(r[samples]) for r in rows) or 1.0
    src = next((c for c in cols if c.strip() == "Source"), None)
    addr = next((c for c in cols if "Address" in c), None)
    print(f"{len(rows)} SASS lines, {total:.0f} samples ({samples})")
    for r in sorted(rows, key=lambda r: -number(r[samples]))[: args.top]:
        print(f"{100 * number(r[samples]) / total:5.1f}%  {r.get(addr, ''):>8}  {r.get(src, '').strip()[:110]}")
    reasons = {c: sum(number(r[c]) for r in rows) for c in cols if c.startswith("stall_")}
    if reasons:
        print("samples by stall reason (\"(Not Issued)\": those where the warp issued nothing):")
        for c, v in sorted(reasons.items(), key=lambda kv: -kv[1])[:20]:
            print(f"  {v:10.0f}  {c}")


if __name__ == "__main__":
    main()
