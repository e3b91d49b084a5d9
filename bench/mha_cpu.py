#!/usr/bin/env python3
"""Where nn.MultiheadAttention's CPU time goes, per call, as a training loop makes it: torch.profiler
(CPU activity only) over back-to-back fwd+bwd calls of torch's module and of hfnn's op with each
named core, the ops by self CPU time per call. A diagnostic for the launch-bound configs; the timed
numbers are bench/mha.py's.

    python3 bench/mha.py-like configs:  python3 bench/mha_cpu.py --config 32 128 768 12 --cores sdpa_efficient sdpa_cudnn
"""
from __future__ import annotations

import argparse
import time

import torch
from torch import nn
from torch.profiler import ProfilerActivity, profile

import hfnn


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", type=int, nargs=4, default=[32, 128, 768, 12], metavar=("B", "L", "E", "HEADS"))
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--cores", nargs="*", default=["", "sdpa_efficient", "sdpa_cudnn", "sdpa_flash"])
    ap.add_argument("--calls", type=int, default=50)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--kernels", action="store_true", help="also the GPU kernels, by time per call")
    args = ap.parse_args()
    b, length, e, heads = args.config
    dtype = getattr(torch, args.dtype)
    m = nn.MultiheadAttention(e, heads, batch_first=True, device="cuda", dtype=dtype)
    x = torch.randn(b, length, e, device="cuda", dtype=dtype, requires_grad=True)
    grad = torch.randn_like(x)

    def module():
        return m(x, x, x, need_weights=False)[0]

    def op(core):
        return lambda: torch.ops.hfnn.multi_head_attention(x, x, x, heads, m.in_proj_weight, m.in_proj_bias,
                                                           m.out_proj.weight, m.out_proj.bias, True, False, 0.0, core)

    cands = [("torch", module)] + [(c or "sdpa_auto", op(c)) for c in args.cores]
    for name, fn in cands:
        for _ in range(5):
            fn().backward(grad)
        torch.cuda.synchronize()
        # plain CPU time per phase, no profiler
        c0 = time.process_time()
        outs = [fn() for _ in range(args.calls)]
        c1 = time.process_time()
        for o in outs:
            o.backward(grad)
        c2 = time.process_time()
        torch.cuda.synchronize()
        print(f"== {name}: cpu per call fwd {(c1 - c0) / args.calls * 1e6:.0f} us, bwd {(c2 - c1) / args.calls * 1e6:.0f} us")
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(args.calls):
                fn().backward(grad)
            torch.cuda.synchronize()
        rows = sorted(prof.key_averages(), key=lambda r: -r.self_cpu_time_total)[:args.top]
        for r in rows:
            print(f"  {r.key[:70]:70s} calls/step {r.count / args.calls:5.1f}  self cpu/step {r.self_cpu_time_total / args.calls:7.1f} us"
                  f"  total/step {r.cpu_time_total / args.calls:7.1f} us")
        if args.kernels:
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(args.calls):
                    fn().backward(grad)
                torch.cuda.synchronize()
            rows = [r for r in prof.key_averages() if r.device_time_total > 0]
            total = sum(r.device_time_total for r in rows) / args.calls
            print(f"  GPU kernels: {total:.1f} us per call")
            for r in sorted(rows, key=lambda r: -r.device_time_total)[:args.top]:
                print(f"    {r.key[:90]:90s} x{r.count / args.calls:4.1f}  {r.device_time_total / args.calls:8.1f} us")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
