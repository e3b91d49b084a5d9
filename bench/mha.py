#!/usr/bin/env python3
"""nn.MultiheadAttention per call, as a training loop sees it: torch's module against hfnn's op with
each attention core (torch's SDPA kernels called at the ATen level), forward and backward.

Per config x dtype x candidate x pass:
  wall_ms   per-call time of back-to-back calls, CPU launch cost included (median of rounds; the
            backward is fwd+bwd minus fwd, both timed so)
  graph_ms  per-call GPU time of the same calls captured in a CUDA graph and replayed (no CPU cost)
  cpu_us    process CPU time per call while launching them (every thread: the autograd engine's
            too)
Candidates: `torch` (the module, need_weights=False unless the record says otherwise), hfnn's op
with each core that takes the shape (`sdpa_flash`, `sdpa_efficient`, `sdpa_cudnn`, `sdpa_math`,
`sdpa_auto` = torch's own pick), and `hfnn`: the fastest of those by fwd+bwd wall time, which is
what `hfnn tune` will store. Every candidate is first checked against float64 (outputs and every
gradient within 4x the error of torch's module in the same dtype).

    python3 bench/mha.py --out bench/results/mha-h200.json
"""
from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys
import time
from pathlib import Path

import torch
from torch import nn

import hfnn

CONFIGS = [  # [B, L, E, heads], dtypes
    ([200, 256, 1024, 16], ["bfloat16", "float32"]),
    ([5000, 64, 512, 8], ["bfloat16", "float32"]),
    ([32, 128, 768, 12], ["bfloat16"]),
    ([8, 1024, 1024, 16], ["bfloat16"]),
]
CORES = {"sdpa_auto": "", "sdpa_flash": "sdpa_flash", "sdpa_efficient": "sdpa_efficient",
         "sdpa_cudnn": "sdpa_cudnn", "sdpa_math": "sdpa_math"}


def module_call(m, x, need_weights):
    return lambda: m(x, x, x, need_weights=need_weights)[0]


def op_call(m, x, core):
    return lambda: torch.ops.hfnn.multi_head_attention(x, x, x, m.num_heads, m.in_proj_weight, m.in_proj_bias,
                                                       m.out_proj.weight, m.out_proj.bias, True, False, 0.0, core)


def training_step(fn, grad, backward):
    """One call as a training loop makes it: forward, and the backward when timing it."""
    def step():
        out = fn()
        if backward:
            out.backward(grad)
    return step


def wall(fn, grad, backward, min_round_s):
    """Median per-call ms over rounds of back-to-back calls, and CPU µs per call."""
    step = training_step(fn, grad, backward)
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    step()
    torch.cuda.synchronize()
    calls = max(3, int(min_round_s / max(time.perf_counter() - t0, 1e-5)))
    rounds, cpu = [], []
    for _ in range(5):
        torch.cuda.synchronize()
        c0, t0 = time.process_time(), time.perf_counter()
        for _ in range(calls):
            step()
        c1 = time.process_time()
        torch.cuda.synchronize()
        rounds.append((time.perf_counter() - t0) / calls * 1e3)
        cpu.append((c1 - c0) / calls * 1e6)
    return statistics.median(rounds), statistics.median(cpu)


def graphed(fn, grad, backward, params, x):
    """Per-call GPU ms of `calls` steps captured in one CUDA graph, median of replays."""
    step = training_step(fn, grad, backward)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(s)
    for p in [*params, x]:
        p.grad = None
    calls = 5
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(calls):
            step()
    times = []
    for _ in range(7):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        g.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / calls)
    del g
    return statistics.median(times)


def rel(a, b):
    return ((a.double() - b.double()).abs().max() / b.double().abs().max().clamp_min(1e-30)).item()


def errors(fn_of, m, x, grad):
    """max rel error of the output and every gradient against float64, for fn_of(module, input)."""
    m64 = nn.MultiheadAttention(m.embed_dim, m.num_heads, batch_first=True, device="cuda", dtype=torch.float64)
    m64.load_state_dict(m.state_dict())
    x64 = x.detach().double().requires_grad_()
    out64 = m64(x64, x64, x64, need_weights=False)[0]
    ref = [out64] + list(torch.autograd.grad(out64, [x64] + list(m64.parameters()), grad.double()))
    xl = x.detach().requires_grad_()
    out = fn_of(m, xl)()
    got = [out] + list(torch.autograd.grad(out, [xl] + list(m.parameters()), grad))
    return max(rel(a, b) for a, b in zip(got, ref))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, help="write the records here (a JSON array)")
    ap.add_argument("--configs", type=int, nargs="*", help="indices into the config list (default: all)")
    ap.add_argument("--round-s", type=float, default=0.05, help="seconds per timing round")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("bench/mha.py: needs a CUDA GPU")
    gpu = torch.cuda.get_device_name()
    date = datetime.date.today().isoformat()
    records = []
    configs = [CONFIGS[i] for i in args.configs] if args.configs else CONFIGS
    for (b, length, embed, heads), dtypes in configs:
        for dtype_name in dtypes:
            dtype = getattr(torch, dtype_name)
            torch.manual_seed(0)
            m = nn.MultiheadAttention(embed, heads, batch_first=True, device="cuda", dtype=dtype)
            x = torch.randn(b, length, embed, device="cuda", dtype=dtype, requires_grad=True)
            grad = torch.randn(b, length, embed, device="cuda", dtype=dtype)
            params = list(m.parameters())
            cands = {"torch": lambda mm, xx: module_call(mm, xx, False)}
            for name, core in CORES.items():
                if torch.ops.hfnn.multi_head_attention_supports(x, x, x, heads, True, False, 0.0, core):
                    cands[name] = (lambda c: (lambda mm, xx: op_call(mm, xx, c)))(core)
            err_torch = errors(cands["torch"], m, x, grad)
            rows = {}
            for name, make in cands.items():
                err = errors(make, m, x, grad)
                ok = err <= max(4 * err_torch, 1e-6)
                fn = make(m, x)
                fwd_ms, fwd_cpu = wall(fn, grad, False, args.round_s)
                tot_ms, tot_cpu = wall(fn, grad, True, args.round_s)
                g_fwd = graphed(fn, grad, False, params, x)
                g_tot = graphed(fn, grad, True, params, x)
                rows[name] = dict(fwd=(fwd_ms, g_fwd, fwd_cpu), bwd=(tot_ms - fwd_ms, g_tot - g_fwd, tot_cpu - fwd_cpu),
                                  total=tot_ms, error=err, ok=ok)
                print(f"[{b}, {length}, {embed}, {heads}] {dtype_name} {name:15s} err {err:.1e}{'' if ok else ' REJECTED'}"
                      f"  wall fwd {fwd_ms:7.3f} bwd {tot_ms - fwd_ms:7.3f} ms  graph fwd {g_fwd:7.3f} "
                      f"bwd {g_tot - g_fwd:7.3f} ms  cpu fwd {fwd_cpu:6.0f} bwd {tot_cpu - fwd_cpu:6.0f} us", flush=True)
                torch.cuda.empty_cache()
            variants = {k: v for k, v in rows.items() if k != "torch" and v["ok"]}
            if variants:
                best = min(variants, key=lambda k: variants[k]["total"])
                rows["hfnn"] = dict(rows[best], winner=best)
                print(f"  -> hfnn = {best}: fwd+bwd {rows['torch']['total'] / rows[best]['total']:.2f}x torch", flush=True)
            for name, r in rows.items():
                for p in ("fwd", "bwd"):
                    w, g, c = r[p]
                    rec = dict(gpu=gpu, torch=torch.__version__, date=date, config=[b, length, embed, heads],
                               dtype=dtype_name, need_weights=False, **{"pass": p}, candidate=name,
                               wall_ms=round(w, 4), graph_ms=round(g, 4), cpu_us=round(c, 1),
                               max_rel_error=r["error"], correct=r["ok"])
                    if "winner" in r:
                        rec["winner"] = r["winner"]
                    records.append(rec)
            del m, x, grad
            torch.cuda.empty_cache()
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(records, indent=1) + "\n")
        print(f"wrote {len(records)} records to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
