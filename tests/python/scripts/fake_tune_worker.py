"""A stand-in for hfnn's tune worker (python/hfnn/_tune_worker.py) on machines without a GPU: the
same JSON-lines protocol with made-up timings, so `hfnn tune`'s judging, storing, skipping and
printing are tested on the CPU. HFNN_TUNE_WORKER=<this file> makes hfnn tune start it.

FAKE_TUNE_NO_GPU=1: answers like the real worker on a machine without CUDA.
FAKE_TUNE_SLEEP=<s>: sleeps that long per key (for Ctrl-C tests).
FAKE_TUNE_DIE_AFTER=<n>: exits (code 7) when asked for key n + 1, as a crashed worker would.
FAKE_TUNE_STRAY=1: prints a line of its own before the second answer (a chatty library).
FAKE_TUNE_GPU, _CC, _SMS, _CUDA, _TORCH, _HFNN: what the hello says (the tuning environment).
FAKE_TUNE_WINNER_FWD, FAKE_TUNE_WINNER_BWD: the name of the fast variant per pass ("good" by
default; a real variant name makes a table HFNN_DISPATCH_DB can use); FAKE_TUNE_GOOD_US its time.
Timings: torch 100 µs, variant "good" 50 µs, "planted_wrong" 10 µs but wrong (error 0.3), and
"meh" 99 µs (within the noise of torch).
"""
import json
import os
import sys
import time

if os.environ.get("FAKE_TUNE_NO_GPU") == "1":
    print(json.dumps({"error": "no CUDA device visible to torch: tuning measures kernels on the GPU they will run on"}))
    sys.exit(3)
env = os.environ.get
print(json.dumps({"hello": {"gpu": env("FAKE_TUNE_GPU", "Fake GPU"), "compute_capability": env("FAKE_TUNE_CC", "9.0"),
                            "sm_count": int(env("FAKE_TUNE_SMS", "132")), "cuda": env("FAKE_TUNE_CUDA", "13.0"),
                            "torch": env("FAKE_TUNE_TORCH", "2.11.0"), "hfnn": env("FAKE_TUNE_HFNN", "0.1.0"),
                            "l2_bytes": 1 << 20}}), flush=True)
calls = 0
good_us = float(env("FAKE_TUNE_GOOD_US", "50"))
for line in sys.stdin:
    req = json.loads(line)
    calls += 1
    if calls > int(env("FAKE_TUNE_DIE_AFTER", "1000000")):
        sys.exit(7)
    if calls == 2 and env("FAKE_TUNE_STRAY") == "1":
        print(json.dumps({"note": "a library printing"}), flush=True)
    time.sleep(float(os.environ.get("FAKE_TUNE_SLEEP", "0")))
    cands = []
    for p in req["passes"]:
        cands += [{"pass": p, "name": "torch", "samples_us": [100, 101, 99, 100, 100], "max_error": 1e-7},
                  {"pass": p, "name": env("FAKE_TUNE_WINNER_" + p.upper(), "good"), "max_error": 2e-7,
                   "samples_us": [good_us, good_us * 1.01, good_us * 0.99, good_us, good_us]},
                  {"pass": p, "name": "meh", "samples_us": [99, 99, 99, 99, 99], "max_error": 1e-7},
                  {"pass": p, "name": "planted_wrong", "samples_us": [10, 10, 10, 10, 10], "max_error": 0.3},
                  {"pass": p, "name": "broken", "ran": False, "error": "invalid configuration argument"}]
    print(json.dumps({"key": req["key"], "dtype": req["dtype"], "op": req["op"], "candidates": cands, "seconds": 0.01}),
          flush=True)
with open(os.environ.get("FAKE_TUNE_LOG", os.devnull), "a") as log:
    log.write(f"{calls}\n")
