"""A quick look at named LayerNorm variants on the GPU before a long run: each runs forward and
backward at a few shapes, against float64, under a watchdog (a kernel that hangs ends the process
after --timeout seconds with the case it was on, instead of eating a device call's whole limit).

    python3 scripts/layer_norm_smoke.py --variants fwd_tma_w8 bwd_tma_w8 [--widths 64 1024 4096]

Prints one line a case: variant, dtype, rows x cols, max relative error, or why it was skipped.
Exit status 1 if any case is off by more than the dtype's tolerance, 2 on a hang.
"""
import argparse
import faulthandler
import os
import sys
import threading

import torch
import torch.nn.functional as F

import hfnn  # registers torch.ops.hfnn

TOL = {torch.float32: 2e-5, torch.float16: 3e-3, torch.bfloat16: 2e-2}
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def rel(got, want):
    got, want = got.double(), want.double()
    return float((got - want).norm() / max(float(want.norm()), 1e-30))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--variants", nargs="+", required=True, help="fwd_* and bwd_* variant names")
    # odd widths too: rows aligned to one element, which only some variants take (the window paths)
    ap.add_argument("--widths", nargs="+", type=int,
                    default=[8, 33, 64, 200, 256, 1000, 1023, 1024, 1536, 4096, 4097, 8192, 12289, 16384])
    ap.add_argument("--rows", nargs="+", type=int, default=[1, 3, 257, 4099])
    ap.add_argument("--dtypes", nargs="+", default=list(DTYPES), choices=list(DTYPES))
    ap.add_argument("--timeout", type=float, default=120)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("scripts/layer_norm_smoke.py: no CUDA device; run it on the GPU machine "
                 "(SMOKE_VARIANTS=... bash scripts/device_run.sh smoke)")
    known = {v for names in hfnn.layer_norm_variants().values() for v in names}
    unknown = [v for v in args.variants if v not in known]
    if unknown:
        sys.exit(f"scripts/layer_norm_smoke.py: --variants: unknown {', '.join(unknown)}; "
                 f"this build has {', '.join(sorted(known))}")
    current = ["start"]

    def watchdog():
        print(f"HANG: no progress for {args.timeout:.0f} s at {current[0]}", flush=True)
        faulthandler.dump_traceback()
        os._exit(2)

    bad = 0
    for name in args.variants:
        backward = name.startswith("bwd")
        for dt in args.dtypes:
            dtype = DTYPES[dt]
            for cols in args.widths:
                for rows in args.rows:
                    current[0] = f"{name} {dt} {rows}x{cols}"
                    timer = threading.Timer(args.timeout, watchdog)
                    timer.daemon = True  # an exception ends the script without waiting for it
                    timer.start()
                    torch.manual_seed(rows * 7 + cols)
                    x = (torch.randn(rows, cols, device="cuda") * 2 + 0.5).to(dtype)
                    w = (torch.rand(cols, device="cuda") + 0.5).to(dtype)
                    b = torch.randn(cols, device="cuda").to(dtype)
                    if not torch.ops.hfnn.layer_norm_supports(x, [cols], w, b, name):
                        timer.cancel()
                        print(f"{current[0]}: not supported")
                        continue
                    xd, wd, bd = x.double(), w.double(), b.double()
                    if not backward:
                        y, mean, rstd = torch.ops.hfnn.layer_norm_fwd(x, [cols], w, b, 1e-5, name)
                        torch.cuda.synchronize()
                        err = rel(y, F.layer_norm(xd, [cols], wd, bd, 1e-5))
                    else:
                        _, mean, rstd = torch.ops.hfnn.layer_norm_fwd(x, [cols], w, b, 1e-5, "")
                        dy = torch.randn(rows, cols, device="cuda").to(dtype)
                        dx, dw, db = torch.ops.hfnn.layer_norm_bwd(dy, x, [cols], mean, rstd, w, b,
                                                                  [True, True, True], name)
                        torch.cuda.synchronize()
                        xr = xd.requires_grad_(True)
                        wr, br = wd.clone().requires_grad_(True), bd.clone().requires_grad_(True)
                        F.layer_norm(xr, [cols], wr, br, 1e-5).backward(dy.double())
                        err = max(rel(dx, xr.grad), rel(dw, wr.grad), rel(db, br.grad))
                    timer.cancel()
                    ok = err <= TOL[dtype] * (4 if backward else 1)
                    bad += not ok
                    print(f"{current[0]}: {'ok' if ok else 'MISMATCH'} {err:.2e}", flush=True)
    print(f"{bad} mismatches")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
