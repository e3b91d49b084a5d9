#!/usr/bin/env python3
"""Runs one LayerNorm variant a few times on one shape, for Nsight Compute to look at:

    ncu --clock-control none -k regex:bwd_regs --launch-skip 3 --launch-count 1 \\
        python3 bench/profile_variant.py --shape 65536 128 --dtype bfloat16 --variant bwd_regs_tpr16_r2
"""
import argparse

import torch

import hfnn  # noqa: F401  (loads the op library)

ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
ap.add_argument("--shape", type=int, nargs="+", required=True, help="input shape; LayerNorm over the last dim")
ap.add_argument("--dtype", default="bfloat16", choices=["float32", "float16", "bfloat16"])
ap.add_argument("--variant", required=True, help="a name from `hfnn variants`")
ap.add_argument("--runs", type=int, default=5)
ap.add_argument("--dx-only", action="store_true", help="the backward without dgamma/dbeta (mask [True, False, False])")
args = ap.parse_args()

dtype = getattr(torch, args.dtype)
d = args.shape[-1]
x = torch.randn(args.shape, device="cuda", dtype=dtype)
dy = torch.randn_like(x)
w = torch.randn(d, device="cuda", dtype=dtype)
b = torch.randn(d, device="cuda", dtype=dtype)
_, mean, rstd = torch.ops.aten.native_layer_norm(x, [d], w, b, 1e-5)
for _ in range(args.runs):
    if args.variant.startswith("fwd"):
        torch.ops.hfnn.layer_norm_fwd(x, [d], w, b, 1e-5, args.variant)
    else:
        torch.ops.hfnn.layer_norm_bwd(dy, x, [d], mean, rstd, w, b, [True, not args.dx_only, not args.dx_only], args.variant)
torch.cuda.synchronize()
