#!/usr/bin/env python3
"""LayerNorm backward, every variant of one build against torch and against each other, per width and
dtype, at about 16M elements: the variants under test (names ending in --new's suffixes, by default
the *_smem ones) against the fastest of the others, in the same run. Optionally under launch
configurations set by environment variables (for experiments that read them).

A configuration is a name and the environment it sets (NAME:VAR=VALUE,VAR=VALUE); the first one
(normally with none) times torch and every variant, the others only the variants whose name has one
of --only's suffixes, and the first one's fastest again (a noise check). For each case it also times
that fastest variant with dx alone (mask [True, False, False]: no dgamma/dbeta, no partials and no
second kernel), which shows what the parameters' sums cost.

Timed as bench/layer_norm_sweep.py times (one CUDA graph of back-to-back calls over rotating inputs
past L2, the median of the replays, per call); every candidate is first checked against float64 on
the benchmark's own inputs. Bytes: x and dy in, dx out; % of copy: achieved bytes/s over a 1 GiB
device-to-device copy kernel of the same run.

    python3 bench/layer_norm_bwd_configs.py --out bwd.json     # about 30 s on an H200
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _bench  # noqa: E402
import layer_norm_sweep as sweep  # noqa: E402

WIDTHS_16 = [256, 512, 768, 1024, 1536, 2048, 3072, 4096, 5120, 6144, 8192, 10240, 12288, 16384, 24576, 32768, 65536]


def parse_config(text):
    name, _, env = text.partition(":")
    pairs = dict(kv.split("=", 1) for kv in env.split(",") if kv)
    return name, pairs


def set_env(pairs, all_vars):
    for var in all_vars:
        os.environ.pop(var, None)
    os.environ.update(pairs)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--dtypes", nargs="+", default=["bfloat16", "float16", "float32"])
    ap.add_argument("--widths", nargs="+", type=int, default=WIDTHS_16)
    ap.add_argument("--widths-fp32", nargs="+", type=int, default=[1024, 2048, 4096, 8192, 16384, 32768])
    ap.add_argument("--widths-fp16", nargs="+", type=int, default=[1024, 2048, 4096, 8192, 16384, 32768])
    ap.add_argument("--elements", type=int, default=1 << 24)
    ap.add_argument("--configs", nargs="+", default=["base:"])
    ap.add_argument("--only", nargs="+", default=["_smem"], help="suffixes of the variants later configs time")
    ap.add_argument("--new", nargs="+", default=["_smem"],
                    help="suffixes of the variants under test: the first configuration's best is of the others")
    ap.add_argument("--reps", type=int, default=11)
    args = ap.parse_args()

    import torch

    import hfnn

    props = torch.cuda.get_device_properties(0)
    meta = {"gpu": props.name, "torch": torch.__version__, "hfnn": hfnn.__version__,
            "date": dt.date.today().isoformat()}
    l2 = props.L2_cache_size

    timed = _bench.graph_timer(args.reps)

    copy_tbps = _bench.copy_tbps(timed)
    print(f"{props.name}, torch {torch.__version__}: copy {copy_tbps:.2f} TB/s", flush=True)
    configs = [parse_config(c) for c in args.configs]
    all_vars = sorted({v for _, pairs in configs for v in pairs})
    variants = hfnn.layer_norm_variants()["bwd"]
    later = [v for v in variants if any(v.endswith(s) for s in args.only)]

    widths = {"bfloat16": args.widths, "float16": args.widths_fp16, "float32": args.widths_fp32}
    records, t0 = [], time.perf_counter()
    for dtype_name in args.dtypes:
        dtype = getattr(torch, dtype_name)
        for cols in widths[dtype_name]:
            rows = max(1, round(args.elements / cols))
            esize = torch.empty(0, dtype=dtype).element_size()
            numel = rows * cols
            nbytes = 3 * numel * esize
            inner = max(8, min(400, math.ceil(2e9 / nbytes)))
            nsets = min(inner, max(2, math.ceil(3 * l2 / (4 * numel * esize))))
            w, b, sets = sweep.make_inputs(torch, rows, cols, dtype, nsets)
            ns, full = [cols], [True, True, True]
            x0, dy0, m0, r0 = sets[0]
            w64, b64 = w.double(), b.double()
            _, m_ref, r_ref = torch.ops.aten.native_layer_norm(x0.double(), ns, w64, b64, 1e-5)
            ref = torch.ops.aten.native_layer_norm_backward(dy0.double(), x0.double(), ns, m_ref, r_ref, w64, b64, full)

            def measure(name, config, fn, mask=full):
                rec = dict(meta, shape=[rows, cols], dtype=dtype_name, candidate=name, config=config, bytes=nbytes,
                           mask=mask, copy_TBps=round(copy_tbps, 4), **{"pass": "bwd"})
                try:
                    outs = fn(x0, dy0, m0, r0, mask)
                    err = sweep.max_rel_error(outs, [r if m else None for r, m in zip(ref, mask)])
                    us, q = timed([lambda s=sets[i % nsets]: fn(*s, mask) for i in range(inner)])
                    rec.update(median_us=round(us, 3), p20_us=round(q[0], 3), p80_us=round(q[3], 3),
                               achieved_TBps=round(nbytes / (us * 1e-6) / 1e12, 4),
                               max_error=err if math.isfinite(err) else None,
                               accurate=math.isfinite(err) and err <= sweep.TOLERANCE[dtype_name])
                except Exception as e:  # a failure is a result
                    torch.cuda.synchronize()
                    rec.update(median_us=None, failed=(str(e).splitlines() or [type(e).__name__])[0][:300])
                    print(f"  FAILED {name} [{config}] [{rows}, {cols}] {dtype_name}: {rec['failed']}", flush=True)
                records.append(rec)
                return rec

            def hfnn_fn(v):
                return lambda x, dy, m, r, mask: torch.ops.hfnn.layer_norm_bwd(dy, x, ns, m, r, w, b, mask, v)

            line = []
            best_base = None
            for ci, (cname, pairs) in enumerate(configs):
                set_env(pairs, all_vars)
                # later configurations: their variants, and the first one's best again (a noise check,
                # or the change where a variable acts on every variant)
                names = variants if ci == 0 else later + ([best_base["candidate"]] if best_base else [])
                recs = []
                if ci == 0:
                    t = measure("torch", cname, lambda x, dy, m, r, mask: torch.ops.aten.native_layer_norm_backward(
                        dy, x, ns, m, r, w, b, mask))
                    line.append(f"torch {t['median_us']:.1f}")
                for v in names:
                    if torch.ops.hfnn.layer_norm_supports(x0, ns, w, b, v):
                        recs.append(measure(v, cname, hfnn_fn(v)))
                ok = [r for r in recs if r.get("median_us") and r.get("accurate")]
                bad = [r["candidate"] for r in recs if r.get("median_us") and not r.get("accurate")]
                if bad:
                    print(f"  INACCURATE [{cname}] {bad}", flush=True)
                if ci == 0:
                    # the first configuration's best among the variants the later ones do not change
                    pool = [r for r in ok if not any(r["candidate"].endswith(x) for x in args.new)] or ok
                else:
                    pool = [r for r in ok if r["candidate"] in later]
                    again = next((r for r in ok if best_base and r["candidate"] == best_base["candidate"]), None)
                    if again:
                        line.append(f"{cname}/{again['candidate']} {again['median_us']:.1f}")
                best = min(pool, key=lambda r: r["median_us"], default=None)
                if best:
                    pct = best["achieved_TBps"] / copy_tbps
                    line.append(f"{cname} {best['median_us']:.1f} {pct:4.0%} {best['candidate']}")
                    if ci == 0:
                        best_base = best
                        if later:
                            sm = min((r for r in ok if any(r["candidate"].endswith(x) for x in args.new)),
                                     key=lambda r: r["median_us"], default=None)
                            if sm:
                                line.append(f"{cname}/smem {sm['median_us']:.1f} {sm['achieved_TBps'] / copy_tbps:4.0%} "
                                            f"{sm['candidate']}")
            set_env({}, all_vars)
            if best_base:
                d = measure(best_base["candidate"], configs[0][0] + "+dx_only", hfnn_fn(best_base["candidate"]),
                            mask=[True, False, False])
                if d.get("median_us"):
                    line.append(f"dx-only {d['median_us']:.1f}")
            print(f"[{time.perf_counter() - t0:.0f} s] {dtype_name} [{rows}, {cols}]: " + " | ".join(line), flush=True)
            if args.out:
                args.out.write_text(sweep.dump(records))
            del sets, ref
            torch.cuda.empty_cache()
    return records


if __name__ == "__main__":
    main()
