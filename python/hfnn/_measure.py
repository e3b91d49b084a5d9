"""What the tune worker and the family modules share to measure a candidate: CUDA-graph timing
over rotating inputs, wall time per call as a training loop sees it, the error against a float64
reference, and a one-line error message."""
from __future__ import annotations

import math
import time


def first_line(e: BaseException) -> str:
    return (str(e).splitlines() or [type(e).__name__])[0][:300]


def tunable_dtype(torch, name: str):
    """The torch dtype of a request's dtype name; ValueError for one no family tunes."""
    dtype = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}.get(name)
    if dtype is None:
        raise ValueError(f"dtype {name} is not tunable (float32, float16, bfloat16)")
    return dtype


def failed_candidate(torch, pass_: str, name: str, e: BaseException) -> dict:
    """A candidate that raised, as the answer records it: one candidate failing is a result, not the
    end of the run. Waits for the GPU first, so the next candidate does not inherit its work."""
    try:
        torch.cuda.synchronize()
    except Exception:  # a sticky CUDA error: the next key reports it
        pass
    return {"pass": pass_, "name": name, "ran": False, "error": first_line(e)}


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


def wall_samples(torch, call, budget_s: float, min_samples: int = 7, max_samples: int = 31) -> list:
    """Per-call µs of call(i) run back to back, as a training loop runs them: the CPU launches what the
    GPU then runs, synchronized once per sample. Each sample is `inner` calls of about 2 ms together."""
    for i in range(3):
        call(i)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    call(0)
    torch.cuda.synchronize()
    one = max(time.perf_counter() - t0, 1e-6)
    inner = max(3, min(100, math.ceil(2e-3 / one)))
    samples, started = [], time.perf_counter()
    while len(samples) < max_samples and (len(samples) < min_samples or time.perf_counter() - started < budget_s):
        t0 = time.perf_counter()
        for i in range(inner):
            call(i)
        torch.cuda.synchronize()
        samples.append((time.perf_counter() - t0) * 1e6 / inner)
    return samples
