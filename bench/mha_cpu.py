#!/usr/bin/env python3
"""Where a training call of hfnn's multi-head attention op spends its CPU time, forward and backward
apart (issue 11: the launch-bound configs are host-bound). For one config:

  1. process CPU time per call without the profiler (time.process_time, every thread: the autograd
     engine's too), as bench/mha.py's cpu_us: forward-only calls, forward + backward calls (the
     backward is their difference), and the backward alone (forwards held, then their backwards),
     with the wall time per call of the same loops;
  2. torch.profiler, CPU activity only, record_shapes off: --calls forwards, then the backwards of
     the same calls, in separate sessions, so each table is one pass: the ops by self CPU time per
     call. hfnn's own host code (views, cuBLASLt calls) is the self time of hfnn::multi_head_attention
     (forward) and of its autograd node, torch::autograd::CppNode<...MhaFunction> (backward);
  3. the cuBLASLt caches' misses during the timed calls (heuristic queries and descriptor sets: 0
     once a shape has been seen).

--compare-torch does 1 and 2 for nn.MultiheadAttention too. Plain text, flushed line by line (a log
file reads the same as a terminal); --json writes the numbers too. Runs in well under a minute.

    python3 bench/mha_cpu.py                                   # [32, 128, 768, 12] bf16, core sdpa_flash
    python3 bench/mha_cpu.py --config 8 1024 1024 16 --core sdpa_cudnn --compare-torch
    python3 bench/mha_cpu.py --core sdpa_auto --kernels       # torch's pick of core; the GPU kernels too
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict
from pathlib import Path


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", type=int, nargs=4, default=[32, 128, 768, 12], metavar=("B", "L", "E", "HEADS"))
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    ap.add_argument("--core", default="sdpa_flash",
                    help="hfnn's core: sdpa_flash, sdpa_efficient, sdpa_cudnn, sdpa_math, or sdpa_auto (torch's pick); "
                         "default sdpa_flash, bench/mha.py's winner at [32, 128, 768, 12] bf16 on an H200")
    ap.add_argument("--compare-torch", action="store_true", help="the same for torch's nn.MultiheadAttention")
    ap.add_argument("--calls", type=int, default=50, help="calls per profiled pass (default 50)")
    ap.add_argument("--timed-calls", type=int, default=300, help="calls per process_time loop (default 300)")
    ap.add_argument("--top", type=int, default=20, help="ops per table")
    ap.add_argument("--kernels", action="store_true", help="also the GPU kernels of a fwd+bwd call, by time, and the GPU's idle time between them")
    ap.add_argument("--json", type=Path, help="write the numbers here too")
    return ap.parse_args(argv)


def candidate(torch, m, x, core):
    """The call to time: torch's module (core None) or hfnn's op with `core`."""
    if core is None:
        return lambda: m(x, x, x, need_weights=False)[0]
    name = "" if core == "sdpa_auto" else core
    op = torch.ops.hfnn.multi_head_attention

    def call():
        return op(x, x, x, m.num_heads, m.in_proj_weight, m.in_proj_bias, m.out_proj.weight, m.out_proj.bias,
                  True, False, 0.0, name)
    return call


def attention_case(torch, args):
    """torch's nn.MultiheadAttention at args.config in args.dtype on the GPU (seed 0), batch first,
    its self-attention input x (requiring grad) and a gradient for its output."""
    from torch import nn

    b, length, embed, heads = args.config
    dtype = getattr(torch, args.dtype)
    torch.manual_seed(0)
    m = nn.MultiheadAttention(embed, heads, batch_first=True, device="cuda", dtype=dtype)
    x = torch.randn(b, length, embed, device="cuda", dtype=dtype, requires_grad=True)
    return m, x, torch.randn_like(x)


def gemm_stats(torch):
    """(heuristic queries, descriptor sets) of hfnn's cuBLASLt wrapper so far; None in a build without it."""
    fn = getattr(torch.ops.hfnn, "_gemm_cache_stats", None)
    try:
        return tuple(fn()) if fn is not None else None
    except RuntimeError:
        return None


def held(torch, calls, per_call_bytes):
    """How many forwards may be held at once for the backward-only phases (half the free memory)."""
    free, _ = torch.cuda.mem_get_info()
    return max(1, min(calls, int(0.5 * free / max(per_call_bytes, 1))))


def cpu_times(torch, fn, grad, n):
    """Per call: CPU µs and wall ms of forward-only calls, of forward + backward calls, and of the
    backward alone (`hold` forwards kept, then their backwards), without the profiler."""
    sync = torch.cuda.synchronize
    out = {}
    for name, backward in (("fwd", False), ("fwd_bwd", True)):
        sync()
        c0, t0 = time.process_time(), time.perf_counter()
        for _ in range(n):
            y = fn()
            if backward:
                y.backward(grad)
        c1 = time.process_time()
        sync()
        out[name] = {"cpu_us": (c1 - c0) / n * 1e6, "wall_ms": (time.perf_counter() - t0) / n * 1e3}
    out["bwd"] = {k: out["fwd_bwd"][k] - out["fwd"][k] for k in ("cpu_us", "wall_ms")}
    before = torch.cuda.memory_allocated()
    y = fn()
    per_call = torch.cuda.memory_allocated() - before
    del y
    hold = held(torch, n, per_call)
    cpu = wall = 0.0
    done = 0
    while done < n:
        k = min(hold, n - done)
        ys = [fn() for _ in range(k)]
        sync()
        c0, t0 = time.process_time(), time.perf_counter()
        for y in ys:
            y.backward(grad)
        cpu += time.process_time() - c0
        sync()
        wall += time.perf_counter() - t0
        del ys
        done += k
    out["bwd_alone"] = {"cpu_us": cpu / n * 1e6, "wall_ms": wall / n * 1e3}
    return out


def profiled(torch, fn, grad, calls, hold):
    """Self CPU time per call by op name, forward and backward apart: sessions of `hold` forwards
    (outputs kept), then sessions of their backwards."""
    from torch.profiler import ProfilerActivity, profile

    tables = {"fwd": defaultdict(lambda: [0, 0.0, 0.0]), "bwd": defaultdict(lambda: [0, 0.0, 0.0])}

    def add(table, prof):
        for r in prof.key_averages():
            row = table[r.key]
            row[0] += r.count
            row[1] += r.self_cpu_time_total
            row[2] += r.cpu_time_total

    done = 0
    while done < calls:
        k = min(hold, calls - done)
        with profile(activities=[ProfilerActivity.CPU], record_shapes=False) as prof:
            ys = [fn() for _ in range(k)]
        add(tables["fwd"], prof)
        with profile(activities=[ProfilerActivity.CPU], record_shapes=False) as prof:
            for y in ys:
                y.backward(grad)
            torch.cuda.synchronize()
        add(tables["bwd"], prof)
        del ys
        done += k
    return {p: {name: {"calls": c / calls, "self_us": s / calls, "total_us": t / calls}
                for name, (c, s, t) in table.items()} for p, table in tables.items()}


def print_table(title, table, top):
    rows = sorted(table.items(), key=lambda kv: -kv[1]["self_us"])
    total = sum(r["self_us"] for _, r in rows)
    print(f"  {title}: self CPU {total:.1f} us per call under the profiler (its own cost included), "
          f"{len(rows)} op names; top {min(top, len(rows))}:")
    print(f"    {'op':78s} {'calls':>6s} {'self us':>9s} {'total us':>9s} {'self %':>7s}")
    for name, r in rows[:top]:
        short = name if len(name) <= 78 else name[:37] + "..." + name[-38:]
        print(f"    {short:78s} {r['calls']:6.1f} {r['self_us']:9.1f} {r['total_us']:9.1f} "
              f"{100 * r['self_us'] / max(total, 1e-9):6.1f}%")


def timeline_gaps(work):
    """(busy, span, gaps) of GPU intervals [(start, stop, name)] sorted by start: the union of the
    intervals, the first start to the last stop, and each idle stretch as (length, name of the
    interval that ended last before it, name of the one after it)."""
    busy, gaps, end, prev = 0.0, [], work[0][0], work[0][2]
    for start, stop, name in work:
        if start > end:
            gaps.append((start - end, prev, name))
        busy += max(0.0, stop - max(start, end))
        if stop > end:
            end, prev = stop, name
    return busy, end - work[0][0], gaps


def kernels(torch, fn, grad, calls, top):
    """The GPU kernels of back-to-back fwd+bwd calls by time, and the GPU's idle time between them:
    the span from the first kernel's start to the last one's end against the union of the kernels'
    (and copies') intervals, from the profiler's trace. Idle time inside the span is time the GPU
    waited for the host (launches, the autograd engine, a synchronisation); the profiler's own CPU
    cost inflates it somewhat. Returns the numbers."""
    import os
    import tempfile
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn().backward(grad)
        torch.cuda.synchronize()
    rows = [r for r in prof.key_averages() if r.device_time_total > 0]
    total = sum(r.device_time_total for r in rows) / calls
    print(f"  GPU kernels of a fwd+bwd call: {total:.1f} us, {sum(r.count for r in rows) / calls:.1f} launches")
    for r in sorted(rows, key=lambda r: -r.device_time_total)[:top]:
        print(f"    {r.key[:90]:90s} x{r.count / calls:4.1f} {r.device_time_total / calls:8.1f} us")
    fd, path = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    try:
        prof.export_chrome_trace(path)
        trace = json.loads(Path(path).read_text())
    finally:
        os.unlink(path)
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    work = sorted((float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0)), e.get("name", "?")) for e in events
                  if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset"))
    if not work:
        print("  GPU timeline: the trace has no kernel events")
        return {"kernel_us": total}
    busy, span, gaps = timeline_gaps(work)
    idle = sum(g[0] for g in gaps)
    print(f"  GPU timeline over {calls} calls (profiled): span {span / calls:.1f} us a call, busy {busy / calls:.1f}, "
          f"idle {idle / calls:.1f} ({100 * idle / max(span, 1e-9):.1f}%) in {len(gaps) / calls:.1f} gaps a call; "
          f"gaps over 5 us: {sum(1 for g in gaps if g[0] > 5) / calls:.1f} a call, "
          f"{sum(g[0] for g in gaps if g[0] > 5) / calls:.1f} us")
    by_pair = defaultdict(lambda: [0, 0.0])
    for length, before, after in gaps:
        key = (before[:60], after[:60])
        by_pair[key][0] += 1
        by_pair[key][1] += length
    print(f"    {'idle us a call':>14s} {'gaps':>5s}  kernel before the gap -> kernel after it")
    for (before, after), (count, length) in sorted(by_pair.items(), key=lambda kv: -kv[1][1])[:top]:
        print(f"    {length / calls:14.1f} {count / calls:5.1f}  {before} -> {after}")
    return {"kernel_us": total, "span_us": span / calls, "busy_us": busy / calls, "idle_us": idle / calls,
            "gaps_per_call": len(gaps) / calls}


def main(argv=None) -> int:
    args = parse_args(argv)
    sys.stdout.reconfigure(line_buffering=True)  # a log file gets each line as it is printed
    import torch

    if not torch.cuda.is_available():
        sys.exit("bench/mha_cpu.py: needs a CUDA GPU")
    import hfnn  # noqa: F401  (loads the op library)

    started = time.perf_counter()
    m, x, grad = attention_case(torch, args)
    print(f"bench/mha_cpu.py: {torch.cuda.get_device_name()}, torch {torch.__version__}, "
          f"config [B, L, E, heads] = {args.config} {args.dtype}, self-attention, batch_first, need_weights=False, "
          f"{args.calls} profiled calls, {args.timed_calls} timed calls", flush=True)
    cands = [(f"hfnn op, core {args.core}", args.core)] + ([("torch nn.MultiheadAttention", None)] if args.compare_torch else [])
    result = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "config": args.config,
              "dtype": args.dtype, "candidates": {}}
    for title, core in cands:
        if core is not None and not torch.ops.hfnn.multi_head_attention_supports(
                x, x, x, m.num_heads, True, False, 0.0, "" if core == "sdpa_auto" else core):
            print(f"\n== {title}: this core does not take the config on this GPU (dtype, head size or the "
                  f"torch.backends.cuda switches); try another --core", flush=True)
            continue
        fn = candidate(torch, m, x, core)
        for _ in range(10):  # warm-up: cuBLASLt's heuristic, caches, the allocator's blocks
            fn().backward(grad)
        torch.cuda.synchronize()
        stats0 = gemm_stats(torch)
        times = cpu_times(torch, fn, grad, args.timed_calls)
        stats1 = gemm_stats(torch)
        print(f"\n== {title}", flush=True)
        print("  without the profiler, per call (process CPU time, all threads; wall time of the same loop):")
        for phase, label in (("fwd", "forward"), ("bwd", "backward (fwd+bwd - fwd)"), ("fwd_bwd", "forward + backward"),
                             ("bwd_alone", "backward alone (forwards held)")):
            t = times[phase]
            print(f"    {label:32s} cpu {t['cpu_us']:8.1f} us   wall {t['wall_ms']:7.3f} ms")
        if core is not None and stats0 is not None:
            dq, dd = stats1[0] - stats0[0], stats1[1] - stats0[1]
            print(f"  cuBLASLt caches during the timed calls: {dq} heuristic queries, {dd} descriptor sets made "
                  f"({'cached, as expected' if dq == 0 and dd == 0 else 'MISSES: a shape or thread not seen before'})")
        before = torch.cuda.memory_allocated()
        y = fn()
        hold = held(torch, args.calls, torch.cuda.memory_allocated() - before)
        del y
        tables = profiled(torch, fn, grad, args.calls, hold)
        print_table("forward", tables["fwd"], args.top)
        print_table("backward (the backward() call: Python, the autograd engine and its device thread)",
                    tables["bwd"], args.top)
        timeline = kernels(torch, fn, grad, args.calls, args.top) if args.kernels else None
        result["candidates"][title] = {"core": core, "per_call": times, "profile": tables, "timeline": timeline,
                                       "gemm_cache_misses": None if stats0 is None or core is None
                                       else [stats1[0] - stats0[0], stats1[1] - stats0[1]]}
        sys.stdout.flush()
    if args.compare_torch and len(result["candidates"]) == 2:
        h, t = (result["candidates"][c[0]]["per_call"] for c in cands)
        print(f"\nhfnn / torch per call: cpu fwd {h['fwd']['cpu_us']:.0f} / {t['fwd']['cpu_us']:.0f} us, "
              f"bwd {h['bwd']['cpu_us']:.0f} / {t['bwd']['cpu_us']:.0f} us; wall fwd+bwd "
              f"{h['fwd_bwd']['wall_ms']:.3f} / {t['fwd_bwd']['wall_ms']:.3f} ms "
              f"({t['fwd_bwd']['wall_ms'] / h['fwd_bwd']['wall_ms']:.2f}x)")
    print(f"\nbench/mha_cpu.py: done in {time.perf_counter() - started:.1f} s", flush=True)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=1) + "\n")
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
