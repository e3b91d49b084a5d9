#!/usr/bin/env python3
"""A training loop over the seed's AlphaFold LayerNorm shapes (bench/layer_norm.py's SEED_SHAPES plus
hfai.nn's [200,128,1024]), float32 and bfloat16: one LayerNorm layer per shape, forward and backward,
AdamW. Nothing else runs, so `hfnn profile` of it records every seed shape and `hfnn tune` has the
seed's whole table to tune (bench/tune.py uses it beside the Evoformer example).

    python3 bench/seed_shapes_train.py --steps 3
"""
from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

# Run as a script, this folder is sys.path[0]: keep it from shadowing the standard library (torch
# imports `profile`), and load the seed table from bench/layer_norm.py by path.
sys.path = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
import torch  # noqa: E402

_spec = importlib.util.spec_from_file_location("bench_layer_norm", Path(__file__).resolve().parent / "layer_norm.py")
_bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_bench)
SEED_SHAPES, EXTRA_SHAPES = _bench.SEED_SHAPES, _bench.EXTRA_SHAPES


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("seed_shapes_train.py: needs a CUDA device (the seed shapes are GPU-sized)")
    torch.manual_seed(0)
    layers = []
    for shape, _ in SEED_SHAPES + EXTRA_SHAPES:
        for name in args.dtypes:
            dtype = getattr(torch, name)
            ln = torch.nn.LayerNorm(shape[-1], device="cuda", dtype=dtype)
            x = torch.randn(shape, device="cuda", dtype=dtype).mul_(2).add_(0.5)
            layers.append((ln, x))
    opt = torch.optim.AdamW([p for ln, _ in layers for p in ln.parameters()])
    for step in range(args.steps):
        for ln, x in layers:
            ln(x).float().square().mean().backward()
        opt.step()
        opt.zero_grad()
        torch.cuda.synchronize()
        print(f"step {step + 1}/{args.steps}", flush=True)


if __name__ == "__main__":
    main()
