#!/usr/bin/env python3
"""The persistent LSTM kernel's µs per step, kernel level: runs the C++ timing test
(LstmKernels.DISABLED_PersistentTiming*, the input-projection and weight-gradient GEMMs included,
CUDA events around the variant's forward and backward, best of 5, T = 1,000) and writes its lines
as records (the format of bench/results/lstm_persistent_steps-*.json).

    python3 bench/lstm_steps.py --tests build/py3-none-linux_x86_64/hfnn_kernel_tests \
        --version "v5: dG_t staged by cp.async" --out bench/results/lstm_persistent_steps-h100.json
    bash scripts/device_run.sh lstm-steps       # on the GPU machine ($LSTM_STEPS_VERSION names it)

--rounds N runs it N times and keeps each shape's median: the step times are latencies and move by
1-2% from run to run.

An A/B of one build on one machine: --ab NAME runs the test with the environment variable NAME at 1,
then 0, --rounds times each in turn (a build's switch: the two settings alternate, so a drift of the
machine hits both), writes each setting's medians as records (version "<--version>, NAME=1" and
"..., NAME=0") and prints each shape's ratio. --dtype bfloat16 (or float32) times that dtype alone.

    python3 bench/lstm_steps.py --tests hfnn_kernel_tests --version "design 4" --ab HFNN_LSTM_BWD_MMA \
        --dtype bfloat16 --rounds 2 --out ab.json
    LSTM_AB_SWITCH=HFNN_LSTM_BWD_MMA bash scripts/device_run.sh lstm-ab    # on the GPU machine
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path

LINE = re.compile(r"persistent T(\d+) B(\d+) I(\d+) H(\d+) (\w+)(?: bias)?: fwd ([\d.]+) us/step, "
                  r"bwd ([\d.]+) us/step, fwd\+bwd ([\d.]+) ms")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tests", required=True, help="the hfnn_kernel_tests binary")
    ap.add_argument("--version", required=True, help="what this build is, for the records")
    ap.add_argument("--commit", default="", help="the commit built")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--ab", metavar="NAME", help="an A/B of the environment switch NAME: 1 and 0 in turn, --rounds each")
    ap.add_argument("--dtype", choices=["float32", "bfloat16"], help="time this dtype alone (HFNN_LSTM_TIMING_DTYPE)")
    args = ap.parse_args()
    if args.rounds < 1:
        sys.exit(f"bench/lstm_steps.py: --rounds {args.rounds}: give 1 or more")
    if not Path(args.tests).is_file():
        sys.exit(f"bench/lstm_steps.py: --tests {args.tests}: no such file (build it: scripts/device_wheel.sh)")
    if args.ab is not None and not args.ab.isidentifier():
        sys.exit(f"bench/lstm_steps.py: --ab {args.ab!r}: give an environment variable's name (e.g. HFNN_LSTM_BWD_MMA)")
    settings = ["1", "0"] if args.ab else [None]
    runs: dict[tuple, list] = {}  # (setting, config..., dtype) -> [(fwd, bwd, total)]
    for _ in range(args.rounds):
        for setting in settings:
            env = dict(os.environ)
            if args.ab:
                env[args.ab] = setting
            if args.dtype:
                env["HFNN_LSTM_TIMING_DTYPE"] = args.dtype
            out = subprocess.run([args.tests, "--gtest_also_run_disabled_tests",
                                  "--gtest_filter=LstmKernels.DISABLED_PersistentTiming*"],
                                 capture_output=True, text=True, env=env)
            if out.returncode != 0:
                sys.exit(f"bench/lstm_steps.py: the timing test failed ({out.returncode}):\n{out.stdout[-2000:]}{out.stderr[-2000:]}")
            for line in out.stdout.splitlines():
                m = LINE.search(line)
                if m:
                    t, b, i, h, dtype, f, bw, total = m.groups()
                    runs.setdefault((setting, int(i), int(h), int(b), int(t), dtype), []).append(
                        (float(f), float(bw), float(total)))
    if not runs:
        sys.exit("bench/lstm_steps.py: the timing test printed no step times (no GPU?)")
    import torch

    meta = dict(gpu=torch.cuda.get_device_name() if torch.cuda.is_available() else None, torch=torch.__version__,
                date=datetime.date.today().isoformat(), variant="persistent", version=args.version,
                commit=args.commit)
    records = []
    medians: dict[tuple, tuple] = {}
    for (setting, i, h, b, t, dtype), vals in runs.items():
        f = statistics.median(v[0] for v in vals)
        bw = statistics.median(v[1] for v in vals)
        total = statistics.median(v[2] for v in vals)  # the test's own, unrounded per step
        extra = {}
        if setting is not None:
            extra = dict(version=f"{args.version}, {args.ab}={setting}", switch={args.ab: setting}, rounds=len(vals),
                         run="one machine, the switch's settings alternated")
        records.append(dict(meta, **extra, config=[i, h, b, t], layers=1, bidirectional=False, dtype=dtype,
                            fwd_us_per_step=f, bwd_us_per_step=bw, fwd_bwd_ms=total))
        medians[(setting, i, h, b, t, dtype)] = (f, bw)
        if setting is None:
            print(f"{dtype:9s} [{i}, {h}, {b}, {t}]  fwd {f:6.2f}  bwd {bw:6.2f} us/step  fwd+bwd {total:7.3f} ms")
    if args.ab:
        print(f"{args.ab}: us a step at 1 and 0 (medians of {args.rounds}), and 0's time over 1's")
        for key in sorted(k for k in medians if k[0] == "1"):
            other = medians.get(("0",) + key[1:])
            if other is None:
                continue
            (f1, b1), (f0, b0) = medians[key], other
            _, i, h, b, t, dtype = key
            print(f"{dtype:9s} [{i}, {h}, {b}, {t}]  fwd {f1:6.2f} / {f0:6.2f} ({f0 / f1:4.2f}x)  "
                  f"bwd {b1:6.2f} / {b0:6.2f} ({b0 / b1:4.2f}x)")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(records, indent=1) + "\n")


if __name__ == "__main__":
    main()
