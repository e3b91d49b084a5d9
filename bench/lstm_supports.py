#!/usr/bin/env python3
"""Where the LSTM variant cudnn_persistent runs on this GPU: hfnn::lstm_supports() (cuDNN's own
answer to a two-step probe, kernels/lstm/lstm_cudnn.cu) over hidden sizes x batches x dtypes.

    python3 bench/lstm_supports.py --out bench/results/lstm_cudnn_persistent_supports-h100.json

One JSON record per point: gpu, torch, cudnn, date, dtype, hidden, batch, supports. Prints the map,
a row per dtype and hidden size ("Y" where the variant takes the shape, "." where it does not).
"""
import argparse
import datetime
import json
import sys
from pathlib import Path

from lstm import write_whole  # bench/lstm.py, beside this script: the records whole or not at all

HIDDEN = [32, 64, 128, 256, 512, 985, 1024, 2048]
BATCH = [1, 4, 8, 32, 64, 128, 256]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, help="write the records here as a JSON array")
    ap.add_argument("--variant", default="cudnn_persistent", help="the LSTM variant to ask about")
    args = ap.parse_args(argv)
    import torch
    if not torch.cuda.is_available():
        print("bench/lstm_supports.py needs a GPU (it asks the device): run it on the GPU machine", file=sys.stderr)
        return 1
    import hfnn  # noqa: F401  (loads the op library)
    if not hasattr(torch.ops.hfnn, "lstm_supports"):
        print("bench/lstm_supports.py: this hfnn op library has no LSTM kernels", file=sys.stderr)
        return 1
    meta = dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__, cudnn=torch.backends.cudnn.version(),
                date=datetime.date.today().isoformat(), variant=args.variant)
    records = []
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        for hidden in HIDDEN:
            row = []
            for batch in BATCH:
                x = torch.empty(2, batch, hidden, device="cuda", dtype=dtype)
                w = torch.empty(4 * hidden, hidden, device="cuda", dtype=dtype)
                ok = bool(torch.ops.hfnn.lstm_supports(x, w, args.variant))
                row.append("Y" if ok else ".")
                records.append(dict(meta, dtype=str(dtype).replace("torch.", ""), hidden=hidden, batch=batch,
                                    supports=ok))
            print(f"{str(dtype).replace('torch.', ''):9s} hidden {hidden:5d}: {' '.join(row)}  (batch {BATCH})", flush=True)
    if args.out:
        write_whole(args.out, json.dumps(records, indent=1) + "\n")
        print(f"wrote {len(records)} records to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
