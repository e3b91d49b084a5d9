#!/usr/bin/env python3
"""A second backward over one forward (autograd's retain_graph) through torch's nn.LSTM and through
hfnn's LSTM variants: the errors of the first and the second gradients against float64.

cuDNN's backward consumes its reserve space. hfnn's cudnn_persistent variant (cuDNN's
CUDNN_RNN_ALGO_PERSIST_STATIC through cuDNN's RNN API) computed wrong gradients the second time
(relative errors about 1) until its backward worked on a copy of that space
(tests/cpp/test_lstm_kernels.cpp, EveryVariantsSecondBackwardOverOneForwardAgrees); torch's
autograd clones the reserve where retain_graph is set. This checks both at shapes where torch picks
each of cuDNN's algorithms: the persistent kernel in float16 (hidden and input multiples of 128,
batch a multiple of 8 up to 128), the small-hidden persistent kernel (hidden up to 128), and the
standard one.

    python3 bench/lstm_second_backward.py --out bench/results/lstm_second_backward-h100.json

One JSON record per shape, dtype and candidate: config [input, hidden, batch, steps], dtype,
candidate ("cudnn" for torch's module, or an hfnn variant), first_error and second_error (max
relative error of every gradient against float64), identical (the two gradients' bytes agree).
"""
import argparse
import copy
import datetime
import json
import sys
from pathlib import Path

from lstm import write_whole  # bench/lstm.py, beside this script: the records whole or not at all

CONFIGS = [  # [input, hidden, batch, steps], and which cuDNN algorithm torch runs there
    ([512, 512, 32, 50], "float16: persistent (PERSIST_STATIC); float32: standard"),
    ([64, 64, 8, 50], "persistent for small hidden sizes (PERSIST_STATIC_SMALL_H), every dtype"),
    ([300, 300, 5, 50], "standard"),
]


def grads(torch, m, x, dy, retain):
    y, (h, c) = m(x)
    loss = (y.float() * dy).sum() + (h.float() * c.float()).sum()
    params = [x, *m.parameters()]
    first = torch.autograd.grad(loss, params, retain_graph=True)
    second = torch.autograd.grad(loss, params) if retain else None
    return first, second


def rel(torch, got, ref) -> float:
    return max(((g.double() - r).abs().max() / r.abs().max().clamp_min(1e-12)).item() for g, r in zip(got, ref))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, help="write the records here as a JSON array")
    args = ap.parse_args(argv)
    import torch
    if not torch.cuda.is_available():
        print("bench/lstm_second_backward.py needs a GPU (it runs cuDNN): run it on the GPU machine", file=sys.stderr)
        return 1
    import hfnn
    from torch import nn

    records = []
    for (input_size, hidden, batch, steps), algo in CONFIGS:
        for dtype_name in ("float32", "float16"):
            dtype = getattr(torch, dtype_name)
            torch.manual_seed(0)
            ref_m = nn.LSTM(input_size, hidden, batch_first=True, device="cuda", dtype=torch.float64)
            x64 = torch.randn(batch, steps, input_size, device="cuda", dtype=torch.float64, requires_grad=True)
            dy = torch.randn(batch, steps, hidden, device="cuda")
            ref, _ = grads(torch, ref_m, x64, dy.double(), False)
            m = copy.deepcopy(ref_m).to(dtype)
            m.flatten_parameters()
            x = x64.detach().to(dtype).requires_grad_()
            cands = {"cudnn": m}
            if hasattr(torch.ops.hfnn, "lstm_layer_fwd"):
                for v in torch.ops.hfnn.lstm_variants():
                    if torch.ops.hfnn.lstm_supports(x.transpose(0, 1).contiguous(), m.weight_hh_l0, v):
                        cands[v] = v
            for name, what in cands.items():
                if name == "cudnn":
                    first, second = grads(torch, m, x, dy, True)
                else:
                    hfnn.nn._lstm_builtin_order = lambda b, h, d, v=what: (v,)
                    ours = hfnn.to_hfnn(copy.deepcopy(m))
                    before = hfnn.nn.lstm_calls[what]
                    first, second = grads(torch, ours, x, dy, True)
                    if hfnn.nn.lstm_calls[what] != before + 1:
                        print(f"{name} did not run (hfnn's calls: {dict(hfnn.nn.lstm_calls)})", file=sys.stderr)
                        return 1
                rec = dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__,
                           cudnn=torch.backends.cudnn.version(), date=datetime.date.today().isoformat(),
                           config=[input_size, hidden, batch, steps], dtype=dtype_name, candidate=name,
                           cudnn_algorithm=algo if name == "cudnn" else None,
                           first_error=rel(torch, first, ref), second_error=rel(torch, second, ref),
                           identical=all(torch.equal(a, b) for a, b in zip(first, second)))
                records.append(rec)
                print(f"{str([input_size, hidden, batch, steps]):20s} {dtype_name:8s} {name:17s} first "
                      f"{rec['first_error']:.1e} second {rec['second_error']:.1e} "
                      f"{'identical' if rec['identical'] else 'DIFFERENT'}", flush=True)
    if args.out:
        write_whole(args.out, json.dumps(records, indent=1) + "\n")
        print(f"wrote {len(records)} records to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
