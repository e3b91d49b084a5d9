#!/usr/bin/env python3
"""What `hfnn tune` costs and how stable its choices are, on the GPU machine.

    python3 bench/tune.py --out bench/results/tune-h200.json

Profiles two scripts (examples/evoformer.py at full size, and bench/seed_shapes_train.py: every seed
LayerNorm shape in float32 and bfloat16), then tunes each profile twice in a row (the second with
--force, so it measures again) and compares the winners. The result is a JSON object: gpu, torch,
date, keys (tuned), same_winner_pct (of key and pass decisions equal in both runs), seconds_per_key
(wall time of a tune run over its keys, worker start-up included), and per profile the winners
table of the first run with both runs' winners.
"""
from __future__ import annotations

import argparse
import datetime as dt
import shutil
import sqlite3
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
from _bench import require_hfnn, run, write_result  # noqa: E402
PROFILES = {
    "evoformer": [str(ROOT / "examples" / "evoformer.py"), "--steps", "3", "--warmup", "1"],
    "seed_shapes": [str(ROOT / "bench" / "seed_shapes_train.py"), "--steps", "3"],
}



def winners(db):
    with sqlite3.connect(db) as con:
        return {(k, d, p): (w, t, b) for k, d, p, w, t, b in
                con.execute("SELECT key, dtype, pass, winner, torch_us, best_us FROM tune_winners")}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--profiles", nargs="+", default=list(PROFILES), choices=list(PROFILES))
    args = ap.parse_args()
    hfnn = require_hfnn()
    import torch

    work = Path(tempfile.mkdtemp(prefix="hfnn-bench-tune-"))
    result = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "date": dt.date.today().isoformat(),
              "profiles": {}}
    same = total = keys = 0
    seconds = 0.0
    for name in args.profiles:
        db = work / f"{name}.db"
        run([hfnn, "profile", "-q", "--db", str(db), "--warmup", "1", "--steps", "2", "--python", sys.executable,
             *PROFILES[name]], cwd=work)
        runs = []
        for attempt in range(2):
            t0 = time.perf_counter()
            out = run([hfnn, "tune", "--db", str(db), "--python", sys.executable, *(["--force"] if attempt else [])])
            took = time.perf_counter() - t0
            runs.append({"seconds": round(took, 2), "winners": winners(db), "stdout": out.stdout})
            print(out.stdout, flush=True)
        first, second = runs[0]["winners"], runs[1]["winners"]
        n_keys = len({(k, d) for k, d, _ in first})
        agree = sum(first[x][0] == second.get(x, (None,))[0] for x in first)
        same += agree
        total += len(first)
        keys += n_keys
        seconds += runs[0]["seconds"] + runs[1]["seconds"]
        result["profiles"][name] = {
            "keys": n_keys,
            "seconds": [r["seconds"] for r in runs],
            "same_winner_pct": round(100 * agree / len(first), 1),
            "table": [{"key": k, "dtype": d, "pass": p, "torch_us": round(t, 2), "best_us": round(b, 2),
                       "winner": w, "winner_run2": second.get((k, d, p), (None,))[0]}
                      for (k, d, p), (w, t, b) in sorted(first.items())],
            "tune_output": runs[0]["stdout"],
        }
    result.update(keys=keys, same_winner_pct=round(100 * same / total, 1) if total else None,
                  seconds_per_key=round(seconds / (2 * keys), 3) if keys else None)
    write_result(result, args.out, leave_out=("profiles",))
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
