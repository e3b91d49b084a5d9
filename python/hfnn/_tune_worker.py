"""The measuring half of `hfnn tune`: started by the hfnn executable, never by users.

It speaks JSON lines. First it prints {"hello": {...}} (the GPU and the versions the results are
keyed by) or {"error": "..."} and exits 3 when there is nothing to tune on. Then for each request
line, {"op": "layer_norm", "key": "rows=R,D=C,affine=1", "dtype": "float32", "passes": ["fwd", "bwd"],
"seconds": 2.0}, it prints one line with every candidate's timing samples and its error against a
float64 reference: {"key", "dtype", "candidates": [{"pass", "name", "samples_us", "max_error"} or
{"pass", "name", "ran": false, "error"}], "seconds"}. The executable gates, picks and stores
(tuner/tuner.h); this file only measures.

How: each candidate runs as one CUDA graph of back-to-back calls over rotating input sets three
times the size of L2 (the cache flatters nothing, CPU dispatch is out of the number, launch gaps
are those of a training step); samples are per-call times of repeated replays. Inputs are drawn
like activations (normal, scaled and shifted, never zeros). The error is max|out - ref| / max|ref|
over each output (forward: y, mean and rstd; backward: dx, dgamma, dbeta), on fresh inputs, against
torch's float64 LayerNorm.

HFNN_TUNE_PLANT_WRONG=1 adds a fast candidate that is wrong on purpose ("planted_wrong": hfnn's
kernel with the wrong eps forward, a skewed rstd backward): the gate must reject it.
"""
from __future__ import annotations

import json
import math
import os
import re
import sys
import time


# The protocol's own copy of stdout: main() points fd 1 at stderr, so whatever a library prints
# cannot fall between two answers.
_protocol = sys.stdout


def emit(obj) -> None:
    _protocol.write(json.dumps(obj) + "\n")
    _protocol.flush()


def first_line(e: BaseException) -> str:
    return (str(e).splitlines() or [type(e).__name__])[0][:300]


def hello(torch, hfnn, device: int) -> dict:
    props = torch.cuda.get_device_properties(device)
    return {"gpu": props.name, "compute_capability": f"{props.major}.{props.minor}",
            "sm_count": props.multi_processor_count, "cuda": torch.version.cuda or "", "torch": torch.__version__,
            "hfnn": hfnn.__version__, "l2_bytes": props.L2_cache_size}


def rel_error(out, ref) -> float:
    """max|out - ref| / max|ref| (inf when out has a NaN or Inf); 0 when the output is not asked for."""
    if out is None or ref is None:
        return 0.0
    out = out.double()
    if not bool(out.isfinite().all()):
        return math.inf
    scale = ref.abs().max().item()
    return (out - ref).abs().max().item() / (scale if scale > 0 else 1.0)


def graph_samples(calls, budget_s: float = 0.0, min_samples: int = 7, max_samples: int = 31) -> list:
    """Per-call µs of `calls` (closures, e.g. over rotating buffer sets) captured as one CUDA graph and
    replayed: at least min_samples replays, more while budget_s lasts, at most max_samples. Warmed up
    on a side stream first (what capture needs). bench/layer_norm.py times the same way."""
    import torch

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for c in calls[:min(3, len(calls))]:
            c()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for c in calls:
            c()
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    samples, t0 = [], time.perf_counter()
    while len(samples) < max_samples and (len(samples) < min_samples or time.perf_counter() - t0 < budget_s):
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) * 1e3 / len(calls))
    del graph
    return samples


def measure_layer_norm(torch, hfnn, req: dict, l2_bytes: int, plant: bool) -> dict:
    m = re.fullmatch(r"rows=(\d+),D=(\d+),affine=([01])", req["key"])
    if not m:
        raise ValueError(f"not a LayerNorm key: {req['key']}")
    rows, cols, affine = int(m.group(1)), int(m.group(2)), m.group(3) == "1"
    dtype = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}.get(req["dtype"])
    if dtype is None:
        raise ValueError(f"dtype {req['dtype']} is not tunable (float32, float16, bfloat16)")
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
        except Exception as e:  # one candidate failing is a result, not the end of the run
            try:
                torch.cuda.synchronize()
            except Exception:  # a sticky CUDA error: the next key reports it
                pass
            out.append({"pass": pass_, "name": name, "ran": False, "error": first_line(e)})
    return {"key": req["key"], "dtype": req["dtype"], "op": "layer_norm", "candidates": out,
            "seconds": round(time.perf_counter() - started, 3)}


def main() -> int:
    global _protocol
    _protocol = os.fdopen(os.dup(sys.stdout.fileno()), "w")
    sys.stdout.flush()
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    device = int(os.environ.get("HFNN_TUNE_DEVICE", "0"))
    try:
        import torch
        import hfnn
    except Exception as e:
        emit({"error": f"cannot import torch and hfnn in {sys.executable}: {e}"})
        return 3
    if not torch.cuda.is_available():
        emit({"error": "no CUDA device visible to torch: tuning measures kernels on the GPU they will run on"})
        return 3
    if device >= torch.cuda.device_count():
        emit({"error": f"--device {device}, but this machine has {torch.cuda.device_count()} CUDA device(s)"})
        return 3
    if not hfnn.build_info().get("cuda_kernels"):
        emit({"error": f"this hfnn build has no CUDA kernels ({hfnn.ops_error() or 'built without nvcc'}): "
                       "reinstall with the CUDA toolkit present"})
        return 3
    torch.cuda.set_device(device)
    info = hello(torch, hfnn, device)
    emit({"hello": info})
    plant = os.environ.get("HFNN_TUNE_PLANT_WRONG") == "1"
    for line in sys.stdin:
        if not line.strip():
            continue
        req = json.loads(line)
        try:
            if req.get("op") != "layer_norm":
                raise ValueError(f"no hfnn variants for {req.get('op')} yet")
            emit(measure_layer_norm(torch, hfnn, req, info["l2_bytes"], plant))
        except Exception as e:
            emit({"key": req.get("key"), "dtype": req.get("dtype"), "op": req.get("op"), "error": first_line(e)})
        try:
            torch.cuda.empty_cache()
        except Exception:
            pass
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:  # Ctrl-C reaches the whole process group: hfnn tune keeps what is done
        sys.exit(130)
