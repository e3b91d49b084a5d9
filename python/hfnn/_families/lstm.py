"""nn.LSTM's part of `hfnn tune`, of HFNN_DISPATCH_DB, of hfnn.dispatch_stats() and of the module
swap (the family's C++ description is kernels/lstm/lstm_family.cpp; the module and its autograd
function are hfnn/nn.py's LSTM, over the ops hfnn::lstm_layer_fwd and lstm_layer_bwd).

measure(): a request {"key": "input=985,hidden=985,layers=1,bidirectional=0,batch=4,steps=1000,
batch_first=1,bias=1,dropout=0", "dtype", "passes": ["train"], "seconds"} answered with torch's
module ("torch": cuDNN's LSTM, as a training loop calls it) and hfnn's path with every variant that
takes the key (lstm_variants(), asked through lstm_supports()), each timed as forward + backward per
call. The one pass is "train": a persistent forward saves the state its own backward reads, so
forward and backward win together.
- samples_us, what the tuner judges: per-call wall time of back-to-back training calls (CPU launch
  cost included, as a training loop sees it), over input sets rotated past L2, with no initial
  state (zeros, as a training loop mostly passes); every candidate checked first, then their
  samples taken in turn (hfnn/_measure.py's wall_samples_in_turn: a host's CPU speed drifts).
The error is max|out - ref| / max|ref| (hfnn/_measure.py's rel_error, attention's definition) over
the output, h_n, c_n and every gradient (input, h0, c0, every weight and bias), on fresh inputs with
h0 and c0 given and random gradients for output, h_n and c_n (every path of the backward used),
dropout 0, against a float64 CPU run of torch's nn.LSTM with the same weights. Keys with dropout=1
are timed with p = 0.1. With `plant`, "planted_wrong" (the first variant that takes the key running each
direction over the other time order: the same cost, wrong wherever steps > 1; the built-in choice
runs cuDNN at many keys) must be rejected by the gate.

install_dispatch(): under HFNN_DISPATCH_DB, when the table has LSTM keys and the op library has
LSTM kernels, wraps nn.LSTM.forward so each call asks hfnn::lstm_choose for its key's winner: a
variant runs hfnn's path, anything else (untuned keys, keys torch won, calls hfnn's ops do not take)
runs torch's own forward. add_stats(): the calls per variant and fall-backs per reason (counted in
Python, hfnn.nn.lstm_calls / lstm_fallbacks) in hfnn.dispatch_stats().
"""
from __future__ import annotations

import copy
import math
import re
import time

from .._measure import first_line, rel_error, train_records, tunable_dtype
from ._route import replace_forward, table_has_keys

OP = "lstm"
TITLE = "LSTM"

_KEY = re.compile(r"input=(\d+),hidden=(\d+),layers=(\d+),bidirectional=([01]),batch=(\d+),steps=(\d+),"
                  r"batch_first=([01]),bias=([01]),dropout=([01])")
# The dropout probability keys with dropout=1 are timed with (the key records only that there is one).
TIMING_DROPOUT = 0.1

# torch's own nn.LSTM.forward, once install_dispatch() replaced it (hfnn.nn.LSTM falls back to it,
# not to the wrapper); None while it is not replaced.
torch_forward = None


def swaps() -> dict:
    """torch module class -> hfnn module class, for to_hfnn and to_torch."""
    from torch import nn

    from .. import nn as hfnn_nn

    return {nn.LSTM: hfnn_nn.LSTM}


def parse_key(key: str) -> dict:
    """The canonical key text (kernels/lstm/lstm_family.cpp's Key::text) as a dict; ValueError for
    anything else, as the C++ parse_key refuses it (sizes of 0, dropout on one layer)."""
    m = _KEY.fullmatch(key)
    if not m:
        raise ValueError(f"not an LSTM key: {key}")
    k = {"input": int(m.group(1)), "hidden": int(m.group(2)), "layers": int(m.group(3)),
         "bidirectional": m.group(4) == "1", "batch": int(m.group(5)), "steps": int(m.group(6)),
         "batch_first": m.group(7) == "1", "bias": m.group(8) == "1", "dropout": m.group(9) == "1"}
    if min(k["input"], k["hidden"], k["layers"], k["batch"], k["steps"]) < 1 or (k["dropout"] and k["layers"] < 2):
        raise ValueError(f"not an LSTM key: {key} (sizes must be positive; dropout needs two layers)")
    return k


def _leaves(tensors):
    return [t.detach().clone().requires_grad_() for t in tensors]


def measure(torch, hfnn, req: dict, l2_bytes: int, plant: bool, device: str = "cuda") -> dict:
    """One tune request's answer: every candidate's timing samples and error, for the "train" pass.
    The tune worker measures on the GPU; tests/python/test_lstm.py runs it on the CPU (device="cpu",
    with stand-in ops and a no-op torch.cuda.synchronize)."""
    from torch import nn

    from .. import nn as hfnn_nn

    k = parse_key(req["key"])
    dtype = tunable_dtype(torch, req["dtype"])
    seconds = float(req.get("seconds", 2.0))
    started = time.perf_counter()
    p = TIMING_DROPOUT if k["dropout"] else 0.0
    bf, dirs = k["batch_first"], 2 if k["bidirectional"] else 1
    torch.manual_seed(0)
    gen = torch.Generator(device=device).manual_seed(0)
    module = nn.LSTM(k["input"], k["hidden"], k["layers"], bias=k["bias"], batch_first=bf, dropout=p,
                     bidirectional=k["bidirectional"], device=device, dtype=dtype).train()
    # As a model moved with .to()/.cuda() has them: cuDNN's weights in one buffer (built on the
    # device they are separate, and cuDNN would copy them together on every timed call).
    module.flatten_parameters()
    x_shape = (k["batch"], k["steps"], k["input"]) if bf else (k["steps"], k["batch"], k["input"])
    y_shape = x_shape[:2] + (dirs * k["hidden"],)
    state_shape = (k["layers"] * dirs, k["batch"], k["hidden"])

    def draw(shape, grad=False):
        return torch.randn(*shape, device=device, generator=gen).to(dtype).requires_grad_(grad)

    esize = torch.empty(0, dtype=dtype).element_size()
    set_bytes = max(1, (math.prod(x_shape) + math.prod(y_shape)) * esize)
    nsets = max(1, min(8, math.ceil(3 * l2_bytes / set_bytes)))
    sets = [(draw(x_shape, True), draw(y_shape)) for _ in range(nsets)]

    original = torch_forward or nn.LSTM.forward
    fns = {"torch": lambda x, hx: original(module, x, hx)}

    def variant_call(name, flip=False):
        return lambda x, hx: hfnn_nn._lstm_run(module, x, hx, name, flip_direction=flip)[:2]

    if hasattr(torch.ops.hfnn, "lstm_layer_fwd"):
        x0 = sets[0][0].detach()
        x0 = (x0.transpose(0, 1) if bf else x0).contiguous()
        taking = [v for v in torch.ops.hfnn.lstm_variants()
                  if torch.ops.hfnn.lstm_supports(x0, module.weight_hh_l0, v)]
        for v in taking:
            fns[v] = variant_call(v)
        if plant and k["steps"] > 1 and taking:
            fns["planted_wrong"] = variant_call(taking[0], flip=True)

    # Correctness: fresh inputs and states, random gradients for every output, dropout 0, against
    # torch's module in float64 on the CPU with the same weights.
    xc, h0c, c0c = draw(x_shape), draw(state_shape), draw(state_shape)
    dyc, dhc, dcc = draw(y_shape), draw(state_shape), draw(state_shape)
    ref = copy.deepcopy(module).to("cpu", torch.float64)
    ref.dropout = 0.0
    x64, h064, c064 = (t.detach().cpu().double().requires_grad_() for t in (xc, h0c, c0c))
    y64, (h64, c64) = ref(x64, (h064, c064))
    torch.autograd.backward([y64, h64, c64], [t.cpu().double() for t in (dyc, dhc, dcc)])
    refs = [t.detach().to(device) for t in [y64, h64, c64, x64.grad, h064.grad, c064.grad]
            + [q.grad for q in ref.parameters()]]
    del ref

    # Every candidate checked first (dropout 0), then all timed (dropout p), their samples in turn
    # (wall_samples_in_turn).
    names, errors, calls, failed = list(fns), {}, {}, {}
    module.dropout = 0.0
    for name in names:
        fn = fns[name]
        try:
            for prm in module.parameters():
                prm.grad = None
            x, h0, c0 = _leaves((xc, h0c, c0c))
            y, (h_n, c_n) = fn(x, (h0, c0))
            torch.autograd.backward([y, h_n, c_n], [dyc, dhc, dcc])
            got = [y.detach(), h_n.detach(), c_n.detach(), x.grad, h0.grad, c0.grad] + [q.grad for q in module.parameters()]
            errors[name] = max(rel_error(g, r) for g, r in zip(got, refs))

            def train_call(j, fn=fn):
                xs, dy = sets[j % nsets]
                fn(xs, None)[0].backward(dy)

            calls[name] = train_call
        except Exception as e:
            failed[name] = first_line(e)  # not e: its traceback would keep this frame's tensors
    module.dropout = p
    left = seconds - (time.perf_counter() - started)
    out = train_records(torch, names, errors, calls, failed, 0.35 * left)
    return {"key": req["key"], "dtype": req["dtype"], "op": OP, "candidates": out,
            "seconds": round(time.perf_counter() - started, 3)}


def install_dispatch(stats: dict) -> bool:
    """Under HFNN_DISPATCH_DB: routes nn.LSTM through the table when it has LSTM keys (any GPU) and
    the op library has LSTM kernels; returns whether it did. Keys without a winner (policy torch),
    keys torch won and calls hfnn's ops do not take run torch's own forward, as without hfnn."""
    global torch_forward
    if not table_has_keys(stats, OP) or torch_forward is not None:
        return False
    import torch
    from torch import nn

    from .. import nn as hfnn_nn

    if not (hasattr(torch.ops.hfnn, "lstm_choose") and hasattr(torch.ops.hfnn, "lstm_layer_fwd")):
        return False
    route = hfnn_nn._lstm_route

    def make(original):
        def forward(self, input, hx=None):
            out = route(self, input, hx, True)
            return out if out is not None else original(self, input, hx)
        return forward

    torch_forward = replace_forward(nn.LSTM, make)
    return True


def add_stats(stats: dict) -> None:
    """Adds what LSTM calls ran (hfnn.nn.lstm_calls and lstm_fallbacks, counted in Python) to
    hfnn.dispatch_stats()'s "lstm" entry, made where the op library's own stats have none."""
    from .. import nn as hfnn_nn

    entry = stats.setdefault("ops", {}).setdefault(OP, {"title": TITLE, "keys": 0, "calls": {}, "fallbacks": {}})
    for field, counts in (("calls", hfnn_nn.lstm_calls), ("fallbacks", hfnn_nn.lstm_fallbacks)):
        train = entry[field].setdefault("train", {})
        for name, n in counts.items():
            train[name] = train.get(name, 0) + n
