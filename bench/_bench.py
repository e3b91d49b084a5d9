"""What the benchmark scripts share: finding the hfnn command, running a step that must succeed,
and writing the result JSON. Imported by the scripts in this folder (run by path, so this folder is
on sys.path)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path


def script_name() -> str:
    return f"bench/{os.path.basename(sys.argv[0])}"


def require_hfnn() -> str:
    """The hfnn executable, or exit with one line saying how to get it."""
    hfnn = shutil.which("hfnn")
    if hfnn is None:
        sys.exit(f"{script_name()}: the hfnn command is not on PATH: run scripts/setup.sh")
    return hfnn


def run(cmd, **kw) -> subprocess.CompletedProcess:
    """cmd with captured output; a failure ends the benchmark with its stderr's tail."""
    out = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if out.returncode != 0:
        sys.exit(f"{script_name()}: {' '.join(map(str, cmd[:6]))}... failed ({out.returncode}):\n{out.stderr[-3000:]}")
    return out


def write_result(result: dict, out: Path | None, leave_out: tuple = ()) -> None:
    """Writes the result JSON to `out` (when given) and prints it, less the `leave_out` keys."""
    if out:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k not in leave_out}, indent=1))


def graph_timer(reps: int):
    """`timed(calls)` as the LayerNorm benchmarks time: the calls captured back to back in one CUDA
    graph, replayed `reps` times; returns the median µs per call and the quintiles (p20 is [0], p80
    [3])."""
    import statistics

    from hfnn._measure import graph_samples

    def timed(calls):
        times = graph_samples(calls, min_samples=reps, max_samples=reps)
        return statistics.median(times), statistics.quantiles(times, n=5)

    return timed


def copy_tbps(timed) -> float:
    """The ceiling kernels are held against: TB/s (bytes read + written) of a 1 GiB device-to-device
    copy by a kernel (a graph's memcpy node may go to a copy engine, which is slower than the SMs).
    `timed(calls)` returns the median µs per call first."""
    import torch

    numel = 1 << 28
    return 2 * numel * 4 / (_neg_us(timed, numel, 4) * 1e-6) / 1e12


def launch_us(timed) -> float:
    """The least a kernel costs the way the benchmarks time it: µs per call of a one-element kernel
    (torch.neg), back to back in one CUDA graph. No kernel of a graph replay takes less."""
    return _neg_us(timed, 1, 200)


def _neg_us(timed, numel: int, calls: int) -> float:
    """µs per call of torch.neg over `numel` float32 into a second buffer, `calls` of them a graph."""
    import torch

    src = torch.empty(numel, dtype=torch.float32, device="cuda").normal_()
    dst = torch.empty_like(src)
    return timed([lambda: torch.neg(src, out=dst)] * calls)[0]
