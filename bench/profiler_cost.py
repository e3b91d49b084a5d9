#!/usr/bin/env python3
"""What `hfnn profile` costs and how well it agrees with torch.profiler, on the bundled examples.

    python3 bench/profiler_cost.py --out bench/results/profile-h200.json        # on a GPU machine
    python3 bench/profiler_cost.py --size small --steps 5 --rounds 1            # a quick look on a CPU
    python3 bench/profiler_cost.py --configs transformer:bfloat16 --mode "--sample 4"   # a lighter mode too

Each config (example:dtype; by default on a GPU transformer:bfloat16, evoformer:bfloat16 and
evoformer:float32, the configs of issue 13; on a CPU transformer:float32 and evoformer:float32) runs,
same seed and data, in these modes, one run of each in turn per round (--rounds), so that a host's
drift falls on every mode alike:
  plain           the example alone: its median step time is the reference
  hfnn            under `hfnn profile --warmup W --steps S --plain-steps P` (W and S the example's), the
                  example running S + 1 + P timed steps: its median over the first S is the step under
                  the profiler; the plain step the profile itself reports (the median of the P steps
                  timed after the recorded ones with collection off) should agree with the plain mode
                  within 5% (issue 13)
  hfnn <options>  the same with more `hfnn profile` options (--mode, repeatable: a lighter mode);
                  a mode's leading NAME=VALUE words are set in its runs' environment, e.g.
                  "HFNN_PROFILE_PARTS=no-cupti" (profiles/README.md: the collector's parts, to take
                  its cost apart) or "HFNN_CUPTI_FINALIZE=0 --sample 10"
  torch.profiler  under torch.profiler(record_shapes=True), CPU and CUDA activities: the way people
                  profile today
A mode's step_ms is the median over rounds of each run's median step. Once per config, outside the
rounds, `hfnn profile --warmup 0 --steps 0` records the same steps torch.profiler saw, and the
hfnn record gets per-op self time (CUDA on a GPU, CPU otherwise), summed over forward and backward,
against torch.profiler's key_averages() for the ten ops hfnn ranks highest (max_top_op_time_diff_pct,
top_ops).

The result is a JSON array, one record per config x mode: gpu, torch, date, example, dtype, mode,
step_ms, step_ms_runs (each round's median), overhead_pct (against plain); for hfnn modes also
reported_plain_step_ms, plain_step_agreement_pct (it against plain's step_ms),
reported_profiler_cost_pct and its sentence (what the reports say the profiler cost),
example_plain_step_ms (the example's own clock over the plain steps), db_bytes, and on a GPU
kernel_sum_vs_gpu_busy_pct: the recorded kernels' summed time against the steps' GPU busy time (the
union of the kernels' intervals), which differ only by overlapping kernels or unattributed time.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import shlex
import shutil
import sqlite3
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
from _bench import require_hfnn, run  # noqa: E402

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

EXAMPLES = ("transformer", "evoformer", "lstm_lm")


def config(text: str) -> tuple[str, str]:
    """'example:dtype' -> (example, dtype), or argparse's one-line error naming the fix."""
    example, _, dtype = text.partition(":")
    if example not in EXAMPLES or dtype not in ("float32", "bfloat16"):
        raise argparse.ArgumentTypeError(
            f"{text!r}: give example:dtype, example one of {', '.join(EXAMPLES)}, dtype float32 or bfloat16")
    return example, dtype


def mode_words(text: str) -> tuple[dict, list[str]]:
    """'NAME=VALUE ... --option ...' -> ({NAME: VALUE}, [options]): a mode's leading words of the
    form NAME=VALUE are environment variables for its runs (e.g. the collector's diagnostic
    HFNN_PROFILE_PARTS), the rest `hfnn profile` options."""
    words = shlex.split(text)
    env = {}
    while words and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", words[0]):
        name, _, value = words.pop(0).partition("=")
        env[name] = value
    return env, words


def median_step(path: Path) -> float:
    return json.loads(path.read_text())["median_step_ms"]


def measure(example: str, dtype: str, args, hfnn: str, work: Path, on_gpu: bool) -> list[dict]:
    """One config's records, one per mode (see the module's docstring)."""
    import torch

    py = sys.executable
    script = str(ROOT / "examples" / f"{example}.py")
    common = ["--warmup", str(args.warmup), "--size", args.size, "--dtype", dtype]
    plain_cmd = [script, "--steps", str(args.steps), *common]
    # The hfnn runs go on past the recorded steps: one step for the profiler's tear-down, then the
    # plain ones. The example's own step times are the same steps' (the warm-ups are both's first W).
    longer = [script, "--steps", str(args.steps + 1 + args.plain_steps), *common]
    hfnn_modes = {"hfnn": ({}, []), **{f"hfnn {m}": mode_words(m) for m in args.mode}}
    modes = ["plain", *hfnn_modes, "torch.profiler"]
    runs: dict[str, list[dict]] = {m: [] for m in modes}
    for r in range(args.rounds):
        for mode in modes:
            tag = f"{example}-{dtype}-{modes.index(mode)}-{r}"
            out = work / f"{tag}.json"
            print(f"{example} {dtype}: round {r + 1} of {args.rounds}, {mode}", file=sys.stderr, flush=True)
            if mode == "plain":
                run([py, *plain_cmd, "--json", str(out)], cwd=work)
                runs[mode].append({"step_ms": median_step(out)})
            elif mode == "torch.profiler":
                ops = work / f"{tag}-ops.json"
                run([py, "-c", TORCH_PROFILER_RUNNER, str(ops), *plain_cmd, "--json", str(out)], cwd=work)
                runs[mode].append({"step_ms": median_step(out), "ops": json.loads(ops.read_text())})
            else:
                db = work / f"{tag}.db"
                env, options = hfnn_modes[mode]
                run([hfnn, "profile", "--db", str(db), "--python", py, "--report", "none", "--warmup",
                     str(args.warmup), "--steps", str(args.steps), "--plain-steps", str(args.plain_steps),
                     *options, *longer, "--json", str(out)], cwd=work, env={**os.environ, **env})
                steps = json.loads(out.read_text())["step_ms"]
                report = json.loads(run([hfnn, "report", "--db", str(db), "--format", "json"]).stdout)
                with sqlite3.connect(db) as con:
                    kernel_us = con.execute("SELECT sum(cuda_us) FROM kernel_stats").fetchone()[0]
                    busy_ms = con.execute("SELECT sum(gpu_busy_ms) FROM step_stats").fetchone()[0]
                runs[mode].append({
                    "step_ms": statistics.median(steps[:args.steps]),
                    "example_plain_step_ms": statistics.median(steps[args.steps + 1:]) if args.plain_steps else None,
                    "cost": report["profiler_cost"], "db_bytes": os.path.getsize(db),
                    "kernel_us": kernel_us, "busy_ms": busy_ms})

    # Per-op agreement: hfnn over the steps torch.profiler saw (every step, warm-ups included).
    agree = work / f"{example}-{dtype}-agree.db"
    run([hfnn, "profile", "--db", str(agree), "--python", py, "--report", "none", "--warmup", "0", "--steps", "0",
         *plain_cmd, "--json", str(work / f"{example}-{dtype}-agree.json")], cwd=work)
    with sqlite3.connect(agree) as con:
        cuda = con.execute("SELECT count(*) FROM op_stats WHERE cuda_self_us > 0").fetchone()[0] > 0
        column = "cuda_self_us" if cuda else "cpu_self_us"
        ours = dict(con.execute(f"SELECT name, sum({column}) FROM op_stats WHERE name LIKE 'aten::%'"
                                f" GROUP BY name ORDER BY sum({column}) DESC LIMIT 10").fetchall())
    theirs = runs["torch.profiler"][-1]["ops"]
    top_ops = []
    for name, us in ours.items():
        ref = theirs.get(name, {}).get(column, 0.0)
        top_ops.append({"op": name, "hfnn_us": round(us, 1), "torch_profiler_us": round(ref, 1),
                        "diff_pct": round(100 * abs(us - ref) / ref, 2) if ref else None})
    diffs = [row["diff_pct"] for row in top_ops if row["diff_pct"] is not None]

    r3 = lambda v: None if v is None else round(v, 3)  # noqa: E731
    plain = statistics.median(x["step_ms"] for x in runs["plain"])
    meta = {"gpu": torch.cuda.get_device_name() if on_gpu else None, "torch": torch.__version__,
            "date": dt.date.today().isoformat(), "example": f"{example}.py", "dtype": dtype,
            "size": args.size, "steps": args.steps, "rounds": args.rounds}
    records = []
    for mode in modes:
        step = statistics.median(x["step_ms"] for x in runs[mode])
        rec = {**meta, "mode": mode, "step_ms": r3(step), "step_ms_runs": [r3(x["step_ms"]) for x in runs[mode]],
               "overhead_pct": None if mode == "plain" else round(100 * (step / plain - 1), 2)}
        if mode in hfnn_modes:
            last = runs[mode][-1]
            reported = [x["cost"]["plain_step_ms"] for x in runs[mode] if x["cost"]["plain_step_ms"]]
            rep = statistics.median(reported) if reported else None
            costs = [x["cost"]["cost_pct"] for x in runs[mode] if x["cost"]["cost_pct"] is not None]
            ex_plain = [x["example_plain_step_ms"] for x in runs[mode] if x["example_plain_step_ms"]]
            rec.update({
                "plain_steps": args.plain_steps,
                "reported_plain_step_ms": r3(rep),
                "plain_step_agreement_pct": round(100 * (rep / plain - 1), 2) if rep else None,
                "reported_profiler_cost_pct": round(statistics.median(costs), 2) if costs else None,
                "reported_profiler_cost": last["cost"]["text"],
                "example_plain_step_ms": r3(statistics.median(ex_plain)) if ex_plain else None,
                "db_bytes": last["db_bytes"],
                "kernel_sum_vs_gpu_busy_pct": (round(100 * (last["kernel_us"] / 1e3 / last["busy_ms"] - 1), 2)
                                               if last["kernel_us"] and last["busy_ms"] else None)})
            if mode == "hfnn":
                rec.update({"time_basis": "cuda" if cuda else "cpu",
                            "max_top_op_time_diff_pct": max(diffs) if diffs else None, "top_ops": top_ops})
        records.append(rec)
    return records


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--configs", nargs="+", type=config, metavar="EXAMPLE:DTYPE",
                    help="what to run (default: transformer:bfloat16 evoformer:bfloat16 evoformer:float32 on a "
                         "GPU, transformer:float32 evoformer:float32 on a CPU)")
    ap.add_argument("--mode", action="append", default=[], metavar="OPTIONS",
                    help="one more hfnn mode: these `hfnn profile` options added (e.g. \"--sample 4\"), after any "
                         "NAME=VALUE words, set in its runs' environment (e.g. \"HFNN_CUPTI_FINALIZE=0 --sample 4\"); "
                         "repeatable")
    ap.add_argument("--rounds", type=int, default=2, help="runs of each mode, taken in turn")
    ap.add_argument("--steps", type=int, default=20, help="timed steps of each run")
    ap.add_argument("--warmup", type=int, default=5, help="untimed steps before them")
    ap.add_argument("--plain-steps", type=int, default=10,
                    help="steps the hfnn runs time after their recorded ones with collection off (the plain step)")
    ap.add_argument("--size", choices=["auto", "full", "small"], default="auto")
    ap.add_argument("--out", type=Path, help="write the JSON array here")
    args = ap.parse_args()
    if args.rounds < 1 or args.steps < 3:
        ap.error("--rounds must be at least 1 and --steps at least 3")
    hfnn = require_hfnn()

    import torch

    on_gpu = torch.cuda.is_available()
    configs = args.configs or ([("transformer", "bfloat16"), ("evoformer", "bfloat16"), ("evoformer", "float32")]
                               if on_gpu else [("transformer", "float32"), ("evoformer", "float32")])
    if not on_gpu and any(d == "bfloat16" for _, d in configs):
        ap.error("bfloat16 configs run under CUDA autocast: this machine has no CUDA device")
    work = Path(tempfile.mkdtemp(prefix="hfnn-bench-profile-"))
    records = []
    for example, dtype in configs:
        records += measure(example, dtype, args, hfnn, work, on_gpu)
        if args.out:  # written after each config, so a cut-off run keeps what it measured
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(records, indent=1) + "\n")
    shutil.rmtree(work, ignore_errors=True)
    for r in records:
        extra = (f", reported plain {r['reported_plain_step_ms']} ms ({r['plain_step_agreement_pct']:+}%)"
                 if r.get("reported_plain_step_ms") else "")
        over = f" ({r['overhead_pct']:+.1f}%)" if r["overhead_pct"] is not None else ""
        print(f"{r['example']} {r['dtype']} {r['mode']}: {r['step_ms']} ms{over}{extra}")


if __name__ == "__main__":
    main()
