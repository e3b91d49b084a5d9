#!/usr/bin/env python3
"""LayerNorm over the width: torch, torch.compile, hfnn's built-in choice and every hfnn variant, at
about 16M elements (and smaller sizes), float32, bfloat16 and float16, forward and backward.

Each candidate is first checked against float64 (max|out - ref| / max|ref| over every output, on
the benchmark's own inputs), then timed the way bench/layer_norm.py and `hfnn tune` time: one CUDA
graph of back-to-back calls over rotating inputs larger than L2, the median of repeated replays,
per call. Bytes: forward x in + y out, backward x and dy in + dx out; "% of copy" is achieved
bytes/s over a device-to-device copy kernel measured in the same run.

The built-in choice is data made from these measurements, so it is checked on a second run: the
first (torch, torch.compile and every variant) is what `--defaults` reads; after a rebuild with
that data, the second times torch and the built-in choice ("default") at the same widths and at
widths between them, which the data never saw.

    # on a GPU machine (hfnn installed): measure (the second and third lines may run apart and merge)
    python3 bench/layer_norm_sweep.py --out sweep.json --candidates torch variants
    python3 bench/layer_norm_sweep.py --out compile.json --candidates compile --sizes 16M
    python3 bench/layer_norm_sweep.py --merge bench/results/layer_norm_sweep-h200.json sweep.json compile.json
    #   (OUT holds the parts' records alone, the last part's where two measure the same: to add to an
    #   existing OUT, name it as the first part; one that is not a part is refused)
    # anywhere: the built-in choice's data (compiled into hfnn)
    python3 bench/layer_norm_sweep.py --defaults src/layer_norm_defaults.json bench/results/layer_norm_sweep-*.json
    # on the GPU again, with hfnn rebuilt: the built-in choice against torch, measured and in between
    python3 bench/layer_norm_sweep.py --out bench/results/layer_norm_default-h200.json --candidates torch default \
        --widths between
    # on the GPU: the floor at each size (the pass's bytes moved by torch's neg / add) beside the built-in choice
    python3 bench/layer_norm_sweep.py --out bench/results/layer_norm_floor-h100.json --candidates copy default \
        --sizes 16M 1M
    # anywhere: the verdicts and the plot (several files: the default's verdicts use its own run's torch)
    python3 bench/layer_norm_sweep.py --summarize bench/results/layer_norm_sweep-h200.json bench/results/layer_norm_default-h200.json
    python3 bench/layer_norm_sweep.py --plot bench/results/layer_norm_sweep-h200.svg bench/results/layer_norm_sweep-h200.json bench/results/layer_norm_default-h200.json
"""
from __future__ import annotations

import argparse
import datetime as dt
import fnmatch
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path

import _bench  # this folder is on sys.path when a script here runs

# Widths from 32 to 65,536: today's hidden sizes (768 ... 12,288, 25,600), powers of two, the
# seed's AlphaFold widths, and widths no 16-byte access divides (they take other kernels).
WIDTHS = [32, 33, 48, 64, 96, 100, 127, 128, 160, 192, 255, 256, 320, 384, 500, 512, 640, 768, 1000, 1023, 1024,
          1280, 1536, 2048, 2560, 3072, 4096, 4097, 5120, 6144, 7168, 8192, 10240, 12288, 12289, 14336, 16384,
          20480, 24576, 25600, 32768, 40960, 49152, 65536]
# Widths whose rows are 4- or 8-byte aligned (cols = 2 mod 4 or 4 mod 8): in 16-bit they take other
# kernels than 16-byte rows and odd ones (torch's vectorize at 8 bytes), in fp32 the 2 mod 4 ones
# too. The built-in choice uses a measurement only for widths aligned like it and within 4x, so
# these cover 32 to 65,536 for each class at that spacing ('align' in --widths; in 'sweep').
ALIGN_WIDTHS = [34, 36, 98, 402, 1500, 1602, 4100, 6402, 12300, 25602, 32772, 65538]
# Widths the data never saw, for checking the built-in choice: between each pair of WIDTHS (the
# geometric mean, rounded to a multiple of 8 where both neighbours are), and a few odd ones.
def between_widths():
    out = set()
    for a, b in zip(WIDTHS, WIDTHS[1:]):
        m = math.sqrt(a * b)
        w = int(round(m / 8)) * 8 if a % 8 == 0 and b % 8 == 0 else int(round(m))
        if a < w < b:
            out.add(w)
    return sorted(out | {77, 333, 2999, 9001})


SIZES = {"16M": 1 << 24, "1M": 1 << 20, "64K": 1 << 16}
CANDIDATES = ("torch", "compile", "default", "variants", "copy")
DTYPES = ["float32", "bfloat16", "float16"]
# Candidates that are not hfnn variants.
REFERENCES = ("torch", "torch.compile", "default", "copy")
# A variant enters the built-in choice's ranking only when faster than torch by more than this.
MARGIN = 0.03
# Variants within this fraction of a point's fastest are tied there (a variant's time at one point
# moves by a few per cent from run to run: 1M fp16 at 2,048 columns, 6.93 us in one sweep and 7.30
# in the next). A point's ranking also answers for the widths between it and its neighbours, so
# among tied variants the first is the one that loses least at the neighbouring measured widths of
# the same row alignment and size (`tie_order`).
TIE = 0.02
# Largest error against float64 a candidate may show (max|out - ref| / max|ref|): a few ulp of the
# dtype after a row's worth of float32 arithmetic.
TOLERANCE = {"float32": 1e-4, "bfloat16": 3e-2, "float16": 4e-3}


def rows_for(width: int, size: str) -> int:
    return max(1, round(SIZES[size] / width))


# ---- measuring (GPU) -----------------------------------------------------------------------------

def compiled_pair(torch, cols, w, b, mask):
    """torch.compile of the training forward and of the backward (Inductor decomposes and fuses
    native_layer_norm_backward as AOTAutograd does in a compiled model)."""
    ns = [cols]
    cf = torch.compile(lambda x: torch.ops.aten.native_layer_norm(x, ns, w, b, 1e-5), dynamic=False)
    cb = torch.compile(lambda dy, x, m, r: torch.ops.aten.native_layer_norm_backward(dy, x, ns, m, r, w, b, mask),
                       dynamic=False)
    return cf, cb


def make_inputs(torch, rows, cols, dtype, nsets, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    w = torch.randn(cols, device="cuda", generator=g).mul_(0.5).add_(1).to(dtype)
    b = torch.randn(cols, device="cuda", generator=g).mul_(0.5).to(dtype)
    sets = []
    for _ in range(nsets):
        x = torch.randn(rows, cols, device="cuda", generator=g).mul_(2).add_(0.5).to(dtype)
        dy = torch.randn(rows, cols, device="cuda", generator=g).to(dtype)
        _, mean, rstd = torch.ops.aten.native_layer_norm(x, [cols], w, b, 1e-5)
        sets.append((x, dy, mean, rstd))
    return w, b, sets


def _prewarm(job):
    """Worker: compile one (width, dtype, size) pair, filling Inductor's on-disk caches."""
    cols, dtype_name, size = job
    import torch

    dtype = getattr(torch, dtype_name)
    rows = rows_for(cols, size)
    w, b, sets = make_inputs(torch, rows, cols, dtype, 1)
    cf, cb = compiled_pair(torch, cols, w, b, [True, True, True])
    x, dy, m, r = sets[0]
    cf(x)
    cb(dy, x, m, r)
    torch.cuda.synchronize()
    return job


def prewarm_compile(jobs, workers):
    import multiprocessing as mp

    t0 = time.perf_counter()
    with mp.get_context("spawn").Pool(workers) as pool:
        for i, job in enumerate(pool.imap_unordered(_prewarm, jobs), 1):
            if i % 10 == 0 or i == len(jobs):
                print(f"  compiled {i}/{len(jobs)} ({time.perf_counter() - t0:.0f} s)", flush=True)


def dump(records) -> str:
    """One record per line: compact, and diffs stay readable when a sweep is re-run."""
    return "[\n" + ",\n".join(json.dumps(r, separators=(",", ":")) for r in records) + "\n]\n"


def max_rel_error(outs, refs) -> float:
    worst = 0.0
    for o, r in zip(outs, refs):
        if o is None or r is None:
            continue
        o = o.double().reshape(-1)
        r = r.reshape(-1)
        if not bool(o.isfinite().all()):
            return math.inf
        scale = r.abs().max().item()
        worst = max(worst, (o - r).abs().max().item() / (scale if scale > 0 else 1.0))
    return worst


def measure(args):
    import torch

    import hfnn

    if not torch.cuda.is_available():
        sys.exit("bench/layer_norm_sweep.py: no CUDA device: the sweep measures on a GPU")
    if not hfnn.build_info().get("cuda_kernels"):
        sys.exit(f"bench/layer_norm_sweep.py: hfnn has no CUDA kernels ({hfnn.ops_error() or 'built without nvcc'})")
    props = torch.cuda.get_device_properties(0)
    meta = {"gpu": props.name, "compute_capability": f"{props.major}.{props.minor}", "torch": torch.__version__,
            "hfnn": hfnn.__version__, "date": dt.date.today().isoformat()}
    l2 = props.L2_cache_size
    variants = hfnn.layer_norm_variants()

    def picked(names):
        return [v for v in names if any(fnmatch.fnmatchcase(v, g) for g in args.variants)]

    if "variants" in args.candidates and not picked(variants["fwd"] + variants["bwd"]):
        sys.exit(f"bench/layer_norm_sweep.py: --variants {' '.join(args.variants)} matches no variant of this build; "
                 f"names look like {variants['fwd'][0]} or {variants['bwd'][0]}")

    timed = _bench.graph_timer(args.reps)

    copy_tbps = _bench.copy_tbps(timed)
    print(f"{props.name}, torch {torch.__version__}: copy {copy_tbps:.2f} TB/s, L2 {l2 >> 20} MiB", flush=True)

    want = set(args.candidates)
    if "copy" in want:  # the floor of a kernel's time in a graph replay, beside the copies
        meta["launch_us"] = round(_bench.launch_us(timed), 3)
        print(f"a one-element kernel: {meta['launch_us']} µs a call", flush=True)
    compile_on = "compile" in want
    if compile_on and args.compile_workers > 1:
        jobs = [(w, d, s) for s in args.sizes for d in args.dtypes for w in args.widths]
        print(f"pre-compiling {len(jobs)} torch.compile pairs in {args.compile_workers} processes", flush=True)
        prewarm_compile(jobs, args.compile_workers)

    records = []
    t_start = time.perf_counter()
    cases = [(s, d, w) for s in args.sizes for d in args.dtypes for w in args.widths]
    for n_case, (size, dtype_name, cols) in enumerate(cases, 1):
        dtype = getattr(torch, dtype_name)
        rows = rows_for(cols, size)
        esize = torch.empty(0, dtype=dtype).element_size()
        numel = rows * cols
        per_call = {"fwd": 2 * numel * esize, "bwd": 3 * numel * esize}
        inner = max(8, min(400, math.ceil(args.graph_bytes / per_call["bwd"])))
        nsets = min(inner, max(2, math.ceil(3 * l2 / (4 * numel * esize))))
        w, b, sets = make_inputs(torch, rows, cols, dtype, nsets)
        ns, mask = [cols], [True, True, True]
        # float64 reference on the first set.
        x0, dy0, m0, r0 = sets[0]
        w64, b64 = w.double(), b.double()
        y_ref, m_ref, r_ref = torch.ops.aten.native_layer_norm(x0.double(), ns, w64, b64, 1e-5)
        d_ref = torch.ops.aten.native_layer_norm_backward(dy0.double(), x0.double(), ns, m_ref, r_ref, w64, b64, mask)
        refs = {"fwd": (y_ref,), "bwd": d_ref}

        fwd, bwd, ran = {}, {}, {}
        if "torch" in want:
            fwd["torch"] = lambda x: torch.ops.aten.native_layer_norm(x, ns, w, b, 1e-5)
            bwd["torch"] = lambda x, dy, m, r: torch.ops.aten.native_layer_norm_backward(dy, x, ns, m, r, w, b, mask)
        if "default" in want:
            fwd["default"] = lambda x: torch.ops.hfnn.layer_norm_fwd(x, ns, w, b, 1e-5, "")
            bwd["default"] = lambda x, dy, m, r: torch.ops.hfnn.layer_norm_bwd(dy, x, ns, m, r, w, b, mask, "")
            ran = {p_: torch.ops.hfnn.layer_norm_default(x0, ns, w, b, p_ == "bwd") for p_ in ("fwd", "bwd")}
        if "variants" in want:
            for v in picked(variants["fwd"]):
                if torch.ops.hfnn.layer_norm_supports(x0, ns, w, b, v):
                    fwd[v] = lambda x, v=v: torch.ops.hfnn.layer_norm_fwd(x, ns, w, b, 1e-5, v)
            for v in picked(variants["bwd"]):
                if torch.ops.hfnn.layer_norm_supports(x0, ns, w, b, v):
                    bwd[v] = lambda x, dy, m, r, v=v: torch.ops.hfnn.layer_norm_bwd(dy, x, ns, m, r, w, b, mask, v)
        if "copy" in want:  # the same bytes moved by an elementwise kernel of torch's, timed the same way
            fwd["copy"] = lambda x: torch.neg(x)  # 1 in, 1 out: the forward's bytes
            bwd["copy"] = lambda x, dy, m, r: torch.add(x, dy)  # 2 in, 1 out: the backward's
        if compile_on:
            torch._dynamo.reset()
            cf, cb = compiled_pair(torch, cols, w, b, mask)
            fwd["torch.compile"] = cf
            bwd["torch.compile"] = lambda x, dy, m, r: cb(dy, x, m, r)

        jobs = [("fwd", name, fn) for name, fn in fwd.items()] + [("bwd", name, fn) for name, fn in bwd.items()]
        for pass_, name, fn in jobs:
            rec = dict(meta, shape=[rows, cols], size=size, dtype=dtype_name, candidate=name, bytes=per_call[pass_],
                       copy_TBps=round(copy_tbps, 4), **{"pass": pass_})
            if name == "default":
                rec["ran"] = ran[pass_]  # the kernel the built-in choice runs here
            try:
                if name == "copy":
                    err = float("nan")  # no LayerNorm: nothing to check
                elif pass_ == "fwd":
                    err = max_rel_error(fn(x0)[:1], refs["fwd"])
                else:
                    err = max_rel_error(fn(x0, dy0, m0, r0), refs["bwd"])
                if pass_ == "fwd":
                    calls = [lambda s=sets[i % nsets]: fn(s[0]) for i in range(inner)]
                else:
                    calls = [lambda s=sets[i % nsets]: fn(*s) for i in range(inner)]
                us, quint = timed(calls)
                rec.update(median_us=round(us, 3), p20_us=round(quint[0], 3), p80_us=round(quint[3], 3),
                           achieved_TBps=round(per_call[pass_] / (us * 1e-6) / 1e12, 4),
                           max_error=err if math.isfinite(err) else None)
            except Exception as e:  # a failure is a result: the verdicts count it
                try:
                    torch.cuda.synchronize()
                except Exception:
                    pass
                rec.update(median_us=None, failed=(str(e).splitlines() or [type(e).__name__])[0][:300])
                print(f"  FAILED {name} {pass_} [{rows}, {cols}] {dtype_name}: {rec['failed']}", flush=True)
            records.append(rec)
        mine = [r for r in records if r["shape"] == [rows, cols] and r["dtype"] == dtype_name]
        print(f"[{n_case}/{len(cases)} {time.perf_counter() - t_start:.0f} s] {case_line(mine)}", flush=True)
        if args.out:  # what is measured so far survives a run cut short
            tmp = args.out.with_suffix(".part")
            tmp.write_text(dump(records))
            os.replace(tmp, args.out)
        del sets, fwd, bwd, jobs, refs, y_ref, d_ref
        torch.cuda.empty_cache()
    return records


def case_line(recs) -> str:
    if not recs:
        return ""
    r0 = recs[0]
    line = f"{r0['size']:>3} {str(r0['shape']):<16} {r0['dtype']:<8}"
    for p in ("fwd", "bwd"):
        mine = [r for r in recs if r["pass"] == p and r.get("median_us")]
        get = lambda c: next((r for r in mine if r["candidate"] == c), None)  # noqa: E731
        best = min((r for r in mine if r["candidate"] not in REFERENCES), key=lambda r: r["median_us"], default=None)
        t, c, d = get("torch"), get("torch.compile"), get("default")
        pct = lambda r: f"{r['achieved_TBps'] / r['copy_TBps']:4.0%}" if r else "   -"  # noqa: E731
        line += (f" | {p} torch {t['median_us'] if t else float('nan'):8.1f} {pct(t)}"
                 f" compile {c['median_us'] if c else float('nan'):8.1f}"
                 f" default {d['median_us'] if d else float('nan'):8.1f}"
                 f" best {best['median_us'] if best else float('nan'):8.1f} {pct(best)} {best['candidate'] if best else '-'}")
    return line


# ---- the built-in choice's data ------------------------------------------------------------------

def gpu_cc(rec) -> str:
    if "compute_capability" in rec:
        return rec["compute_capability"]
    name = rec["gpu"]
    return "9.0" if ("H100" in name or "H200" in name) else ""


def alignment_class(dtype: str, cols: int) -> int:
    """The row's alignment in bytes, up to 16, as src/layer_norm_select.cpp's alignment_class: a
    measured point answers only for widths of its own class."""
    size = 4 if dtype == "float32" else 2
    a = 1
    while a < 16 and (cols * size) % (2 * a) == 0:
        a *= 2
    return a


def neighbours(key, keys):
    """The measured points next to `key` = (dtype, pass, rows, cols) on either side: the nearest
    narrower and nearest wider width of the same dtype, pass and alignment class whose element count
    is within 2x of its own (the same sweep size); at most two."""
    dtype, pass_, rows, cols = key
    below = above = None
    for k in keys:
        d, p, r, c = k
        if (d, p) != (dtype, pass_) or c == cols or alignment_class(d, c) != alignment_class(dtype, cols):
            continue
        if abs(math.log((r * c) / (rows * cols))) > math.log(2):
            continue
        if c < cols and (below is None or c > below[3]):
            below = k
        if c > cols and (above is None or c < above[3]):
            above = k
    return [k for k in (below, above) if k is not None]


def tie_order(ok, us, near):
    """`ok` (variants faster than torch at a point, with times `us`) fastest first; but where another
    variant within TIE of the fastest loses less at the neighbouring points `near` (each a dict of
    candidate times), by more than TIE in its worst ratio to the fastest candidate there, that one
    comes first: it gives up at most TIE at the point to lose less between the point and its
    neighbours. A variant not measured at a neighbour (it does not run there) is not judged by it."""
    ranked = sorted(ok, key=lambda c: us[c])
    if len(ranked) < 2:
        return ranked

    def worst(c):
        return max((n[c] / min(n.values()) for n in near if c in n), default=1.0)

    tied = [c for c in ranked if us[c] <= (1 + TIE) * us[ranked[0]]]
    steady = min(tied, key=lambda c: (worst(c), us[c]))
    if worst(steady) < worst(ranked[0]) - TIE:
        ranked.remove(steady)
        ranked.insert(0, steady)
    return ranked


def defaults(files) -> dict:
    """Per GPU, per measured (dtype, pass, rows, cols): the variants faster than torch by more than
    MARGIN and within TOLERANCE of float64, fastest first (ties as `tie_order` says), then torch.
    Files of the same GPU add up (a later sweep of other widths, or a re-run: a candidate's times at
    one point are its median)."""
    gpus: dict[str, dict] = {}
    sources = []
    for path in files:
        records = json.loads(Path(path).read_text())
        if not records:
            print(f"bench/layer_norm_sweep.py: {path} has no records; skipped", file=sys.stderr)
            continue
        sources.append({"file": str(path), "gpu": records[0]["gpu"], "torch": records[0]["torch"],
                        "date": records[0]["date"]})
        for r in records:
            if not r.get("median_us"):
                continue
            g = gpus.setdefault(r["gpu"], {"name": r["gpu"], "compute_capability": gpu_cc(r), "times": {}})
            rows, cols = math.prod(r["shape"][:-1]), r["shape"][-1]
            # torch is the baseline, whatever its error; a variant counts only when accurate.
            accurate = r["candidate"] == "torch" or "max_error" not in r or (
                r["max_error"] is not None and r["max_error"] <= TOLERANCE[r["dtype"]])
            if accurate:
                g["times"].setdefault((r["dtype"], r["pass"], rows, cols), {}).setdefault(
                    r["candidate"], []).append(r["median_us"])
    out = {"generated_by": "bench/layer_norm_sweep.py --defaults", "margin": MARGIN, "tie": TIE, "sources": sources,
           "gpus": []}
    for g in gpus.values():
        # Each point's candidates (hfnn's built-in choice and the other references left out) at
        # their median time.
        left_out = [c for c in REFERENCES if c != "torch"] + ["hfnn"]
        medians = {key: {c: statistics.median(t) for c, t in times.items() if c not in left_out}
                   for key, times in g["times"].items() if "torch" in times}
        pts = []
        for key, us in medians.items():
            dtype, pass_, rows, cols = key
            ok = [c for c in us if c != "torch" and us[c] < (1 - MARGIN) * us["torch"]]
            near = [medians[k] for k in neighbours(key, medians)]
            pts.append({"dtype": dtype, "pass": pass_, "rows": rows, "cols": cols,
                        "ranking": tie_order(ok, us, near) + ["torch"]})
        pts.sort(key=lambda p: (p["dtype"], p["pass"], p["cols"], p["rows"]))
        out["gpus"].append({"name": g["name"], "compute_capability": g["compute_capability"], "points": pts})
    return out


def write_defaults(target: Path, files) -> None:
    data = defaults(files)
    # One point per line: diffs stay readable when a sweep is re-run.
    lines = ["{", f' "generated_by": {json.dumps(data["generated_by"])},', f' "margin": {data["margin"]},',
             f' "tie": {data["tie"]},', f' "sources": {json.dumps(data["sources"])},', ' "gpus": [']
    for i, g in enumerate(data["gpus"]):
        lines.append(f'  {{"name": {json.dumps(g["name"])}, "compute_capability": {json.dumps(g["compute_capability"])}, "points": [')
        lines += [f"   {json.dumps(p)}{',' if j + 1 < len(g['points']) else ''}" for j, p in enumerate(g["points"])]
        lines.append(f"  ]}}{',' if i + 1 < len(data['gpus']) else ''}")
    lines += [" ]", "}"]
    target.write_text("\n".join(lines) + "\n")
    n = sum(len(g["points"]) for g in data["gpus"])
    print(f"wrote {target}: {n} points for {', '.join(g['name'] for g in data['gpus'])}")


# ---- reading results -----------------------------------------------------------------------------

def by_case(records):
    cases = {}
    for r in records:
        cases.setdefault((r["size"], r["dtype"], tuple(r["shape"])), []).append(r)
    return cases


def pick(recs, pass_, cand=None):
    rs = [r for r in recs if r["pass"] == pass_ and r.get("median_us")
          and (r["candidate"] == cand if cand else r["candidate"] not in REFERENCES)]
    return min(rs, key=lambda r: r["median_us"]) if rs else None


def default_checks(records):
    """The built-in choice against torch's kernel of the same run, per case: (label, default µs,
    torch µs, what ran fwd / bwd). Where several runs checked a case (a sweep's own `default` records
    beside a later default-check's file), the newest run's stands, by date, then by its place on the
    command line: an older run timed an older built-in choice."""
    checks = {}
    runs = {}
    for r in records:
        runs.setdefault((r.get("run", 0), r["size"], r["dtype"], tuple(r["shape"])), []).append(r)
    for (run, size, dtype, shape), recs in runs.items():
        tf, tb, df, db = (pick(recs, "fwd", "torch"), pick(recs, "bwd", "torch"), pick(recs, "fwd", "default"),
                          pick(recs, "bwd", "default"))
        if tf and tb and df and db:
            when = (max(df.get("date", ""), db.get("date", "")), run)
            if (size, dtype, shape) not in checks or when > checks[(size, dtype, shape)][0]:
                checks[(size, dtype, shape)] = (when, (
                    f"D={shape[1]} rows={shape[0]} {dtype}", df["median_us"] + db["median_us"],
                    tf["median_us"] + tb["median_us"], f"{df.get('ran', '?')} / {db.get('ran', '?')}", size))
    return [check for _, (_, check) in sorted(checks.items(), key=lambda kv: (kv[0][1], kv[0][0], kv[0][2][1]))]


def summarize(records) -> str:
    r0 = records[0]
    out = [f"{r0['gpu']}, torch {r0['torch']}, {r0['date']}; copy {r0['copy_TBps']:.2f} TB/s. Per-call µs "
           "(CUDA-graph replay medians); % = achieved bytes/s over the copy; 'best' = the fastest variant (what "
           "`hfnn tune` picks); 'default' = hfnn's built-in choice (no tuned table), from its own run.\n"]
    verdicts = {"failed": [], "default_slower": [], "below_80": [], "behind_compile": []}
    standing = []  # per dtype: bench/README's "where the best variant stands"
    for dtype in DTYPES:
        cases = {k: v for k, v in by_case(records).items() if k[1] == dtype and k[0] == "16M"}
        if not any(pick(v, "fwd") for v in cases.values()):
            continue
        out.append(f"\n### {dtype}, about 16M elements\n")
        out.append("| D | rows | torch fwd+bwd | torch.compile | best variant fwd+bwd (fwd / bwd) | best vs torch | "
                   "best vs compile | best % of copy fwd / bwd | torch % fwd / bwd |")
        out.append("|---|---|---|---|---|---|---|---|---|")
        # (D, aligned, fwd %, bwd %, best vs torch, best vs compile or None)
        rows = []
        for (size, _, shape), recs in sorted(cases.items(), key=lambda kv: kv[0][2][1]):
            # The best variant against torch of its own run (a default-check run has torch too).
            variant_runs = {r.get("run", 0) for r in recs if r["candidate"] not in REFERENCES}
            same_run = [r for r in recs if r.get("run", 0) in variant_runs or r["candidate"] == "torch.compile"]
            tf, tb = pick(same_run, "fwd", "torch"), pick(same_run, "bwd", "torch")
            cf, cb = pick(recs, "fwd", "torch.compile"), pick(recs, "bwd", "torch.compile")
            bf, bb = pick(recs, "fwd"), pick(recs, "bwd")
            if not (tf and tb and bf and bb):
                continue
            torch_us = tf["median_us"] + tb["median_us"]
            comp_us = cf["median_us"] + cb["median_us"] if cf and cb else None
            best_us = bf["median_us"] + bb["median_us"]
            pct = lambda r: r["achieved_TBps"] / r["copy_TBps"]  # noqa: E731
            out.append(f"| {shape[1]} | {shape[0]} | {torch_us:.1f} | {f'{comp_us:.1f}' if comp_us else '—'} | "
                       f"{best_us:.1f} ({bf['candidate']} / {bb['candidate']}) | {torch_us / best_us:.2f}x | "
                       f"{f'{comp_us / best_us:.2f}x' if comp_us else '—'} | {pct(bf):.0%} / {pct(bb):.0%} | "
                       f"{pct(tf):.0%} / {pct(tb):.0%} |")
            aligned = shape[1] * (4 if dtype == "float32" else 2) % 16 == 0
            rows.append((shape[1], aligned, pct(bf), pct(bb), torch_us / best_us, comp_us / best_us if comp_us else None))
            label = f"D={shape[1]} {dtype}"
            if pct(bf) < 0.8 or pct(bb) < 0.8:
                verdicts["below_80"].append(f"{label}: fwd {pct(bf):.0%}, bwd {pct(bb):.0%}")
        if rows:
            standing.append((dtype, rows))
    for aligned, which in ((True, "rows 16-byte aligned; torch.compile and torch over every width"),
                           (False, "rows not 16-byte aligned; torch.compile and torch over those")):
        if not standing:
            break
        out.append(f"\n### Where the best variant stands (16M elements; % of copy over {which})\n")
        out.append("| dtype | widths at >= 80%, fwd and bwd | forward at >= 80% | backward at >= 80% | best fwd / bwd "
                   "range | fwd+bwd faster than torch.compile | best vs torch, median |")
        out.append("|---|---|---|---|---|---|---|")
        out += [standing_row(dtype, rows, aligned) for dtype, rows in standing]
    out += compile_lines(records, verdicts["behind_compile"])
    out += floor_lines(records)
    checks = default_checks(records)
    if checks:
        out.append("\n### The built-in choice against torch (fwd+bwd µs, same run)\n")
        out.append("| case | size | torch | default | default vs torch | runs (fwd / bwd) |")
        out.append("|---|---|---|---|---|---|")
        for label, d_us, t_us, ran, size in checks:
            out.append(f"| {label} | {size} | {t_us:.1f} | {d_us:.1f} | {t_us / d_us:.2f}x | {ran} |")
            if d_us > t_us / 0.97:
                verdicts["default_slower"].append(f"{label}: default {d_us:.1f} µs vs torch {t_us:.1f} ({ran})")
    for r in records:
        if r.get("failed"):
            verdicts["failed"].append(f"{r['candidate']} {r['pass']} {r['shape']} {r['dtype']}: {r['failed']}")
    out.append("\n### Targets\n")
    titles = {"failed": "no candidate fails", "default_slower": "the built-in choice is at least 0.97x torch (fwd+bwd)",
              "below_80": "the best variant reaches 80% of copy bandwidth, fwd and bwd (16M elements)",
              "behind_compile": "the best variant beats torch.compile, fwd+bwd (1M elements and more)"}
    for key, title in titles.items():
        misses = verdicts[key]
        if (key == "default_slower" and not checks) or (key == "below_80" and not standing) or (
                key == "behind_compile" and not any(r["candidate"] == "torch.compile" and SIZES[r["size"]] >= SIZES["1M"]
                                                     for r in records)):
            out.append(f"- not measured: {title}")
            continue
        out.append(f"- {'met' if not misses else f'**not met** ({len(misses)})'}: {title}")
        out += [f"  - {m}" for m in misses]
    return "\n".join(out) + "\n"


def compile_lines(records, misses) -> list:
    """Where torch.compile was timed: per size and dtype, at how many widths the best variant (and
    hfnn's built-in choice, where its run is there) is faster fwd+bwd, and the narrowest margin.
    Every width of 1M elements or more the best variant does not beat is added to `misses`."""
    groups = {}
    for (size, dtype, shape), recs in by_case(records).items():
        cf, cb = pick(recs, "fwd", "torch.compile"), pick(recs, "bwd", "torch.compile")
        bf, bb = pick(recs, "fwd"), pick(recs, "bwd")
        if not (cf and cb and bf and bb):
            continue
        df, db = pick(recs, "fwd", "default"), pick(recs, "bwd", "default")
        comp, best = cf["median_us"] + cb["median_us"], bf["median_us"] + bb["median_us"]
        dflt = df["median_us"] + db["median_us"] if df and db else None
        groups.setdefault((size, dtype), []).append((shape[1], comp / best, comp / dflt if dflt else None))
        if SIZES[size] >= SIZES["1M"] and best >= comp:
            misses.append(f"D={shape[1]} {dtype} {size}: {best:.1f} vs {comp:.1f} µs")
    if not groups:
        return []
    out = ["\n### Against torch.compile at each size (fwd+bwd)\n",
           "torch.compile's time over hfnn's: the best variant's (what `hfnn tune` picks) and the built-in choice's "
           "(where its run is in the data); above 1x hfnn is faster.\n",
           "| size | dtype | widths | best variant faster | best vs compile, min (D) / median | built-in choice faster | "
           "built-in vs compile, min (D) |",
           "|---|---|---|---|---|---|---|"]
    for (size, dtype), rows in sorted(groups.items(), key=lambda kv: (list(SIZES).index(kv[0][0]), DTYPES.index(kv[0][1]))):
        lo = min(rows, key=lambda r: r[1])
        with_d = [r for r in rows if r[2] is not None]
        lo_d = min(with_d, key=lambda r: r[2]) if with_d else None
        out.append(f"| {size} | {dtype} | {len(rows)} | {sum(1 for r in rows if r[1] > 1)} | {lo[1]:.2f}x ({lo[0]}) / "
                   f"{statistics.median(r[1] for r in rows):.2f}x | "
                   + (f"{sum(1 for r in with_d if r[2] > 1)} of {len(with_d)} | {lo_d[2]:.2f}x ({lo_d[0]}) |"
                      if with_d else "— | — |"))
    return out


def floor_lines(records) -> list:
    """Where copy records are there (--candidates copy): per size, dtype and pass, the copy of the
    pass's bytes as a share of the 1 GiB copy (the reference of every % here), the widths where even
    it is below 80% of it, and hfnn (the fastest variant, else the built-in choice) as a share of
    that copy: what is left to gain at that size, against what no kernel can."""
    groups = {}
    for (size, dtype, shape), recs in by_case(records).items():
        for pass_ in ("fwd", "bwd"):
            copy = pick(recs, pass_, "copy")
            ln = pick(recs, pass_) or pick(recs, pass_, "default")
            if copy:
                groups.setdefault((size, dtype, pass_), []).append((shape[1], copy, ln))
    if not groups:
        return []
    launch = sorted({r["launch_us"] for r in records if r.get("launch_us")})
    out = ["\n### The floor at each size: a copy of the same bytes\n",
           "A copy of the pass's bytes by torch's elementwise kernels (forward: neg, 1 in 1 out; backward: add, 2 in "
           "1 out), timed as the candidates are"
           + (f"; a one-element kernel takes {', '.join(f'{u:.2f}' for u in launch)} µs a call there" if launch else "")
           + ". 'copy' is its share of the 1 GiB copy every % here is against; 'hfnn' the fastest variant's share of "
           "it (the built-in choice's where no variant was timed).\n",
           "| size | dtype | pass | widths | copy, % of the 1 GiB copy | widths where the copy is below 80% | "
           "hfnn, % of the copy (median) |",
           "|---|---|---|---|---|---|---|"]
    def order(key):  # sizes largest first, dtypes and passes as the sweep runs them
        size, dtype, pass_ = key
        return list(SIZES).index(size), DTYPES.index(dtype), ("fwd", "bwd").index(pass_)

    for (size, dtype, pass_), rows in sorted(groups.items(), key=lambda kv: order(kv[0])):
        pct = [r[1]["achieved_TBps"] / r[1]["copy_TBps"] for r in rows]
        rel = [r[1]["median_us"] / r[2]["median_us"] for r in rows if r[2]]
        below = sum(1 for p in pct if p < 0.8)
        rel_s = f"{min(rel):.0%}-{max(rel):.0%} ({statistics.median(rel):.0%})" if rel else "—"
        out.append(f"| {size} | {dtype} | {pass_} | {len(rows)} | {min(pct):.0%}-{max(pct):.0%} | {below} | {rel_s} |")
    return out


def standing_row(dtype, rows, aligned=True) -> str:
    """One dtype's line of summarize's standing table from its rows (D, 16-byte aligned, fwd % of
    copy, bwd %, best vs torch, best vs torch.compile or None): the 80% counts and ranges over the
    widths whose rows are 16-byte aligned (`aligned`), or over the others, which have kernels of
    their own (a table each); the torch.compile count and the median against torch over every
    width in the first table, over the others alone in the second."""
    al = [r for r in rows if r[1] == aligned]
    if not al:
        return f"| {dtype} | no width | | | | | |"
    f80 = sum(1 for r in al if r[2] >= 0.8)
    b80 = sum(1 for r in al if r[3] >= 0.8)
    both = sum(1 for r in al if r[2] >= 0.8 and r[3] >= 0.8)
    rng = (f"{min(r[2] for r in al):.0%}-{max(r[2] for r in al):.0%} / {min(r[3] for r in al):.0%}-"
           f"{max(r[3] for r in al):.0%}") if al else "—"
    scope = rows if aligned else al
    timed = [r for r in scope if r[5] is not None]
    wins = sum(1 for r in timed if r[5] > 1)
    return (f"| {dtype} | {both} of {len(al)} | {f80} | {b80} | {rng} | "
            f"{f'{wins} of {len(timed)}' if timed else 'not measured'} | "
            f"{statistics.median(r[4] for r in scope):.2f}x over {len(scope)} widths |")


def compare(base, new) -> str:
    """Two runs of the same candidates (a change against its baseline, measured back to back on one
    machine): per candidate, size, dtype and pass, the base/new time ratio at the median and its
    extremes over the widths (above 1: the change is faster), then each width's. Candidates or rows
    the change does not touch are the control: their ratios show how far the two runs agree."""
    key = lambda r: (r["candidate"], r["size"], r["dtype"], r["pass"], r["shape"][-1])
    times = {key(r): r["median_us"] for r in base if "median_us" in r}
    groups = {}
    for r in new:
        k = key(r)
        if "median_us" in r and k in times:
            groups.setdefault(k[:4], []).append((times[k] / r["median_us"], k[4]))
    if not groups:
        return "no candidate, size, dtype, pass and width measured in both runs\n"
    lines = ["| candidate | size | dtype | pass | widths | base/new median | min (D) | max (D) |",
             "|---|---|---|---|---|---|---|---|"]
    for g, v in sorted(groups.items()):
        lo, hi = min(v), max(v)
        lines.append(f"| {' | '.join(g)} | {len(v)} | {statistics.median(x for x, _ in v):.3f} | "
                     f"{lo[0]:.3f} ({lo[1]}) | {hi[0]:.3f} ({hi[1]}) |")
    lines.append("")
    for g, v in sorted(groups.items()):
        lines.append(f"{' '.join(g)}: " + " ".join(f"{d}:{x:.2f}" for x, d in sorted(v, key=lambda t: t[1])))
    return "\n".join(lines) + "\n"


def plot(records, target: Path) -> None:
    """SVG: % of copy bandwidth against width (log scale), per dtype and pass, for torch,
    torch.compile, the built-in choice and the best variant, at about 16M elements."""
    series = [("torch", "#888888"), ("torch.compile", "#e69f00"), ("default", "#009e73"), ("best variant", "#0072b2")]
    dtypes = [d for d in DTYPES if any(r["dtype"] == d for r in records)]
    pw, ph, ml, mt, gap = 420, 230, 52, 40, 34
    width = ml + 2 * (pw + gap) + 20
    height = mt + len(dtypes) * (ph + gap + 20) + 40
    xmin, xmax = math.log2(32), math.log2(65536)
    svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" font-size="11">',
           f'<rect width="{width}" height="{height}" fill="white"/>',
           f'<text x="{ml}" y="18" font-size="13">LayerNorm, % of copy bandwidth against width D (about 16M elements): '
           f'{records[0]["gpu"]}, torch {records[0]["torch"]}, {records[0]["date"]}; dots: rows not 16-byte aligned</text>']
    for i, (name, color) in enumerate(series):
        svg.append(f'<rect x="{ml + i * 130}" y="26" width="12" height="3" fill="{color}"/>'
                   f'<text x="{ml + i * 130 + 16}" y="31">{name}</text>')
    cases = {k: v for k, v in by_case(records).items() if k[0] == "16M"}
    for row, dtype in enumerate(dtypes):
        for col, pass_ in enumerate(("fwd", "bwd")):
            x0, y0 = ml + col * (pw + gap), mt + 20 + row * (ph + gap + 20)
            svg.append(f'<text x="{x0}" y="{y0 - 6}" font-size="12">{dtype} {"forward" if pass_ == "fwd" else "backward"}</text>')
            svg.append(f'<rect x="{x0}" y="{y0}" width="{pw}" height="{ph}" fill="none" stroke="#ccc"/>')
            for pct in (0, 20, 40, 60, 80, 100):
                y = y0 + ph - ph * pct / 110
                style = 'stroke="#999" stroke-dasharray="4 3"' if pct == 80 else 'stroke="#eee"'
                svg.append(f'<line x1="{x0}" y1="{y:.1f}" x2="{x0 + pw}" y2="{y:.1f}" {style}/>'
                           f'<text x="{x0 - 4}" y="{y + 4:.1f}" text-anchor="end">{pct}%</text>')
            for e in range(5, 17, 2):
                x = x0 + pw * (e - xmin) / (xmax - xmin)
                svg.append(f'<text x="{x:.1f}" y="{y0 + ph + 14}" text-anchor="middle">{2 ** e}</text>')
            esize = {"float32": 4, "bfloat16": 2, "float16": 2}[dtype]
            for name, color in series:
                pts = []
                for (_, d, shape), recs in sorted(cases.items(), key=lambda kv: kv[0][2][1]):
                    if d != dtype:
                        continue
                    r = pick(recs, pass_) if name == "best variant" else pick(recs, pass_, name)
                    if r:
                        x = x0 + pw * (math.log2(shape[1]) - xmin) / (xmax - xmin)
                        y = y0 + ph - ph * min(110.0, 100 * r["achieved_TBps"] / r["copy_TBps"]) / 110
                        if shape[1] * esize % 16 == 0:  # lines join widths whose rows are 16-byte aligned
                            pts.append(f"{x:.1f},{y:.1f}")
                        else:  # the others are dots: other kernels, another curve
                            svg.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="2.2" fill="{color}"/>')
                if pts:
                    svg.append(f'<polyline fill="none" stroke="{color}" stroke-width="1.6" points="{" ".join(pts)}"/>')
    svg.append("</svg>")
    target.write_text("\n".join(svg) + "\n")
    print(f"wrote {target}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, help="measure, and write the records here")
    ap.add_argument("--dtypes", nargs="+", default=DTYPES, choices=DTYPES)
    ap.add_argument("--sizes", nargs="+", default=list(SIZES), choices=list(SIZES))
    ap.add_argument("--widths", nargs="+", default=["sweep"],
                    help="widths, or 'sweep' (the 56 of the sweep), 'align' (its 12 with 4- or 8-byte rows) and "
                         "'between' (41 the sweep does not measure)")
    ap.add_argument("--candidates", nargs="+", default=["torch", "variants"], choices=CANDIDATES,
                    help="torch, compile (torch.compile), default (hfnn's built-in choice), "
                         "variants (every hfnn variant that takes the shape), copy (the pass's bytes moved by torch's "
                         "elementwise kernels: neg forward, add backward; the floor at this size, not LayerNorm)")
    ap.add_argument("--variants", nargs="+", default=["*"], metavar="GLOB",
                    help="with --candidates variants: only the variants whose names match one of these (fnmatch), "
                         "e.g. '*_tma_*' to measure new variants alone and --merge them into a sweep")
    ap.add_argument("--compile-workers", type=int, default=8, help="processes that pre-compile in parallel")
    ap.add_argument("--reps", type=int, default=11, help="graph replays per candidate (median taken)")
    ap.add_argument("--graph-bytes", type=float, default=1e9, help="bytes one graph replay moves at least")
    ap.add_argument("--merge", nargs="+", type=Path, metavar=("OUT", "PART"), help="merge result files into OUT")
    ap.add_argument("--defaults", nargs="+", type=Path, metavar=("OUT", "SWEEP"),
                    help="write the built-in choice's data (OUT) from sweep results")
    ap.add_argument("--plot", nargs="+", type=Path, metavar=("SVG", "SWEEP"))
    ap.add_argument("--summarize", nargs="+", type=Path, metavar="SWEEP")
    ap.add_argument("--compare", nargs=2, type=Path, metavar=("BASE", "NEW"),
                    help="a change against its baseline: two runs of the same candidates, measured back to back "
                         "on one machine (a fresh one drifts more than most changes move), base/new time ratios")
    args = ap.parse_args()

    def load(path):
        try:
            return json.loads(Path(path).read_text())
        except (OSError, json.JSONDecodeError) as e:
            sys.exit(f"bench/layer_norm_sweep.py: cannot read {path}: {e}")

    def load_runs(paths):
        """Several result files as one list, each record tagged with its file (its run)."""
        return [dict(r, run=i) for i, p in enumerate(paths) for r in load(p)]

    widths = []
    for w in args.widths:
        if w == "sweep":
            widths += WIDTHS + ALIGN_WIDTHS
        elif w == "align":
            widths += ALIGN_WIDTHS
        elif w == "between":
            widths += between_widths()
        elif w.isdigit() and int(w) > 0:
            widths.append(int(w))
        else:
            sys.exit(f"bench/layer_norm_sweep.py: --widths {w}: expected a positive integer, 'sweep' or 'between'")
    args.widths = sorted(set(widths))

    if args.defaults:
        if len(args.defaults) < 2:
            sys.exit("bench/layer_norm_sweep.py: --defaults OUT SWEEP [SWEEP ...]")
        for p in args.defaults[1:]:
            load(p)
        write_defaults(args.defaults[0], args.defaults[1:])
    elif args.merge:
        if len(args.merge) < 2:
            sys.exit("bench/layer_norm_sweep.py: --merge OUT PART [PART ...]")
        out = args.merge[0]
        if out.exists() and not any(p.exists() and p.samefile(out) for p in args.merge[1:]):
            sys.exit(f"bench/layer_norm_sweep.py: --merge: {out} exists and is not among the parts, so its records "
                     f"would be lost: name it as a part too (--merge {out} {out} ...) or write elsewhere")
        merged = {}
        for p in args.merge[1:]:
            for r in load(p):
                merged[(r["gpu"], r["size"], r["dtype"], tuple(r["shape"]), r["pass"], r["candidate"])] = r
        args.merge[0].write_text(dump(list(merged.values())))
        print(f"wrote {len(merged)} records to {args.merge[0]}")
    elif args.plot:
        if len(args.plot) < 2:
            sys.exit("bench/layer_norm_sweep.py: --plot SVG SWEEP [SWEEP ...]")
        plot(load_runs(args.plot[1:]), args.plot[0])
    elif args.summarize:
        print(summarize(load_runs(args.summarize)), end="")
    elif args.compare:
        print(compare(load(args.compare[0]), load(args.compare[1])), end="")
    elif args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        records = measure(args)
        args.out.write_text(dump(records))
        print(f"wrote {len(records)} records to {args.out}")
        print(summarize(records), end="")
    else:
        ap.print_help()
        sys.exit(2)


if __name__ == "__main__":
    main()
