"""What the tune worker and the family modules share to measure a candidate: CUDA-graph timing
over rotating inputs, wall time per call as a training loop sees it (the candidates' samples taken
in turn), the error against a float64 reference, and a one-line error message."""
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


def failed_candidate(torch, pass_: str, name: str, e) -> dict:
    """A candidate that raised `e` (the exception, or its first line), as the answer records it: one
    candidate failing is a result, not the end of the run. Waits for the GPU first, so what the
    candidate queued is not counted to the next one."""
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


def _calibrate(torch, call) -> int:
    """Warms call(i) up and returns how many calls make a sample of about 2 ms (3 to 100)."""
    for i in range(3):
        call(i)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    call(0)
    torch.cuda.synchronize()
    one = max(time.perf_counter() - t0, 1e-6)
    return max(3, min(100, math.ceil(2e-3 / one)))


def _sample(torch, call, inner: int) -> float:
    """Per-call µs of `inner` calls back to back, synchronized once at the end."""
    t0 = time.perf_counter()
    for i in range(inner):
        call(i)
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) * 1e6 / inner


def wall_samples_in_turn(torch, calls: dict, budget_s: float, min_samples: int = 7,
                         max_samples: int = 31) -> tuple:
    """Per-call µs of each candidate's call(i) run back to back, as a training loop runs them: the CPU
    launches what the GPU then runs, synchronized once per sample (`inner` calls of about 2 ms
    together). The samples are taken in turn, one of each candidate a round: where a call is
    host-bound its time is its CPU's, and the GPU machines' CPUs drift by up to 2x within a minute
    (bench/README.md, "The issue's configs on an H100, candidates timed in turn"), so candidates timed
    one after another would compare their moments. At least min_samples rounds, more while budget_s
    (all candidates together) lasts, at most max_samples. Returns ({name: samples}, {name: the
    first line of what it raised}): a candidate that raises leaves the rounds, the others go on. Only
    the line is kept: the exception's traceback would hold the frames that raised it, and their
    tensors, past the call (a reference cycle through the caller's frame)."""
    samples, failed, inner = {}, {}, {}

    def fail(name, e):
        failed[name] = first_line(e)
        samples.pop(name, None)
        try:
            torch.cuda.synchronize()  # its work done before the next candidate's sample
        except Exception:  # a sticky CUDA error: the caller reports it
            pass

    for name, call in calls.items():
        try:
            inner[name] = _calibrate(torch, call)
            samples[name] = []
        except Exception as e:
            fail(name, e)
    started, rounds = time.perf_counter(), 0
    while samples and rounds < max_samples and (rounds < min_samples or time.perf_counter() - started < budget_s):
        for name in list(samples):
            try:
                samples[name].append(_sample(torch, calls[name], inner[name]))
            except Exception as e:
                fail(name, e)
        rounds += 1
    return samples, failed


def train_records(torch, names, errors: dict, calls: dict, failed: dict, budget_s: float) -> list:
    """A family's "train" candidates as the tune worker answers them, in `names`' order: those in
    `calls` (call(i): one training call on input set i) timed in turn within budget_s (at least 20
    ms a candidate), each with its float64 error from `errors` (None where not finite); those in
    `failed` (name: the first line of what it raised in its check), or failing while timed, as
    failed_candidate records."""
    samples, timing_failed = wall_samples_in_turn(torch, calls, max(0.02 * len(calls), budget_s))
    failed = {**failed, **timing_failed}
    return [failed_candidate(torch, "train", name, failed[name]) if name in failed else
            {"pass": "train", "name": name, "samples_us": [round(s, 3) for s in samples[name]],
             "max_error": errors[name] if math.isfinite(errors[name]) else None} for name in names]
