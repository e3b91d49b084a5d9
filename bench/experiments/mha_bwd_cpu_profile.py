"""Where the CPU time of hfnn's multi_head_attention backward goes on a launch-bound shape
([32, 128, 768, 12] bf16 by default: 0.17 ms of GPU work, ~0.45 ms of CPU per backward on an H100
host; issue 11 asks 2.5x torch's module there).

Per candidate (torch's module; hfnn's op with each core given): per-call wall and CPU time of
fwd, fwd+bwd, fwd+bwd with the parameters' .grad set to None before each step (AccumulateGrad
steals instead of adding), and fwd+bwd with x not requiring grad; then the autograd engine's own
cost on the same host (a backward of one node, of a sum of five leaves, and one eager kernel).
    python3 bench/experiments/mha_bwd_cpu_profile.py [--config 32 128 768 12] [--cores sdpa_flash hfnn_short]
        [--out FILE --run LABEL]
bench/mha_cpu.py breaks one core's call down op by op (torch.profiler); this compares the cores and
torch's module on one host and measures the engine's floor beside them
(results/mha_bwd_cpu-h100.json).
"""
import argparse
import datetime
import json
import os
import statistics
import sys
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from mha import timed_round  # noqa: E402  (bench/mha.py; imports hfnn, which registers torch.ops.hfnn)


def per_call(step, calls=200, rounds=5):
    """Median per-call wall and CPU µs over rounds of `calls` back-to-back calls (bench/mha.py's round)."""
    for _ in range(5):
        step()
    samples = [timed_round(step, calls) for _ in range(rounds)]
    return statistics.median(s[0] for s in samples) * 1e3, statistics.median(s[1] for s in samples)


def record(run, candidate, **measured):
    """One record: per measurement its median wall and CPU us a call."""
    r = {"run": run, "candidate": candidate}
    for key, (wall_us, cpu_us) in measured.items():
        r[f"{key}_wall_us"], r[f"{key}_cpu_us"] = round(wall_us, 1), round(cpu_us, 1)
    return r


def save(path, records, args):
    """Appends the records to the JSON file at `path` (made with the GPU, versions and config),
    through a temporary file beside it: a failed write leaves the file as it was."""
    doc = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "date": datetime.date.today().isoformat(),
           "config": args.config, "dtype": args.dtype, "records": []}
    if os.path.exists(path):
        with open(path) as f:
            doc = json.load(f)
    doc["records"] += records
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(doc, f, indent=1)
    os.replace(tmp, path)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", type=int, nargs=4, default=[32, 128, 768, 12])
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--cores", nargs="*", default=["sdpa_flash", "hfnn_short", "hfnn_mid"])
    ap.add_argument("--out", help="append this run's records to this JSON file (results/mha_bwd_cpu-<gpu>.json's "
                                   "form: a run label, then per candidate its wall and CPU us a call)")
    ap.add_argument("--run", default="run", help="the records' run label (default: run)")
    args = ap.parse_args()
    b, length, embed, heads = args.config
    dtype = getattr(torch, args.dtype)
    torch.manual_seed(0)
    m = nn.MultiheadAttention(embed, heads, batch_first=True, device="cuda", dtype=dtype)
    x = torch.randn(b, length, embed, device="cuda", dtype=dtype, requires_grad=True)
    x_nograd = x.detach()
    grad = torch.randn_like(x)
    params = list(m.parameters())

    def op(core, inp):
        return lambda: torch.ops.hfnn.multi_head_attention(inp, inp, inp, heads, m.in_proj_weight, m.in_proj_bias,
                                                           m.out_proj.weight, m.out_proj.bias, True, False, 0.0, core)

    cands = {"torch": (lambda: m(x, x, x, need_weights=False)[0], lambda: m(x_nograd, x_nograd, x_nograd,
                                                                            need_weights=False)[0])}
    for c in args.cores:
        cands[c] = (op(c, x), op(c, x_nograd))
    records = []
    for name, (fn, fn_nograd) in cands.items():
        fwd = per_call(fn)
        tot = per_call(lambda: fn().backward(grad))

        def fresh():
            for p in params:
                p.grad = None
            x.grad = None
            fn().backward(grad)

        none = per_call(fresh)
        nox = per_call(lambda: fn_nograd().backward(grad))
        records.append(record(args.run, name, fwd=fwd, fwd_bwd=tot, fwd_bwd_grads_none=none, fwd_bwd_x_no_grad=nox))
        print(f"{name:12s} wall/cpu us: fwd {fwd[0]:6.1f}/{fwd[1]:6.1f}  fwd+bwd {tot[0]:6.1f}/{tot[1]:6.1f}  "
              f"grads None {none[0]:6.1f}/{none[1]:6.1f}  x no grad {nox[0]:6.1f}/{nox[1]:6.1f}", flush=True)
    # The autograd engine's own cost on this host: a backward of one elementwise node (one kernel),
    # and of a sum of 5 leaves whose .grad exists (5 add nodes, 5 accumulations, as the op has 5 leaves).
    leaves = [torch.randn(64, device="cuda", requires_grad=True) for _ in range(5)]
    one = per_call(lambda: (leaves[0] * 2).backward(leaves[0].detach()))
    five = per_call(lambda: sum(leaves).backward(leaves[0].detach()))
    launch = per_call(lambda: leaves[0].detach().mul(2))
    records.append(record(args.run, "floor", backward_one_node=one, backward_sum_of_5_leaves=five,
                          one_eager_kernel=launch))
    if args.out:
        save(args.out, records, args)
    print(f"floor        wall/cpu us: one node {one[0]:6.1f}/{one[1]:6.1f}  sum of 5 leaves {five[0]:6.1f}/"
          f"{five[1]:6.1f}  one eager kernel (mul) {launch[0]:6.1f}/{launch[1]:6.1f}", flush=True)


if __name__ == "__main__":
    main()
