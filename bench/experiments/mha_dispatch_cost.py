#!/usr/bin/env python3
"""What routing nn.MultiheadAttention through HFNN_DISPATCH_DB costs a call, piece by piece, in one
process (a GPU machine; `hfnn` and its CLI installed):

    python3 bench/experiments/mha_dispatch_cost.py [--config 32 128 768 12] [--core hfnn_short] [--out F]

It makes a table whose winner for the config's key is --core (bench/mha.py's dispatch_table: hfnn
profile, then hfnn tune with the tests' stand-in worker), loads it with hfnn's own install() (what
the start-up hook calls), then times in turn, forward alone and forward + backward, as bench/mha.py
times its candidates (per-call wall time of back-to-back calls, CPU time per call):
  op        hfnn's op called directly with the core (bench/mha.py's `hfnn` candidate)
  route     the dispatch op the wrapper calls, with the arguments it passes (its checks, the key's
            lookup and counting, then the same op)
  forward   the wrapped forward called as a function (the wrapper's Python: the module's attribute
            reads, then the dispatch op)
  module    the module called as a training loop calls it (nn.Module.__call__ on top)
  torch     torch's own forward of the same module (what the wrapper replaced)
and, on the CPU alone, the wrapper's attribute reads and the module call's own overhead. The
differences between neighbours are what each layer adds.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import mha  # noqa: E402  (bench/mha.py: its table maker and its timing helpers)
from mha_cpu import attention_case  # noqa: E402


def per_call_us(fn, n=20000):
    for _ in range(n // 10):
        fn()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t0) / n * 1e6


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", type=int, nargs=4, default=[32, 128, 768, 12], metavar=("B", "L", "E", "HEADS"))
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    ap.add_argument("--core", default="hfnn_short", help="the table's winner for the config's key")
    ap.add_argument("--round-s", type=float, default=0.05)
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--reverse", action="store_true",
                    help="take the candidates in the opposite order in each round (a check on order effects)")
    ap.add_argument("--profile", type=int, default=0, metavar="CALLS",
                    help="also run CALLS fwd+bwd calls of the op and of the module under torch.profiler (CPU "
                         "activity) and print each one's ops by self CPU time, to find what the dispatched "
                         "call adds (default 0: off)")
    ap.add_argument("--out", type=Path, help="write the result here (JSON)")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("mha_dispatch_cost.py: needs a CUDA GPU")
    import hfnn
    from hfnn import _dispatch
    from hfnn._families import multihead_attention as fam

    with tempfile.TemporaryDirectory(prefix="hfnn-dispatch-cost-") as work:
        db = Path(work) / "shapes.db"
        try:
            mha.dispatch_table(db, args.config, args.dtype, args.core)
        except RuntimeError as e:  # hfnn profile or tune failed: their own message, one line
            sys.exit(f"mha_dispatch_cost.py: making the table failed: {str(e).splitlines()[0]}")
        status = _dispatch.install(str(db))
        if not status.get("ok") or fam.torch_forward is None:
            sys.exit(f"mha_dispatch_cost.py: the table did not load or route nn.MultiheadAttention: {status}")
        m, x, grad = attention_case(torch, args)
        route = torch.ops.hfnn.multi_head_attention_dispatch.default
        wrapped = nn.MultiheadAttention.forward

        def route_call():
            return route(x, x, x, m.num_heads, m.in_proj_weight, m.in_proj_bias, m.out_proj.weight, m.out_proj.bias,
                         m.batch_first, False, 0.0, False, None, None, m.bias_k is not None or m.add_zero_attn,
                         False, True, m.q_proj_weight, m.k_proj_weight, m.v_proj_weight)

        fns = {"op": mha.op_call(m, x, args.core),
               "route": route_call,
               "forward": lambda: wrapped(m, x, x, x, need_weights=False),
               "module": lambda: m(x, x, x, need_weights=False),
               "torch": lambda: fam.torch_forward(m, x, x, x, need_weights=False)}
        if args.reverse:
            fns = dict(reversed(list(fns.items())))
        torch.ops.hfnn.dispatch_reset_counts()
        walls = mha.interleaved_walls(fns, grad, args.round_s, args.rounds)
        stats = _dispatch.dispatch_stats()["ops"]["multihead_attention"]

        def attrs():
            return (m.num_heads, m.in_proj_weight, m.in_proj_bias, m.out_proj.weight, m.out_proj.bias, m.batch_first,
                    m.bias_k, m.add_zero_attn, m.q_proj_weight, m.k_proj_weight, m.v_proj_weight, m.training,
                    m.dropout)

        class Nothing(nn.Module):
            def forward(self, a, b, c, need_weights=True):
                return a

        nothing = Nothing()
        profiles = {}
        for name in ("op", "module") if args.profile > 0 else ():
            step = mha.training_step(fns[name], grad, True)
            for _ in range(5):
                step()
            torch.cuda.synchronize()
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
                for _ in range(args.profile):
                    step()
                torch.cuda.synchronize()
            events = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
            profiles[name] = [{"op": e.key, "calls": e.count, "self_cpu_us_a_call": round(e.self_cpu_time_total / args.profile, 2)}
                              for e in events[:25]]
            print(f"-- {name}: self CPU us a call, top ops ({args.profile} calls under torch.profiler)")
            for row in profiles[name][:15]:
                print(f"   {row['self_cpu_us_a_call']:8.2f}  x{row['calls'] / args.profile:5.1f}  {row['op']}")
        cpu = {"attribute_reads_us": per_call_us(attrs),
               "module_call_overhead_us": per_call_us(lambda: nothing(x, x, x, need_weights=False))
               - per_call_us(lambda: nothing.forward(x, x, x, need_weights=False))}

    props = torch.cuda.get_device_properties(0)
    out = {"gpu": props.name, "torch": torch.__version__, "hfnn": hfnn.__version__,
           "date": time.strftime("%Y-%m-%d"), "config": args.config, "dtype": args.dtype, "core": args.core,
           "order": list(fns), "rounds": args.rounds,
           "per_call": {name: {"fwd_ms": round(walls[(name, False)][0], 4), "fwd_cpu_us": round(walls[(name, False)][1], 1),
                               "train_ms": round(walls[(name, True)][0], 4),
                               "train_cpu_us": round(walls[(name, True)][1], 1)} for name in fns},
           "cpu": {k: round(v, 2) for k, v in cpu.items()}, "profiles": profiles,
           "dispatch_calls": stats["calls"]["train"],
           "fallbacks": stats["fallbacks"]["train"]}
    for name, r in out["per_call"].items():
        print(f"{name:8s} fwd {r['fwd_ms']:.4f} ms ({r['fwd_cpu_us']:.0f} us CPU)   fwd+bwd {r['train_ms']:.4f} ms "
              f"({r['train_cpu_us']:.0f} us CPU)")
    print(f"attribute reads {cpu['attribute_reads_us']:.2f} us, nn.Module.__call__ {cpu['module_call_overhead_us']:.2f} us;"
          f" calls {out['dispatch_calls']}, fall-backs {out['fallbacks']}")
    if args.out:
        args.out.write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
