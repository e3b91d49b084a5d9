#!/usr/bin/env python3
"""What `hfnn profile`'s collector costs per ATen op on the CPU that launches them (issue 13, item 2).

    python3 bench/collector_cost.py                                   # a quick look (3 rounds)
    python3 bench/collector_cost.py --rounds 5 --out bench/results/collector_cost-<host>.json

On a launch-bound step the CPU spends about 5-20 µs per op, so a collector that is left on must cost
well under 1 µs an op. Each workload runs `--ops` ATen ops (counted by the collector itself: its
records of ops, autograd nodes and scopes) in a fresh process per mode, the modes alternating round
by round, so each mode sees the same host noise:

  off             no collector (the baseline)
  hfnn            as under `hfnn profile --warmup 0 --steps 0`: the start-up hook starts the
                  collector, which records every op of every step
  hfnn-sample-N   the same under `hfnn profile --sample N` (every N-th step recorded in full),
                  for each N in --sample (only where this build has the option)
  floor           (--floor) an observer that does nothing, with the collector's scopes and no inputs:
                  what torch's RecordFunction machinery costs any observer of every op (a C++
                  extension built with torch.utils.cpp_extension, about a minute the first time)
  torch.profiler  torch.profiler.profile(activities=[CPU]), for comparison; and
  torch.profiler+shapes  the same with record_shapes=True

The workloads: `add` (torch.add of two 4-element tensors), `view` (x.view, x.t(), x[0]: views, each a
few nested records), `linear` (a step: nn.Linear(16, 16) forward, loss, backward, SGD step; step
boundaries and autograd nodes, as in training). Per mode the median over rounds of the best of
--repeats timed passes, in the CPU time of the thread that runs the ops (--clock thread, the
default: on a shared host elapsed time swings 2-3x with the other processes' load); µs per op =
(mode's time - off's) / records. No GPU is used (CUDA activity
costs come on top, on a GPU). The result is a JSON object: host, cpu, torch, hfnn commit, date,
ops, rounds, and per workload the records, the seconds per mode and `us_per_op` per mode.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _bench import write_result  # noqa: E402

WORKLOADS = ("add", "view", "linear")

# The floor: an observer whose callbacks do nothing, on the scopes the collector observes.
FLOOR_SOURCE = r"""
#include <ATen/record_function.h>
#include <torch/extension.h>
static std::unique_ptr<at::ObserverContext> start(const at::RecordFunction&) { return nullptr; }
static void end(const at::RecordFunction&, at::ObserverContext*) {}
void observe() {
  at::addGlobalCallback(at::RecordFunctionCallback(start, end).needsInputs(false).scopes(
      {at::RecordScope::FUNCTION, at::RecordScope::BACKWARD_FUNCTION, at::RecordScope::USER_SCOPE}));
}
"""


def floor_observer(build_dir):
    from torch.utils.cpp_extension import load_inline

    return load_inline("hfnn_bench_floor_observer", cpp_sources=FLOOR_SOURCE, functions=["observe"],
                       build_directory=str(build_dir), verbose=False)


def _workload(name, torch, device="cpu"):
    """One pass of the workload as a function of its iteration count, on `device`."""
    if name == "add":
        a, b = torch.ones(4, device=device), torch.ones(4, device=device)

        def run(n):
            for _ in range(n):
                torch.add(a, b)
        return run
    if name == "view":
        x = torch.ones(4, 4, device=device)

        def run(n):
            for _ in range(n):
                x.view(16)
                x.t()
                x[0]
        return run
    model = torch.nn.Linear(16, 16).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    data = torch.ones(8, 16, device=device)

    def run(n):
        for _ in range(n):
            opt.zero_grad()
            model(data).sum().backward()
            opt.step()
    return run


def child(args) -> None:
    """One mode and workload in this process: prints {"seconds": best pass, "records": per pass}."""
    import torch

    torch.set_num_threads(1)
    if args.mode == "floor":
        floor_observer(args.floor_dir).observe()
    run = _workload(args.workload, torch, args.device)
    sync = torch.cuda.synchronize if args.device == "cuda" else (lambda: None)
    run(200)  # warm-up: first calls, caches
    sync()
    records = None
    if args.mode.startswith("hfnn"):
        # The records one pass makes, counted by the collector itself (its snapshot's calls).
        def counted():
            snap = json.loads(torch.ops.hfnn.profiler_snapshot())
            return sum(o["calls"] for o in snap["ops"]) + sum(s["calls"] for s in snap["shapes"])
        before = counted()
        run(100)
        records = (counted() - before) / 100
    profiler = None
    if args.mode.startswith("torch.profiler"):
        activities = [torch.profiler.ProfilerActivity.CPU]
        if args.device == "cuda":
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        profiler = torch.profiler.profile(activities=activities, record_shapes=args.mode.endswith("+shapes"))
        profiler.__enter__()
    clock = time.thread_time if args.clock == "thread" else time.perf_counter
    best = float("inf")
    for _ in range(args.repeats):
        t0 = clock()
        run(args.iterations)
        sync()
        best = min(best, clock() - t0)
    if profiler is not None:
        profiler.__exit__(None, None, None)
    print(json.dumps({"seconds": best, "records": records}))


def run_child(mode, workload, iterations, repeats, clock, work, device="cpu") -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HFNN_")}
    (work / "floor").mkdir(exist_ok=True)
    if mode.startswith("hfnn"):
        env.update(HFNN_PROFILE_DIR=str(work), HFNN_PROFILE_WARMUP="0", HFNN_PROFILE_STEPS="0")
        if mode.startswith("hfnn-sample-"):
            env["HFNN_PROFILE_SAMPLE"] = mode.rsplit("-", 1)[1]
        if mode.startswith("hfnn-parts-"):
            env["HFNN_PROFILE_PARTS"] = mode[len("hfnn-parts-"):]
        if mode.startswith("hfnn-join-"):
            env["HFNN_CUPTI_JOIN"] = mode[len("hfnn-join-"):]
    cmd = [sys.executable, __file__, "--child", mode, "--workload", workload, "--iterations", str(iterations),
           "--repeats", str(repeats), "--clock", clock, "--floor-dir", str(work / "floor"), "--device", device]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"bench/collector_cost.py: mode {mode}, workload {workload} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def hfnn_commit() -> str | None:
    out = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return out.stdout.strip() or None


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ops", type=int, default=200_000, help="records per timed pass, about (default 200000)")
    ap.add_argument("--rounds", type=int, default=3, help="rounds of every mode, alternating (default 3)")
    ap.add_argument("--repeats", type=int, default=5, help="timed passes per process, the best kept (default 5)")
    ap.add_argument("--clock", choices=["thread", "wall"], default="thread",
                    help="thread: the CPU time of the thread running the ops (default; steadier on a shared host, "
                         "and the ops run on that one thread: torch.set_num_threads(1)); wall: elapsed time")
    ap.add_argument("--workloads", default=",".join(WORKLOADS), help=f"comma-separated, of {','.join(WORKLOADS)}")
    ap.add_argument("--sample", default="", help="hfnn --sample values to time too, comma-separated (e.g. 10)")
    ap.add_argument("--parts", default="",
                    help="the collector with some parts only, comma-separated HFNN_PROFILE_PARTS values (observer, "
                         "no-cupti, attached, kernels-only, ...: profiles/README.md), each a mode hfnn-parts-P")
    ap.add_argument("--joins", default="", help="other ways to join kernels to ops, comma-separated HFNN_CUPTI_JOIN "
                    "values (callbacks), each a mode hfnn-join-J; hfnn is the default join (external)")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                    help="where the workloads' tensors live: cuda adds the CUDA activity (CUPTI) to the collector's "
                         "cost and to torch.profiler's, each op a kernel launch (default cpu)")
    ap.add_argument("--no-torch-profiler", action="store_true", help="leave the torch.profiler modes out")
    ap.add_argument("--floor", action="store_true",
                    help="time an observer that does nothing too: torch's own cost per observed op (builds a C++ extension)")
    ap.add_argument("--out", type=Path, help="write the JSON result here")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--workload", help=argparse.SUPPRESS)
    ap.add_argument("--iterations", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--floor-dir", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        args.mode = args.child
        return child(args)

    import torch

    workloads = [w for w in args.workloads.split(",") if w]
    for w in workloads:
        if w not in WORKLOADS:
            sys.exit(f"bench/collector_cost.py: --workloads: unknown workload {w!r}; use some of {','.join(WORKLOADS)}")
    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("bench/collector_cost.py: --device cuda: no CUDA device here; run it on a GPU machine or drop the option")
    modes = ["off", "hfnn"] + [f"hfnn-sample-{n}" for n in args.sample.split(",") if n]
    modes += [f"hfnn-parts-{p}" for p in args.parts.split(",") if p]
    modes += [f"hfnn-join-{j}" for j in args.joins.split(",") if j]
    if args.floor:
        modes.append("floor")
    if not args.no_torch_profiler:
        modes += ["torch.profiler", "torch.profiler+shapes"]
    result = {"host": socket.gethostname(), "cpu": cpu_model(), "cores": os.cpu_count(), "torch": torch.__version__,
              "hfnn_commit": hfnn_commit(), "date": dt.date.today().isoformat(), "ops": args.ops,
              "rounds": args.rounds, "repeats": args.repeats, "clock": args.clock, "device": args.device,
              "gpu": torch.cuda.get_device_name() if args.device == "cuda" else None, "workloads": {}}
    with tempfile.TemporaryDirectory(prefix="hfnn-bench-collector-") as tmp:
        work = Path(tmp)
        if args.floor:  # built once, before anything is timed
            (work / "floor").mkdir()
            floor_observer(work / "floor")
        for w in workloads:
            # Records per iteration, from the collector, size the passes to about --ops records.
            probe = run_child("hfnn", w, 10, 1, args.clock, work, args.device)
            per_iteration = probe["records"]
            iterations = max(1, round(args.ops / per_iteration))
            seconds = {m: [] for m in modes}
            for r in range(args.rounds):
                for m in modes:
                    seconds[m].append(run_child(m, w, iterations, args.repeats, args.clock, work, args.device)["seconds"])
                print(f"{w}: round {r + 1} of {args.rounds}, µs per op: "
                      + ", ".join(f"{m} {seconds[m][-1] / (per_iteration * iterations) * 1e6:.3f}" for m in modes),
                      file=sys.stderr, flush=True)
            records = per_iteration * iterations
            median = {m: statistics.median(s) for m, s in seconds.items()}
            result["workloads"][w] = {
                "records_per_iteration": per_iteration,
                "records": records,
                "seconds": {m: [round(x, 5) for x in s] for m, s in seconds.items()},
                "us_per_op_off": round(median["off"] / records * 1e6, 4),
                "us_per_op": {m: round((median[m] - median["off"]) / records * 1e6, 4) for m in modes if m != "off"},
            }
            print(f"{w}: {per_iteration:g} records an iteration, {median['off'] / records * 1e6:.3f} µs per op "
                  f"without a collector; added per op: "
                  + ", ".join(f"{m} {v:+.3f} µs" for m, v in result["workloads"][w]["us_per_op"].items()),
                  file=sys.stderr)
            if args.out:  # after each workload: a run cut short keeps what it measured
                args.out.parent.mkdir(parents=True, exist_ok=True)
                args.out.write_text(json.dumps(result, indent=1) + "\n")
    write_result(result, args.out)


if __name__ == "__main__":
    main()
