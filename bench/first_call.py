"""What a training script pays once for hfnn's kernels: `import hfnn`, and the first call of each
family's module (LayerNorm, nn.MultiheadAttention, nn.LSTM through hfnn.to_hfnn: forward and
backward, synchronized) against the second, each in a fresh process, which is where the CUDA
module holding a family's kernels is loaded (and, with fatbins compressed, decompressed).

    python3 bench/first_call.py --out bench/results/first_call-h100.json [--label "..."] [--runs 3]

One record per run and case: `import_ms`, `first_ms`, `second_ms` (wall, milliseconds; torch's
own CUDA context is made before the clock starts), with gpu, torch, date and the label.
"""
from __future__ import annotations

import argparse
import datetime
import json
import subprocess
import sys
from pathlib import Path


CASE = r'''
import json, sys, time, torch
case = sys.argv[1]
torch.zeros(1, device="cuda"); torch.cuda.synchronize()  # torch's context, not ours
t0 = time.perf_counter()
import hfnn
t1 = time.perf_counter()
nn = torch.nn
if case == "layer_norm":
    model, x = nn.LayerNorm(1024), torch.randn(4096, 1024)
elif case == "multihead_attention":
    model, x = nn.MultiheadAttention(512, 8, batch_first=True), torch.randn(8, 128, 512)
else:
    model, x = nn.LSTM(256, 256, batch_first=True), torch.randn(16, 64, 256)
model = hfnn.to_hfnn(model.cuda().to(torch.bfloat16))
x = x.cuda().to(torch.bfloat16).requires_grad_()
def call():
    if case == "multihead_attention":
        y = model(x, x, x, need_weights=False)[0]
    elif case == "lstm":
        y = model(x)[0]
    else:
        y = model(x)
    y.float().sum().backward()
    torch.cuda.synchronize()
times = []
for _ in range(2):
    t = time.perf_counter(); call(); times.append(time.perf_counter() - t)
print(json.dumps({"import_ms": 1e3 * (t1 - t0), "first_ms": 1e3 * times[0], "second_ms": 1e3 * times[1]}))
'''


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, help="the result JSON (a list of records)")
    ap.add_argument("--label", default="", help="what build this is, kept in every record")
    ap.add_argument("--runs", type=int, default=3, help="fresh processes per case (default 3)")
    args = ap.parse_args()
    if args.runs < 1:
        sys.exit("bench/first_call.py: --runs must be at least 1")
    import torch

    if not torch.cuda.is_available():
        sys.exit("bench/first_call.py: needs a CUDA device: run it on the GPU machine")
    base = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
            "date": datetime.date.today().isoformat(), "label": args.label}
    records = []
    for case in ("layer_norm", "multihead_attention", "lstm"):
        for run in range(args.runs):
            out = subprocess.run([sys.executable, "-c", CASE, case], capture_output=True, text=True)
            if out.returncode != 0:
                sys.exit(f"bench/first_call.py: the {case} case failed:\n{out.stderr[-2000:]}")
            records.append({**base, "case": case, "run": run, **json.loads(out.stdout.strip().splitlines()[-1])})
            print(json.dumps(records[-1]))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text("[\n" + ",\n".join(json.dumps(r) for r in records) + "\n]\n")


if __name__ == "__main__":
    main()
