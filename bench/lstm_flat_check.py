#!/usr/bin/env python3
"""cuDNN's nn.LSTM fwd+bwd with its weights as built on the GPU (separate tensors: cuDNN copies them
into one buffer on every call, with a warning) and after flatten_parameters() (as .to()/.cuda()
leave a model). The LSTM benchmarks before 2026-11-23 (second session) timed the first kind.

    python3 bench/lstm_flat_check.py --json bench/results/lstm_cudnn_flat-h200.json
"""
import argparse
import datetime as dt
import json
import time
import warnings

import torch


def timed(f, reps=5):
    f()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        f()
        torch.cuda.synchronize()
        ts.append(time.perf_counter() - t)
    return sorted(ts)[len(ts) // 2] * 1e3


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", help="write the records here")
    args = ap.parse_args()
    warnings.simplefilter("ignore")  # the "not part of single contiguous chunk" warning is the point
    recs = []
    for (i, h, b, t) in [(985, 985, 4, 1000), (512, 512, 32, 256), (256, 256, 128, 100)]:
        for name in ("float32", "bfloat16"):
            dtype = getattr(torch, name)
            torch.manual_seed(0)
            m = torch.nn.LSTM(i, h, device="cuda", dtype=dtype)
            x = torch.randn(t, b, i, device="cuda", dtype=dtype, requires_grad=True)
            dy = torch.randn(t, b, h, device="cuda", dtype=dtype)

            def step():
                return torch.autograd.grad(m(x)[0], [x, *m.parameters()], dy)

            separate = timed(step)
            m.flatten_parameters()
            flat = timed(step)
            print(f"{[i, h, b, t]} {name}: cuDNN fwd+bwd, separate weights {separate:.3f} ms, flattened {flat:.3f} ms")
            recs.append(dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__,
                             date=dt.date.today().isoformat(), config=[i, h, b, t], dtype=name,
                             separate_ms=round(separate, 3), flat_ms=round(flat, 3)))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(recs, f, indent=1)


if __name__ == "__main__":
    main()
