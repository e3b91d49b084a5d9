"""What the tune worker and the family modules share to measure a candidate: CUDA-graph timing
over rotating inputs, the error against a float64 reference, and a one-line error message."""
from __future__ import annotations

import math
import time


def first_line(e: BaseException) -> str:
    return (str(e).splitlines() or [type(e).__name__])[0][:300]


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
