#!/usr/bin/env python3
"""LayerNorm forward variants of one build under launch configurations set by environment variables
(for experiments that read them), in rounds: every configuration in turn at each width, then again
(base, new, base2, new2 when given as such), so a configuration's change is read against the same
run's noise. About 16M elements; every candidate checked against float64 first.

    python3 bench/experiments/ln_fwd_configs.py --configs base:HFNN_LN_FWD_ONCE=0 once: \\
        --variants fwd_wide_c1 --widths 2560 4096 --out fwd.json

Timed as bench/layer_norm_sweep.py times (one CUDA graph of back-to-back calls over rotating inputs
past L2, the median of the replays, per call); bytes x in and y out.
"""
from __future__ import annotations

import argparse
import datetime as dt
import fnmatch
import json
import math
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import _bench  # noqa: E402
import layer_norm_sweep as sweep  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--dtypes", nargs="+", default=["bfloat16", "float16"])
    ap.add_argument("--widths", nargs="+", type=int, required=True)
    ap.add_argument("--elements", type=int, default=1 << 24)
    ap.add_argument("--configs", nargs="+", default=["base:"], help="NAME:VAR=VALUE,VAR=VALUE ...")
    ap.add_argument("--variants", nargs="+", default=["fwd_*"], help="globs of forward variant names")
    ap.add_argument("--reps", type=int, default=11)
    args = ap.parse_args()

    import torch

    import hfnn

    props = torch.cuda.get_device_properties(0)
    meta = {"gpu": props.name, "torch": torch.__version__, "hfnn": hfnn.__version__, "date": dt.date.today().isoformat()}
    l2 = props.L2_cache_size

    timed = _bench.graph_timer(args.reps)

    copy_tbps = _bench.copy_tbps(timed)
    print(f"{props.name}, torch {torch.__version__}: copy {copy_tbps:.2f} TB/s", flush=True)
    configs = []
    for text in args.configs:
        name, _, env = text.partition(":")
        configs.append((name, dict(kv.split("=", 1) for kv in env.split(",") if kv)))
    all_vars = sorted({v for _, pairs in configs for v in pairs})
    names = [v for v in hfnn.layer_norm_variants()["fwd"] if any(fnmatch.fnmatch(v, g) for g in args.variants)]
    records, t0 = [], time.perf_counter()
    for dtype_name in args.dtypes:
        dtype = getattr(torch, dtype_name)
        for cols in args.widths:
            rows = max(1, round(args.elements / cols))
            esize = torch.empty(0, dtype=dtype).element_size()
            nbytes = 2 * rows * cols * esize
            inner = max(8, min(400, math.ceil(2e9 / nbytes)))
            nsets = min(inner, max(2, math.ceil(3 * l2 / (2 * rows * cols * esize))))
            w, b, sets = sweep.make_inputs(torch, rows, cols, dtype, nsets)
            ns = [cols]
            x0 = sets[0][0]
            ref = torch.ops.aten.native_layer_norm(x0.double(), ns, w.double(), b.double(), 1e-5)
            line = []
            for cname, pairs in configs:
                for var in all_vars:
                    os.environ.pop(var, None)
                os.environ.update(pairs)
                best = None
                for v in names:
                    if not torch.ops.hfnn.layer_norm_supports(x0, ns, w, b, v):
                        continue
                    rec = dict(meta, shape=[rows, cols], dtype=dtype_name, candidate=v, config=cname, bytes=nbytes,
                               copy_TBps=round(copy_tbps, 4), **{"pass": "fwd"})
                    fn = lambda x, v=v: torch.ops.hfnn.layer_norm_fwd(x, ns, w, b, 1e-5, v)  # noqa: E731
                    try:
                        err = sweep.max_rel_error(fn(x0)[:1], ref[:1])
                        us, q = timed([lambda s=sets[i % nsets]: fn(s[0]) for i in range(inner)])
                        rec.update(median_us=round(us, 3), p20_us=round(q[0], 3), p80_us=round(q[3], 3),
                                   achieved_TBps=round(nbytes / (us * 1e-6) / 1e12, 4),
                                   max_error=err if math.isfinite(err) else None,
                                   accurate=math.isfinite(err) and err <= sweep.TOLERANCE[dtype_name])
                        if not rec["accurate"]:
                            print(f"  INACCURATE {v} [{cname}] [{rows}, {cols}] {dtype_name}: {err}", flush=True)
                        elif best is None or us < best["median_us"]:
                            best = rec
                    except Exception as e:  # a failure is a result
                        torch.cuda.synchronize()
                        rec.update(median_us=None, failed=(str(e).splitlines() or [type(e).__name__])[0][:300])
                        print(f"  FAILED {v} [{cname}] [{rows}, {cols}] {dtype_name}: {rec['failed']}", flush=True)
                    records.append(rec)
                if best:
                    line.append(f"{cname} {best['median_us']:.1f} {best['achieved_TBps'] / copy_tbps:4.0%} {best['candidate']}")
            for var in all_vars:
                os.environ.pop(var, None)
            print(f"[{time.perf_counter() - t0:.0f} s] {dtype_name} [{rows}, {cols}]: " + " | ".join(line), flush=True)
            if args.out:
                args.out.write_text(json.dumps(records, indent=1))
            del sets
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
