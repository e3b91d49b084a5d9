"""Is the gap between a call's wall time and its GPU time under graph replay the host or the GPU's
clocks? (issue 11: config 0 in bf16 runs 2.6-2.8 ms a call under graph replay on an H200 and
2.9-3.0 ms back to back, while the profiler finds the GPU idle 1.5% of the time between kernels.)

For torch's module and hfnn's op (core --core), one after the other, each phase --seconds long:
  graph   a CUDA graph of 5 fwd+bwd calls replayed back to back
  eager   fwd+bwd calls back to back, as bench/mha.py's wall rounds
  burst   rounds of 16 eager calls with a synchronisation and a 100 ms pause between them
nvidia-smi samples the SM clock, power and the clock event reasons every 50 ms beside it; each
phase gets its per-call time and the median clock and power of the samples inside it (for burst,
of the samples inside its rounds alone: the pauses' would describe a resting GPU).
    python3 bench/experiments/mha_clocks_probe.py [--config 200 256 1024 16] [--core hfnn_mid] [--out F]
        [--candidates torch hfnn] [--seconds 3]
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from mha import captured  # noqa: E402  (bench/mha.py; imports hfnn, which registers torch.ops.hfnn)
from mha_cpu import attention_case, candidate  # noqa: E402

FIELDS = "timestamp,clocks.sm,power.draw,temperature.gpu,clocks_event_reasons.active"


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", type=int, nargs=4, default=[200, 256, 1024, 16], metavar=("B", "L", "E", "HEADS"))
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    ap.add_argument("--core", default="hfnn_mid")
    ap.add_argument("--seconds", type=float, default=3.0, help="per phase (default 3)")
    ap.add_argument("--candidates", nargs="+", default=["torch", "hfnn"], choices=["torch", "hfnn"])
    ap.add_argument("--out", type=Path)
    return ap.parse_args()


def main() -> int:
    args = parse_args()
    if not torch.cuda.is_available() or shutil.which("nvidia-smi") is None:
        sys.exit("mha_clocks_probe.py: needs a CUDA GPU and nvidia-smi on PATH (run it on the GPU machine)")
    m, x, grad = attention_case(torch, args)
    calls = {"torch": candidate(torch, m, x, None), "hfnn": candidate(torch, m, x, args.core)}
    calls = {k: v for k, v in calls.items() if k in args.candidates}
    fd, log_name = tempfile.mkstemp(suffix=".csv")
    os.close(fd)
    log = Path(log_name)
    fields = FIELDS
    if subprocess.run(["nvidia-smi", f"--query-gpu={fields}", "--format=csv,noheader"], capture_output=True).returncode:
        fields = FIELDS.replace("clocks_event_reasons.active", "clocks_throttle_reasons.active")
    smi_out = log.open("w")
    smi = subprocess.Popen(["nvidia-smi", f"--query-gpu={fields}", "--format=csv,noheader,nounits", "-lms", "50",
                            "-i", str(torch.cuda.current_device())], stdout=smi_out, stderr=subprocess.DEVNULL)
    phases = []
    try:
        time.sleep(1.0)
        for name, fn in calls.items():
            def step():
                fn().backward(grad)
            for _ in range(5):
                step()
            torch.cuda.synchronize()
            g = captured(step, [*m.parameters(), x], 5)
            for phase in ("graph", "eager", "burst"):
                time.sleep(1.0)  # a pause between phases, as between bench/mha.py's rounds
                torch.cuda.synchronize()
                t0 = time.time()
                n = 0
                busy = 0.0
                rounds = []  # burst: each round's (start, end), wall clock
                while time.time() - t0 < args.seconds:
                    if phase == "graph":
                        g.replay()
                        n += 5
                        if n % 50 == 0:
                            torch.cuda.synchronize()
                    elif phase == "eager":
                        step()
                        n += 1
                        if n % 200 == 0:
                            torch.cuda.synchronize()
                    else:
                        r0, w0 = time.perf_counter(), time.time()
                        for _ in range(16):
                            step()
                        torch.cuda.synchronize()
                        busy += time.perf_counter() - r0
                        rounds.append((w0, time.time()))
                        n += 16
                        time.sleep(0.1)
                torch.cuda.synchronize()
                t1 = time.time()
                per_call = (busy if phase == "burst" else t1 - t0) / n * 1e3
                phases.append({"candidate": name, "phase": phase, "t0": t0, "t1": t1, "calls": n, "ms_per_call": per_call,
                               "rounds": rounds})
                print(f"{name:6s} {phase:6s} {per_call:7.3f} ms a call ({n} calls)", flush=True)
            del g
    finally:
        time.sleep(0.5)
        smi.terminate()
        smi.wait()
        smi_out.close()
        text = log.read_text()
        log.unlink()
    samples = []
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        try:
            ts = time.mktime(time.strptime(parts[0].split(".")[0], "%Y/%m/%d %H:%M:%S")) + float("0." + parts[0].split(".")[1])
            samples.append((ts, float(parts[1]), float(parts[2]), float(parts[3]), parts[4]))
        except (ValueError, IndexError):
            continue
    print(f"{len(samples)} nvidia-smi samples")
    for p in phases:
        inside = [s for s in samples if p["t0"] + 0.2 <= s[0] <= p["t1"]]
        if p["rounds"]:
            inside = [s for s in inside if any(a <= s[0] <= b for a, b in p["rounds"])]
        p["samples"] = len(inside)
        del p["rounds"]
        if inside:
            p["sm_mhz"] = statistics.median(s[1] for s in inside)
            p["power_w"] = statistics.median(s[2] for s in inside)
            p["temp_c"] = max(s[3] for s in inside)
            p["reasons"] = sorted(set(s[4] for s in inside))
            p["sm_mhz_min"] = min(s[1] for s in inside)
        print(f"{p['candidate']:6s} {p['phase']:6s} {p['ms_per_call']:7.3f} ms  SM {p.get('sm_mhz', 0):6.0f} MHz "
              f"(min {p.get('sm_mhz_min', 0):.0f})  {p.get('power_w', 0):5.0f} W  {p.get('temp_c', 0):3.0f} C  "
              f"reasons {p.get('reasons')}  samples {len(inside)}")
    if args.out:
        args.out.write_text(json.dumps({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
                                        "date": time.strftime("%Y-%m-%d"), "config": args.config,
                                        "dtype": args.dtype, "core": args.core, "phases": phases}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
