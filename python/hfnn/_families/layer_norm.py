"""LayerNorm's part of `hfnn tune` and of the module swap (the family's C++ description is
kernels/layer_norm/layer_norm_family.cpp).

measure(): a request {"key": "rows=R,D=C,affine=1", "dtype", "passes", "seconds"} answered with torch's
kernel and every hfnn variant that takes the shape, forward and backward. Timing sets are x, dy and the
forward's mean and rstd, rotated past L2; inputs are drawn like activations (normal, scaled and
shifted, never zeros). The error is max|out - ref| / max|ref| over each output (forward: y, mean and
rstd; backward: dx, dgamma, dbeta), on fresh inputs, against torch's float64 LayerNorm. With `plant`,
a fast candidate that is wrong on purpose ("planted_wrong": hfnn's kernel with the wrong eps forward,
a skewed rstd backward) that the gate must reject.
"""
from __future__ import annotations

import math
import re
import time

from .._measure import failed_candidate, graph_samples, rel_error, tunable_dtype

OP = "layer_norm"


def swaps() -> dict:
    """torch module class -> hfnn module class, for to_hfnn and to_torch."""
    from torch import nn

    from .. import nn as hfnn_nn

    return {nn.LayerNorm: hfnn_nn.LayerNorm}


def measure(torch, hfnn, req: dict, l2_bytes: int, plant: bool) -> dict:
    """One tune request's answer: every candidate's timing samples and error, per pass."""
    m = re.fullmatch(r"rows=(\d+),D=(\d+),affine=([01])", req["key"])
    if not m:
        raise ValueError(f"not a LayerNorm key: {req['key']}")
    rows, cols, affine = int(m.group(1)), int(m.group(2)), m.group(3) == "1"
    dtype = tunable_dtype(torch, req["dtype"])
    passes = req.get("passes", ["fwd", "bwd"])
    seconds = float(req.get("seconds", 2.0))
    started = time.perf_counter()
    ns, eps, dev = [cols], 1e-5, "cuda"
    esize = torch.empty(0, dtype=dtype).element_size()
    gen = torch.Generator(device=dev).manual_seed(0)

    def activation(n_rows):
        return torch.randn(n_rows, cols, device=dev, dtype=torch.float32, generator=gen).mul_(2).add_(0.5).to(dtype)

    w = b = None
    if affine:
        w = torch.randn(cols, device=dev, generator=gen).mul_(0.5).add_(1).to(dtype)
        b = torch.randn(cols, device=dev, generator=gen).mul_(0.5).to(dtype)
    mask = [True, affine, affine]

    # Timing sets: x, dy and the forward's mean/rstd, rotated past L2.
    set_bytes = max(1, 4 * rows * cols * esize)
    per_call_bytes = 3 * rows * cols * esize
    est_us = per_call_bytes / 3e12 * 1e6 + 3.0
    inner = max(4, min(200, math.ceil(1500.0 / est_us)))
    nsets = max(1, min(inner, math.ceil(3 * l2_bytes / set_bytes)))
    sets = []
    for _ in range(nsets):
        x = activation(rows)
        dy = torch.randn(rows, cols, device=dev, generator=gen).to(dtype)
        _, mean, rstd = torch.ops.aten.native_layer_norm(x, ns, w, b, eps)
        sets.append((x, dy, mean, rstd))

    # Correctness inputs: fresh, with the float64 reference of both passes.
    xc = activation(rows)
    dyc = torch.randn(rows, cols, device=dev, generator=gen).to(dtype)
    w64, b64 = (w.double(), b.double()) if affine else (None, None)
    y_ref, mean_ref, rstd_ref = torch.ops.aten.native_layer_norm(xc.double(), ns, w64, b64, eps)
    _, mean_c, rstd_c = torch.ops.aten.native_layer_norm(xc, ns, w, b, eps)
    d_ref = torch.ops.aten.native_layer_norm_backward(dyc.double(), xc.double(), ns, mean_ref, rstd_ref, w64, b64, mask)

    fwd_fns = {"torch": lambda x: torch.ops.aten.native_layer_norm(x, ns, w, b, eps)}
    bwd_fns = {"torch": lambda x, dy, m, r: torch.ops.aten.native_layer_norm_backward(dy, x, ns, m, r, w, b, mask)}
    variants = hfnn.layer_norm_variants()
    for v in variants["fwd"]:
        if torch.ops.hfnn.layer_norm_supports(xc, ns, w, b, v):
            fwd_fns[v] = lambda x, v=v: torch.ops.hfnn.layer_norm_fwd(x, ns, w, b, eps, v)
    for v in variants["bwd"]:
        if torch.ops.hfnn.layer_norm_supports(xc, ns, w, b, v):
            bwd_fns[v] = lambda x, dy, m, r, v=v: torch.ops.hfnn.layer_norm_bwd(dy, x, ns, m, r, w, b, mask, v)
    if plant:
        fwd_fns["planted_wrong"] = lambda x: torch.ops.hfnn.layer_norm_fwd(x, ns, w, b, 0.5, "")
        skewed = [(x, dy, m, r * 1.5) for x, dy, m, r in sets]
        bwd_fns["planted_wrong"] = None  # timed over `skewed`, below

    jobs = []
    if "fwd" in passes:
        jobs += [("fwd", name, fn) for name, fn in fwd_fns.items()]
    if "bwd" in passes:
        jobs += [("bwd", name, fn) for name, fn in bwd_fns.items()]
    out = []
    for i, (pass_, name, fn) in enumerate(jobs):
        left = seconds - (time.perf_counter() - started)
        budget = max(0.02, 0.7 * left / (len(jobs) - i))
        try:
            if pass_ == "fwd":
                # y, and the statistics the backward (whichever wins it) will be given.
                y, mean, rstd = fn(xc)
                err = max(rel_error(y, y_ref), rel_error(mean.reshape(-1), mean_ref.reshape(-1)),
                          rel_error(rstd.reshape(-1), rstd_ref.reshape(-1)))
                calls = [lambda s=sets[k % nsets]: fn(s[0]) for k in range(inner)]
            else:
                src = sets
                if name == "planted_wrong":
                    src = skewed
                    fn = lambda x, dy, m, r: torch.ops.hfnn.layer_norm_bwd(dy, x, ns, m, r, w, b, mask, "")  # noqa: E731
                    dx, dw, db = fn(xc, dyc, mean_c, rstd_c * 1.5)
                else:
                    dx, dw, db = fn(xc, dyc, mean_c, rstd_c)
                err = max(rel_error(dx, d_ref[0]), rel_error(dw, d_ref[1]), rel_error(db, d_ref[2]))
                calls = [lambda s=src[k % nsets], fn=fn: fn(*s) for k in range(inner)]
            samples = graph_samples(calls, budget)
            out.append({"pass": pass_, "name": name, "samples_us": [round(s, 4) for s in samples],
                        "max_error": err if math.isfinite(err) else None})
        except Exception as e:
            out.append(failed_candidate(torch, pass_, name, e))
    return {"key": req["key"], "dtype": req["dtype"], "op": "layer_norm", "candidates": out,
            "seconds": round(time.perf_counter() - started, 3)}
