#!/usr/bin/env python3
"""Where a LayerNorm backward call's time goes, kernel by kernel: back-to-back calls of one variant
(rotating inputs past L2), traced with torch.profiler (CUPTI), with and without dgamma/dbeta (dx
alone: mask [True, False, False]). Per case, the medians over the calls: the main kernel's duration,
the partials' reduction's (reduce_partials, or the column sums of the *_cols variants), the gap
between them, the call's span (main kernel's start to its last kernel's end) and its period (one
main kernel's start to the next's: the time a call costs back to back).

    python3 bench/layer_norm_bwd_parts.py --cases bwd_wide_c16_smem:bfloat16:256x65536 --out parts.json
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

import hfnn  # noqa: F401,E402  (loads the op library)


def parse_case(text: str):
    """VARIANT:DTYPE:ROWSxCOLS, for argparse (a bad one is a one-line usage error)."""
    try:
        variant, dtype, shape = text.split(":")
        rows, cols = (int(v) for v in shape.split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give VARIANT:DTYPE:ROWSxCOLS, e.g. bwd_wide_c8_smem:bfloat16:2048x8192")
    if dtype not in ("float32", "float16", "bfloat16") or rows < 1 or cols < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: DTYPE is float32, float16 or bfloat16, ROWS and COLS positive")
    return variant, dtype, rows, cols


def trace(variant: str, dtype: str, rows: int, cols: int, mask, calls: int, sets: int):
    dt_ = getattr(torch, dtype)
    gen = torch.Generator(device="cuda").manual_seed(0)
    inputs = []
    for _ in range(sets):
        x = torch.randn(rows, cols, device="cuda", dtype=dt_, generator=gen)
        dy = torch.randn(rows, cols, device="cuda", dtype=dt_, generator=gen)
        inputs.append((x, dy))
    w = torch.randn(cols, device="cuda", dtype=dt_, generator=gen)
    b = torch.randn(cols, device="cuda", dtype=dt_, generator=gen)
    stats = [torch.ops.aten.native_layer_norm(x, [cols], w, b, 1e-5)[1:] for x, _ in inputs]

    def call(i):
        x, dy = inputs[i % sets]
        mean, rstd = stats[i % sets]
        torch.ops.hfnn.layer_norm_bwd(dy, x, [cols], mean, rstd, w, b, mask, variant)

    for i in range(2 * sets):  # warm-up: workspaces, cuBLAS-free but the first launch's setup
        call(i)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for i in range(calls):
            call(i)
        torch.cuda.synchronize()
    kernels = sorted(
        ((e.time_range.start, e.time_range.end, e.name) for e in prof.events() if e.device_type.name == "CUDA"),
        key=lambda k: k[0])
    # A call starts at each main kernel (the one the variant launches first).
    mains = [k for k in kernels if "reduce" not in k[2] and "col" not in k[2].lower()]
    main_name = statistics.mode(k[2] for k in mains)
    starts = [i for i, k in enumerate(kernels) if k[2] == main_name]
    rec = {"main_us": [], "rest_us": [], "gap_us": [], "span_us": [], "period_us": []}
    for n, i in enumerate(starts):
        j = starts[n + 1] if n + 1 < len(starts) else len(kernels)
        group = kernels[i:j]
        main = group[0]
        rest = group[1:]
        rec["main_us"].append(main[1] - main[0])
        if rest:
            rec["rest_us"].append(sum(k[1] - k[0] for k in rest))
            rec["gap_us"].append(rest[0][0] - main[1])
        rec["span_us"].append(max(k[1] for k in group) - main[0])
        if n + 1 < len(starts):
            rec["period_us"].append(kernels[starts[n + 1]][0] - main[0])
    out = {k: round(statistics.median(v), 2) if v else None for k, v in rec.items()}
    out["kernels"] = sorted({k[2][:90] for k in kernels})
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", nargs="+", required=True, type=parse_case, help="VARIANT:DTYPE:ROWSxCOLS")
    ap.add_argument("--calls", type=int, default=40)
    ap.add_argument("--sets", type=int, default=3, help="input sets rotated (past L2)")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    gpu = torch.cuda.get_device_name()
    records = []
    for variant, dtype, rows, cols in args.cases:
        for label, mask in (("all", [True, True, True]), ("dx", [True, False, False])):
            r = trace(variant, dtype, rows, cols, mask, args.calls, args.sets)
            print(f"{variant} {dtype} {rows}x{cols} {label}: main {r['main_us']} | rest {r['rest_us']} "
                  f"(gap {r['gap_us']}) | span {r['span_us']} | period {r['period_us']} us", flush=True)
            records.append({"gpu": gpu, "torch": torch.__version__, "date": dt.date.today().isoformat(),
                            "variant": variant, "dtype": dtype, "shape": [rows, cols], "outputs": label, **r})
    if args.out:
        args.out.write_text(json.dumps(records, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
