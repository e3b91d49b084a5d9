#!/usr/bin/env python3
"""What `hfnn profile` costs and how well it agrees with torch.profiler, on a bundled example.

    python3 bench/profiler_cost.py --out bench/results/profile-h200.json        # on a GPU machine
    python3 bench/profiler_cost.py --size small --steps 5                        # a quick look on a CPU

Four runs of the example (examples/evoformer.py by default), same seed and data:
  plain        the example alone: its median step time is the reference
  hfnn         under `hfnn profile --warmup W --steps S --plain-steps P` (W and S the example's), the
               example running S + 1 + P timed steps: overhead on its first S, DB size, and the plain
               step the profile reports (issue 13: it should agree with the plain run within 5%)
  torch        under torch.profiler(record_shapes=True), the way people profile today: its overhead
  agreement    under `hfnn profile --warmup 0 --steps 0`, the same steps torch.profiler saw: per-op
               self time (CUDA on a GPU, CPU otherwise), summed over forward and backward, against
               torch.profiler's key_averages() for the ten ops hfnn ranks highest
The result is a JSON object: gpu, torch, date, steps, overhead_pct, torch_profiler_overhead_pct,
reported_plain_step_ms (the DB's plain step: the median of P steps timed after the recorded ones with
collection off), reported_profiler_cost_pct (what the reports say the profiler cost),
example_plain_step_ms (the example's own clock over those P steps), plain_step_agreement_pct
(reported_plain_step_ms against the plain run's median), max_top_op_time_diff_pct, db_bytes, and
the per-op table behind the last number; on a GPU also
kernel_sum_vs_gpu_busy_pct: the recorded kernels' summed time against the steps' GPU busy time (the
union of the kernels' intervals), which differ only by overlapping kernels or unattributed time.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import sqlite3
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
from _bench import require_hfnn, run, write_result  # noqa: E402

# Runs the example in this process under torch.profiler, then writes key_averages() per op name.
TORCH_PROFILER_RUNNER = r"""
import json, runpy, sys, torch
out, script, args = sys.argv[1], sys.argv[2], sys.argv[3:]
activities = [torch.profiler.ProfilerActivity.CPU]
if torch.cuda.is_available():
    activities.append(torch.profiler.ProfilerActivity.CUDA)
sys.argv = [script, *args]
with torch.profiler.profile(activities=activities, record_shapes=True) as prof:
    runpy.run_path(script, run_name="__main__")
rows = {}
for e in prof.key_averages():
    rows[e.key] = {"cpu_self_us": e.self_cpu_time_total, "cuda_self_us": getattr(e, "self_device_time_total", 0.0),
                   "calls": e.count}
json.dump(rows, open(out, "w"))
"""



def median_ms(path):
    return json.loads(Path(path).read_text())["median_step_ms"]


def step_ms(path):
    return json.loads(Path(path).read_text())["step_ms"]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--example", type=Path, default=ROOT / "examples" / "evoformer.py")
    ap.add_argument("--steps", type=int, default=20, help="timed steps of each run")
    ap.add_argument("--warmup", type=int, default=5, help="untimed steps before them")
    ap.add_argument("--plain-steps", type=int, default=10,
                    help="steps the hfnn run times after its recorded ones with collection off (the plain step)")
    ap.add_argument("--size", choices=["auto", "full", "small"], default="auto")
    ap.add_argument("--out", type=Path, help="write the JSON result here")
    args = ap.parse_args()
    hfnn = require_hfnn()

    import torch

    work = Path(tempfile.mkdtemp(prefix="hfnn-bench-profile-"))
    example = [str(args.example), "--steps", str(args.steps), "--warmup", str(args.warmup), "--size", args.size]
    py = sys.executable

    run([py, *example, "--json", str(work / "plain.json")], cwd=work)
    # The example runs on past the recorded steps: one step for the profiler's tear-down, then the
    # plain ones. Its own step times are the same steps' (the warm-ups are both's first W).
    longer = [str(args.example), "--steps", str(args.steps + 1 + args.plain_steps), "--warmup", str(args.warmup),
              "--size", args.size]
    run([hfnn, "profile", "--db", str(work / "hfnn.db"), "--python", py, "--report", "none", "--warmup",
         str(args.warmup), "--steps", str(args.steps), "--plain-steps", str(args.plain_steps), *longer, "--json",
         str(work / "hfnn.json")], cwd=work)
    run([py, "-c", TORCH_PROFILER_RUNNER, str(work / "torch_ops.json"), *example, "--json", str(work / "torch.json")], cwd=work)
    run([hfnn, "profile", "--db", str(work / "agree.db"), "--python", py, "--report", "none", "--warmup", "0",
         "--steps", "0", *example, "--json", str(work / "agree.json")], cwd=work)

    plain, torch_prof = median_ms(work / "plain.json"), median_ms(work / "torch.json")
    hfnn_steps = step_ms(work / "hfnn.json")
    profiled = statistics.median(hfnn_steps[:args.steps])
    example_plain = statistics.median(hfnn_steps[args.steps + 1:]) if args.plain_steps else None
    report = json.loads(run([hfnn, "report", "--db", str(work / "hfnn.db"), "--format", "json"]).stdout)
    reported = report["profiler_cost"]
    with sqlite3.connect(work / "agree.db") as con:
        cuda = con.execute("SELECT count(*) FROM op_stats WHERE cuda_self_us > 0").fetchone()[0] > 0
        column = "cuda_self_us" if cuda else "cpu_self_us"
        ours = dict(con.execute(f"SELECT name, sum({column}) FROM op_stats WHERE name LIKE 'aten::%'"
                                f" GROUP BY name ORDER BY sum({column}) DESC LIMIT 10").fetchall())
    with sqlite3.connect(work / "hfnn.db") as con:
        kernel_us = con.execute("SELECT sum(cuda_us) FROM kernel_stats").fetchone()[0]
        busy_ms = con.execute("SELECT sum(gpu_busy_ms) FROM step_stats").fetchone()[0]
    theirs = json.loads((work / "torch_ops.json").read_text())
    table = []
    for name, us in ours.items():
        ref = theirs.get(name, {}).get(column, 0.0)
        table.append({"op": name, "hfnn_us": round(us, 1), "torch_profiler_us": round(ref, 1),
                      "diff_pct": round(100 * abs(us - ref) / ref, 2) if ref else None})
    diffs = [row["diff_pct"] for row in table if row["diff_pct"] is not None]
    result = {
        "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
        "torch": torch.__version__,
        "date": dt.date.today().isoformat(),
        "example": args.example.name,
        "steps": args.steps,
        "time_basis": "cuda" if cuda else "cpu",
        "plain_step_ms": round(plain, 3),
        "hfnn_profile_step_ms": round(profiled, 3),
        "torch_profiler_step_ms": round(torch_prof, 3),
        "overhead_pct": round(100 * (profiled / plain - 1), 2),
        "torch_profiler_overhead_pct": round(100 * (torch_prof / plain - 1), 2),
        "plain_steps": args.plain_steps,
        "reported_plain_step_ms": reported["plain_step_ms"] and round(reported["plain_step_ms"], 3),
        "reported_profiler_cost_pct": reported["cost_pct"] and round(reported["cost_pct"], 2),
        "reported_profiler_cost": reported["text"],
        "example_plain_step_ms": example_plain and round(example_plain, 3),
        "plain_step_agreement_pct": (round(100 * (reported["plain_step_ms"] / plain - 1), 2)
                                     if reported["plain_step_ms"] else None),
        "max_top_op_time_diff_pct": max(diffs) if diffs else None,
        "kernel_sum_ms": round(kernel_us / 1e3, 3) if kernel_us else None,
        "gpu_busy_ms": round(busy_ms, 3) if busy_ms else None,
        "kernel_sum_vs_gpu_busy_pct": round(100 * (kernel_us / 1e3 / busy_ms - 1), 2) if kernel_us and busy_ms else None,
        "db_bytes": os.path.getsize(work / "hfnn.db"),
        "top_ops": table,
    }
    write_result(result, args.out)
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
