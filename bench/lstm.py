#!/usr/bin/env python3
"""nn.LSTM per training call: cuDNN (torch's module) against hfnn's LSTM kernels (issue 12).

What it measures, per config x dtype x candidate, as a training loop calls the module (autograd
recording, CPU launches included; the median of 5 rounds of back-to-back calls):
  fwd  median ms of the forward
  bwd  median ms of the backward (forward + backward minus forward, both timed so)
and us_per_step, the same per time step (ms / steps x 1000): cuDNN pays 15-45 µs a step whatever
the size (the issue's table), which is what a persistent kernel attacks.

Candidates:
  cudnn       torch's nn.LSTM (cuDNN, as torch picks its algorithm)
  <variant>   hfnn's path with one variant for every layer, each variant hfnn::lstm_variants() lists
              whose lstm_supports() takes the shape ("persistent", "steps", "cudnn_persistent": cuDNN's
              own persistent kernel through cuDNN's RNN API, every dtype, hidden up to 1,024 on an
              H100)
  hfnn        what hfnn.nn.LSTM runs for the shape: under HFNN_DISPATCH_DB the tuned winner, else
              hfnn's built-in choice (the record's "winner" says which; "torch" where it fell back)
Before timing, each candidate's output, h_n, c_n and every gradient are compared with torch's
nn.LSTM in float64 on the GPU (same weights): max|out - ref| / max|ref| over them is max_rel_error,
and correct is whether it is within the tuner's tolerance (fp32 1e-3, fp16 1e-2, bf16 5e-2) or
twice cuDNN's own error.

Configs, [input, hidden, batch, steps] (the issue's): the seed's 985/985/4/1000, 512/512/32/256,
1024/1024/64/256, 256/256/128/100, 2048/2048/16/512; --layers and --bidirectional apply to all.

--grid times the crossover map instead: hidden 128..4096 (input = hidden) x batch 1..256 at
--grid-steps steps, cuDNN against every variant, fwd+bwd; --plot writes it as an SVG (one panel per
dtype; a cell's number is the fastest variant's speed-up over cuDNN, blue where hfnn wins, red
where the tuner should keep cuDNN); --builtin-out writes hfnn's built-in choice from it
(python/hfnn/_lstm_builtin.py: per grid point the variants at least 1.1x faster than cuDNN; a
hidden size not a multiple of 4 takes the points of its own class, which --grid-hidden measures).
float32 records carry rnn_fp32_precision (torch.backends.cudnn.rnn.fp32_precision, "tf32" by
default): cuDNN's LSTM and hfnn's GEMMs take TF32 under it alike.

The result is a JSON array, one record per config x dtype x pass x candidate: gpu, torch, date,
config ([input, hidden, batch, steps]), layers, bidirectional, dtype, pass ("fwd"/"bwd"), candidate,
median_ms, us_per_step, max_rel_error, correct, and winner for "hfnn"; weights_compacted where torch
warned during the timing that the LSTM's weights were not one contiguous buffer (cuDNN compacts them
on every call then); grid records carry "grid": true. Without --out it goes to
bench/results/lstm-<gpu>.json (lstm_grid-<gpu>.json for --grid); --json prints it on stdout too.

Needs a CUDA GPU (exits 1 with the reason on a machine without one). Without hfnn's LSTM kernels
in the op library it times cuDNN alone and says so.

Examples:
    python3 bench/lstm.py                                  # the five configs, fp32/bf16/fp16
    python3 bench/lstm.py --quick                          # two configs, short sequences, a minute
    python3 bench/lstm.py --grid --dtypes bfloat16 float32 --plot bench/results/lstm_crossover-h200.svg
    python3 bench/lstm.py --plot-from bench/results/lstm_grid-h200.json --plot /tmp/map.svg   # no GPU needed
    python3 bench/lstm.py --grid --grid-hidden 127 255 511 1023 2047 4095 --dtypes bfloat16 float32   # rows not x4
    python3 bench/lstm.py --grid --dtypes float16 --out bench/results/lstm_grid_f16-h100.json   # fp16's own map
    python3 bench/lstm.py --plot-from bench/results/lstm_grid-h100.json bench/results/lstm_grid_rows_not_x4-h100.json \
        bench/results/lstm_grid_f16-h100.json bench/results/lstm_grid_rows_not_x4_f16-h100.json \
        --builtin-out python/hfnn/_lstm_builtin.py
"""
from __future__ import annotations

import argparse
import copy
import datetime
import json
import re
import statistics
import sys
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = [[985, 985, 4, 1000], [512, 512, 32, 256], [1024, 1024, 64, 256], [256, 256, 128, 100],
           [2048, 2048, 16, 512]]
GRID_HIDDEN = [128, 256, 512, 1024, 2048, 4096]
GRID_BATCH = [1, 2, 4, 8, 16, 32, 64, 128, 256]
QUICK_GRID_HIDDEN, QUICK_GRID_BATCH = [128, 1024, 4096], [1, 16, 256]
TOLERANCE = {"float32": 1e-3, "float16": 1e-2, "bfloat16": 5e-2}  # kernels/lstm/lstm_family.cpp's gate


def gpu_slug(name: str) -> str:
    """'NVIDIA H200' -> 'h200', 'NVIDIA H100 80GB HBM3' -> 'h100': the results' file suffix."""
    m = re.search(r"\b([A-Z]+\d+[A-Za-z]*)\b", name.replace("NVIDIA", ""))
    return (m.group(1) if m else re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_")).lower()


def rel(a, b) -> float:
    return ((a.double() - b.double()).abs().max() / b.double().abs().max().clamp_min(1e-30)).item()


def sync():
    import torch

    torch.cuda.synchronize()


def wall_ms(step, round_s: float, rounds: int = 5) -> float:
    """Median per-call ms over rounds of back-to-back calls of step()."""
    for _ in range(2):
        step()
    sync()
    t0 = time.perf_counter()
    step()
    sync()
    calls = max(2, int(round_s / max(time.perf_counter() - t0, 1e-6)))
    times = []
    for _ in range(rounds):
        sync()
        t0 = time.perf_counter()
        for _ in range(calls):
            step()
        sync()
        times.append((time.perf_counter() - t0) / calls * 1e3)
    return statistics.median(times)


def candidates(torch, hfnn, m):
    """name -> fn(x) -> (y, (h_n, c_n)) for cuDNN, every variant taking the shape, and hfnn.nn.LSTM."""
    from torch import nn

    from hfnn._families import lstm as family

    torch_forward = family.torch_forward or nn.LSTM.forward
    fns = {"cudnn": lambda x: torch_forward(m, x, None)}
    if hasattr(torch.ops.hfnn, "lstm_layer_fwd"):
        for v in torch.ops.hfnn.lstm_variants():
            fns[v] = (lambda v: lambda x: hfnn.nn._lstm_run(m, x, None, v)[:2])(v)
    ours = hfnn.to_hfnn(copy.copy(m))  # shares m's parameters; only the class differs
    fns["hfnn"] = ours
    return fns


def supported(torch, m, x, name) -> bool:
    if name in ("cudnn", "hfnn"):
        return True
    xt = (x.transpose(0, 1) if m.batch_first else x).contiguous()
    return bool(torch.ops.hfnn.lstm_supports(xt, m.weight_hh_l0, name))


def errors(torch, m, fn, x, dy, ref) -> float:
    """max rel error of output, h_n, c_n and every gradient (x, each parameter) against ref."""
    for p in m.parameters():
        p.grad = None
    xl = x.detach().requires_grad_()
    y, (h, c) = fn(xl)
    torch.autograd.backward([y, h, c], [dy, *ref["dhc"]])
    got = [y, h, c, xl.grad, *(p.grad for p in m.parameters())]
    return max(rel(a, b) for a, b in zip(got, ref["values"]))


def reference(torch, m, x, dy):
    """torch's nn.LSTM in float64 on the GPU, same weights: outputs and every gradient."""
    from torch import nn

    m64 = copy.deepcopy(m).double()
    nn.LSTM.flatten_parameters(m64)
    x64 = x.detach().double().requires_grad_()
    y, (h, c) = nn.LSTM.forward(m64, x64)
    gen = torch.Generator(device="cuda").manual_seed(1)
    dhc = [torch.randn(h.shape, device="cuda", generator=gen, dtype=torch.float64) for _ in range(2)]
    torch.autograd.backward([y, h, c], [dy.double(), *dhc])
    values = [t.detach() for t in (y, h, c, x64.grad, *(p.grad for p in m64.parameters()))]
    return {"values": values, "dhc": [t.to(x.dtype) for t in dhc]}


def bench_point(torch, hfnn, args, config, dtype_name, grid=False):
    """Every candidate at one shape and dtype: records for fwd and bwd, and a printed line each."""
    from torch import nn

    input_size, hidden, batch, steps = config
    dtype = getattr(torch, dtype_name)
    torch.manual_seed(0)
    m = nn.LSTM(input_size, hidden, args.layers, batch_first=True, bidirectional=args.bidirectional, device="cuda",
                dtype=dtype)
    m.flatten_parameters()  # as .to()/.cuda() leave a model: cuDNN's weights in one buffer, no copy a call
    x = torch.randn(batch, steps, input_size, device="cuda", dtype=dtype, requires_grad=True)
    dy = torch.randn(batch, steps, hidden * (2 if args.bidirectional else 1), device="cuda", dtype=dtype)
    fns = {n: f for n, f in candidates(torch, hfnn, m).items() if supported(torch, m, x, n)}
    if grid:
        fns.pop("hfnn")
    ref = None if args.no_check else reference(torch, m, x, dy)
    errs = {n: (errors(torch, m, f, x, dy, ref) if ref else None) for n, f in fns.items()}
    tol = max(TOLERANCE[dtype_name], 2 * errs["cudnn"]) if ref else None
    winner = None
    if "hfnn" in fns:
        before = dict(hfnn.nn.lstm_calls)
        fns["hfnn"](x)
        ran = {k: v - before.get(k, 0) for k, v in hfnn.nn.lstm_calls.items() if v != before.get(k, 0)}
        winner = next(iter(ran), "?")
    meta = dict(gpu=args.gpu, torch=torch.__version__, date=args.date, config=list(config), layers=args.layers,
                bidirectional=args.bidirectional, dtype=dtype_name)
    if dtype_name == "float32":  # TF32 or not, in cuDNN's LSTM and hfnn's GEMMs alike
        meta["rnn_fp32_precision"] = torch.backends.cudnn.rnn.fp32_precision
    records = []
    for name, fn in fns.items():
        def fwd(fn=fn):
            fn(x)

        def train(fn=fn):
            torch.autograd.backward(fn(x)[0], dy)

        try:
            # torch warns (once per process, by default) where an LSTM's weights are not one
            # contiguous buffer, and cuDNN then compacts them on every call: recorded per candidate,
            # so a slow baseline says why.
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                f_ms = wall_ms(fwd, args.round_s)
                t_ms = wall_ms(train, args.round_s)
        except Exception as e:  # a candidate that fails is reported, the others still run
            print(f"  {name}: failed: {str(e).splitlines()[0][:200]}", flush=True)
            sync()
            continue
        compacted = any("contiguous chunk" in str(w.message) for w in caught)
        if compacted:
            print(f"  {name}: torch compacted the LSTM's weights on every call (not one contiguous buffer)", flush=True)
        correct = None if errs[name] is None else errs[name] <= tol
        for pass_, ms in (("fwd", f_ms), ("bwd", t_ms - f_ms)):
            rec = dict(meta, **{"pass": pass_}, candidate=name, median_ms=round(ms, 4),
                       us_per_step=round(ms * 1e3 / steps, 3), max_rel_error=errs[name], correct=correct)
            if grid:
                rec["grid"] = True
            if name == "hfnn":
                rec["winner"] = winner
            if compacted:
                rec["weights_compacted"] = True
            records.append(rec)
        flag = "" if correct is not False else f"  WRONG (error {errs[name]:.1e} > {tol:.1e})"
        print(f"{config} {dtype_name:8s} {name + ('=' + winner if name == 'hfnn' else ''):18s} "
              f"fwd {f_ms:8.3f} bwd {t_ms - f_ms:8.3f} ms  ({f_ms * 1e3 / steps:6.1f} / "
              f"{(t_ms - f_ms) * 1e3 / steps:6.1f} µs/step)"
              f"{'' if errs[name] is None else f'  err {errs[name]:.1e}'}{flag}", flush=True)
    del m, x, dy, ref
    torch.cuda.empty_cache()
    return records


def grid_totals(records):
    """{(dtype, hidden, batch): {candidate: fwd+bwd ms}} of the grid records that passed the float64
    check (or had none)."""
    total = {}
    for r in records:
        if not r.get("grid") or r.get("correct") is False:
            continue
        by = total.setdefault((r["dtype"], r["config"][1], r["config"][2]), {})
        by[r["candidate"]] = by.get(r["candidate"], 0.0) + r["median_ms"]
    return total


def speedups(records):
    """{dtype: {(hidden, batch): (best variant's cudnn/variant fwd+bwd ratio, its name)}} of grid records."""
    out = {}
    for (dtype, hidden, batch), by in grid_totals(records).items():
        base = by.get("cudnn")
        for name, ms in by.items():
            if name == "cudnn" or not base or ms <= 0:
                continue
            cell = out.setdefault(dtype, {})
            if (hidden, batch) not in cell or base / ms > cell[(hidden, batch)][0]:
                cell[(hidden, batch)] = (base / ms, name)
    return out


def svg_map(records, title: str) -> str:
    """The crossover map as plain SVG: per dtype a hidden x batch grid of the fastest variant's
    fwd+bwd speed-up over cuDNN (blue: hfnn faster, red: cuDNN faster, grey: not measured)."""
    maps = speedups(records)
    hiddens = sorted({r["config"][1] for r in records if r.get("grid")})
    batches = sorted({r["config"][2] for r in records if r.get("grid")})
    cw, ch, left, top = 52, 26, 70, 50
    pw = left + cw * len(batches) + 30
    height = top + ch * len(hiddens) + 60
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{max(pw * len(maps), 300)}" height="{height}" '
             f'font-family="sans-serif" font-size="11">',
             f'<text x="8" y="16" font-size="13">{_esc(title)}</text>']
    for i, (dtype, cells) in enumerate(sorted(maps.items())):
        x0 = i * pw
        parts.append(f'<text x="{x0 + left}" y="{top - 18}" font-size="12">{dtype}: hfnn (fastest variant) '
                     f'vs cuDNN, fwd+bwd</text>')
        for hi, hidden in enumerate(hiddens):
            y = top + ch * (len(hiddens) - 1 - hi)
            parts.append(f'<text x="{x0 + left - 6}" y="{y + ch / 2 + 4}" text-anchor="end">{hidden}</text>')
            for bi, batch in enumerate(batches):
                x = x0 + left + cw * bi
                ratio, name = cells.get((hidden, batch), (None, ""))
                fill = "#dee2e6" if ratio is None else _color(ratio)
                label = "" if ratio is None else f"{ratio:.2f}"
                parts.append(f'<rect x="{x}" y="{y}" width="{cw - 2}" height="{ch - 2}" fill="{fill}">'
                             f'<title>hidden {hidden}, batch {batch}: {label or "not measured"} {name}</title></rect>')
                parts.append(f'<text x="{x + cw / 2 - 1}" y="{y + ch / 2 + 4}" text-anchor="middle">{label}</text>')
        for bi, batch in enumerate(batches):
            parts.append(f'<text x="{x0 + left + cw * bi + cw / 2 - 1}" y="{top + ch * len(hiddens) + 14}" '
                         f'text-anchor="middle">{batch}</text>')
        parts.append(f'<text x="{x0 + left + cw * len(batches) / 2}" y="{top + ch * len(hiddens) + 32}" '
                     f'text-anchor="middle">batch (rows: hidden = input)</text>')
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


# The built-in choice (python/hfnn/_lstm_builtin.py, hfnn.nn._lstm_builtin_order) keeps a variant
# at a grid point only where it beat cuDNN fwd+bwd by this much: the grid's 100 steps are one
# length of many, and a neighbouring shape maps to the point.
BUILTIN_MARGIN = 1.1


def builtin_orders(records, margin: float = BUILTIN_MARGIN):
    """{dtype: {hidden: {batch: (variants faster than cuDNN by >= margin, fastest first)}}} of grid
    records (correct ones only); () where cuDNN keeps the point."""
    out = {}
    for (dtype, hidden, batch), by in sorted(grid_totals(records).items()):
        base = by.get("cudnn")
        if not base:
            continue
        wins = sorted((ms, name) for name, ms in by.items() if name not in ("cudnn", "hfnn") and 0 < ms <= base / margin)
        out.setdefault(dtype, {}).setdefault(hidden, {})[batch] = tuple(name for _, name in wins)
    return out


def builtin_module(records, sources) -> str:
    """python/hfnn/_lstm_builtin.py's text: builtin_orders() of the grid records, with where they came from
    (`sources`: the result files, or one)."""
    sources = [sources] if isinstance(sources, str) else list(sources)
    orders = builtin_orders(records)
    grid = [r for r in records if r.get("grid")]
    meta = {k: sorted({str(r.get(k)) for r in grid}) for k in ("gpu", "torch", "date")}
    meta["rnn_fp32_precision"] = sorted({str(r.get("rnn_fp32_precision")) for r in grid if r["dtype"] == "float32"})
    steps = sorted({r["config"][3] for r in grid})
    lines = ['"""Generated by bench/lstm.py --builtin-out: do not edit; regenerate from a new grid',
             f"(python3 bench/lstm.py --plot-from {' '.join(sources)} --builtin-out python/hfnn/_lstm_builtin.py).",
             "",
             "hfnn.nn's built-in LSTM choice (_lstm_builtin_order): per dtype, hidden size and batch of the",
             "crossover grid (bench/lstm.py --grid), the variants that beat cuDNN fwd+bwd there by at least",
             f"{BUILTIN_MARGIN}x, fastest first; () where cuDNN keeps the point. A hidden size takes the",
             "points of its own class: a multiple of 4, or not.",
             '"""',
             f"SOURCE = {sources if len(sources) > 1 else sources[0]!r}",
             f"GPU = {meta['gpu']!r}",
             f"TORCH = {meta['torch']!r}",
             f"DATE = {meta['date']!r}",
             f"RNN_FP32_PRECISION = {meta['rnn_fp32_precision']!r}",
             f"STEPS = {steps!r}",
             f"MARGIN = {BUILTIN_MARGIN!r}",
             "ORDERS = {"]
    for dtype, by_hidden in sorted(orders.items()):
        lines.append(f"    {dtype!r}: {{")
        for hidden, by_batch in sorted(by_hidden.items()):
            cells = ", ".join(f"{batch}: {names!r}" for batch, names in sorted(by_batch.items()))
            lines.append(f"        {hidden}: {{{cells}}},")
        lines.append("    },")
    lines.append("}")
    return "\n".join(lines) + "\n"


def _color(ratio: float) -> str:
    """Blue for speed-ups (darker to 4x), red for slow-downs (darker to 0.25x), white at 1."""
    import math

    t = max(-1.0, min(1.0, math.log(ratio) / math.log(4)))
    r, g, b = (int(255 - 190 * t), int(255 - 120 * t), 255) if t >= 0 else (255, int(255 + 150 * t), int(255 + 170 * t))
    return f"#{r:02x}{g:02x}{b:02x}"


def _esc(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


GRID_KEYS = ("gpu", "config", "dtype", "candidate", "median_ms")


def grid_records(path: Path) -> list:
    """The grid records of a bench/lstm.py result file, each with the fields the map and the built-in
    choice read; exits with one line naming the file where it has none."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        sys.exit(f"bench/lstm.py: --plot-from {path}: not a result file of bench/lstm.py ({e})")
    records = [r for r in data if isinstance(r, dict) and r.get("grid")] if isinstance(data, list) else []
    good = [r for r in records if all(k in r for k in GRID_KEYS) and isinstance(r["config"], list)
            and len(r["config"]) == 4 and isinstance(r["median_ms"], (int, float))]
    if not good or len(good) != len(records):
        what = "no grid records" if not records else f"{len(records) - len(good)} grid records without {', '.join(GRID_KEYS)}"
        sys.exit(f"bench/lstm.py: --plot-from {path}: {what} (bench/lstm.py --grid writes them)")
    if not builtin_orders(good):
        sys.exit(f"bench/lstm.py: --plot-from {path}: no grid point has cuDNN timed (bench/lstm.py --grid writes them)")
    return good


def write_whole(path: Path, text: str) -> None:
    """path's new text, whole or not at all: a temporary file beside it, renamed over it."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".partial")
        tmp.write_text(text)
        tmp.replace(path)
    except OSError as e:
        sys.exit(f"{sys.argv[0]}: cannot write {path}: {e}")  # bench/lstm.py, or a script importing this


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, help="where to write the records (default: bench/results/lstm-<gpu>.json, "
                                             "lstm_grid-<gpu>.json with --grid)")
    ap.add_argument("--json", action="store_true", help="also print the records as one JSON array on stdout")
    ap.add_argument("--configs", type=int, nargs="*", help=f"indices into the configs {CONFIGS} (default: all)")
    ap.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16", "float16"], choices=list(TOLERANCE))
    ap.add_argument("--layers", type=int, default=1, help="stacked layers, every config")
    ap.add_argument("--bidirectional", action="store_true", help="both directions, every config")
    ap.add_argument("--grid", action="store_true", help="time the crossover map (hidden x batch) instead of the configs")
    ap.add_argument("--grid-steps", type=int, default=100, help="sequence length of every grid point")
    ap.add_argument("--grid-hidden", type=int, nargs="+", metavar="H",
                    help=f"the grid's hidden sizes (default {GRID_HIDDEN}; sizes not a multiple of 4, e.g. 127 255 "
                         "511 1023 2047 4095, run on unaligned rows and are a class of their own in the built-in "
                         "choice)")
    ap.add_argument("--grid-batch", type=int, nargs="+", metavar="B", help=f"the grid's batch sizes (default {GRID_BATCH})")
    ap.add_argument("--plot", type=Path, help="write the crossover map as SVG here (with --grid or --plot-from)")
    ap.add_argument("--plot-from", type=Path, nargs="+", metavar="FILE",
                    help="plot the grid records of these result files (--plot) or derive the built-in choice from "
                         "them (--builtin-out); times nothing")
    ap.add_argument("--builtin-out", type=Path, help="write hfnn's built-in LSTM choice from the grid records here "
                                                     "(python/hfnn/_lstm_builtin.py), with --grid or --plot-from")
    ap.add_argument("--quick", action="store_true", help="a smoke run: configs 0-1 at 64 steps (grid: 3 x 3 points), "
                                                         "short rounds")
    ap.add_argument("--round-s", type=float, default=0.2, help="seconds per timing round (5 rounds per number)")
    ap.add_argument("--no-check", action="store_true", help="skip the float64 check (large grid points)")
    return ap.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.builtin_out and not (args.grid or args.plot_from):
        sys.exit("bench/lstm.py: --builtin-out needs grid records: give --grid (time them) or --plot-from FILE")
    if args.plot_from:
        if not args.plot and not args.builtin_out:
            sys.exit("bench/lstm.py: --plot-from needs --plot PATH (the SVG) or --builtin-out PATH (the built-in choice)")
        records, seen = [], {}
        for i, path in enumerate(args.plot_from):
            for r in grid_records(path):
                # A point timed in two files (or one file given twice) would be summed as one
                # (grid_totals): refuse it.
                key = (r["gpu"], r["dtype"], tuple(r["config"]), r.get("pass"), r["candidate"])
                if seen.setdefault(key, i) != i:
                    sys.exit(f"bench/lstm.py: --plot-from: {r['dtype']} {r['config']} {r['candidate']} is in both "
                             f"{args.plot_from[seen[key]]} and {path}: give each grid point in one file")
                records.append(r)
        gpu = records[0]["gpu"]
        # Both texts first, then each written whole (a temporary file renamed over it): a failure
        # leaves no half-written SVG or module (python/hfnn imports the module on an LSTM call).
        texts = []
        if args.plot:
            texts.append((args.plot, svg_map(records, f"LSTM crossover on {gpu}")))
        if args.builtin_out:
            texts.append((args.builtin_out, builtin_module(records, [str(p) for p in args.plot_from])))
        for path, text in texts:
            write_whole(path, text)
            print(f"wrote {path}")
        return 0
    import torch

    if not torch.cuda.is_available():
        print("bench/lstm.py: needs a GPU: no CUDA device is visible to this torch (it times cuDNN's LSTM against "
              "hfnn's CUDA kernels); --plot-from replots a result file without one", file=sys.stderr)
        return 1
    import hfnn

    args.gpu = torch.cuda.get_device_name()
    args.date = datetime.date.today().isoformat()
    if not hasattr(torch.ops.hfnn, "lstm_layer_fwd"):
        print(f"note: this hfnn op library has no LSTM kernels ({hfnn.ops_error() or 'no hfnn::lstm_layer_fwd'}): "
              "timing cuDNN alone (hfnn = torch's fallback)", flush=True)
    if args.quick:
        args.round_s = min(args.round_s, 0.03)
    records = []
    out = args.out or ROOT / "bench" / "results" / f"lstm{'_grid' if args.grid else ''}-{gpu_slug(args.gpu)}.json"

    def save():  # after every point: a run cut short by a time limit keeps the points it timed
        write_whole(out, json.dumps(records, indent=1) + "\n")

    if args.grid:
        hiddens, batches = (QUICK_GRID_HIDDEN, QUICK_GRID_BATCH) if args.quick else (GRID_HIDDEN, GRID_BATCH)
        hiddens, batches = args.grid_hidden or hiddens, args.grid_batch or batches
        points = [(d, h, b) for d in args.dtypes for h in hiddens for b in batches]
        for i, (dtype_name, hidden, batch) in enumerate(points):
            print(f"[{i + 1}/{len(points)}]", end=" ", flush=True)
            records += bench_point(torch, hfnn, args, [hidden, hidden, batch, args.grid_steps], dtype_name, grid=True)
            save()
    else:
        configs = [CONFIGS[i] for i in args.configs] if args.configs else CONFIGS[:2] if args.quick else CONFIGS
        for config in configs:
            if args.quick:
                config = config[:3] + [min(config[3], 64)]
            for dtype_name in args.dtypes:
                records += bench_point(torch, hfnn, args, config, dtype_name)
                save()
    save()
    print(f"wrote {len(records)} records to {out}", flush=True)
    if args.plot:
        write_whole(args.plot, svg_map(records, f"LSTM crossover on {args.gpu}, {args.grid_steps} steps"))
        print(f"wrote {args.plot}", flush=True)
    if args.builtin_out and args.grid:
        write_whole(args.builtin_out, builtin_module(records, str(out)))
        print(f"wrote {args.builtin_out}", flush=True)
    if args.json:
        print(json.dumps(records))
    return 0


if __name__ == "__main__":
    sys.exit(main())
