"""hfnn.nn.LSTM (issue 12): torch.nn.LSTM through hfnn's LSTM ops, one autograd node per layer and
direction.

On the CPU (CI) the glue is tested for real: the ops are replaced by a pure-torch stand-in of one
layer and direction (lstm_standin.py: the same schema, a workspace its hand-written backward reads)
and the module is let take hfnn's path on CPU tensors; outputs, h_n, c_n and every gradient must
equal torch's nn.LSTM with the same weights over layers, directions, batch_first, bias, given or zero
states, dropout; every fall-back runs torch's forward (exactly torch's result) and counts its reason;
the variant choice (built-in, per layer; the table's winner; torch's) and HFNN_DISPATCH_DB's routing
of plain nn.LSTM modules; to_hfnn / to_torch. On the GPU: the real ops, every variant that takes a
shape, over a dense sweep of sizes and every dtype, against float64 and against torch's module.
"""
import collections
import copy
import importlib.util
import io
import itertools
import json
import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence

import hfnn
from conftest import _gpu_skip_reason
from hfnn._families import lstm as lstm_family
from lstm_standin import StandIn

REAL_OPS = hasattr(torch.ops.hfnn, "lstm_layer_fwd")
# The build's LSTM variants, read before any test installs the stand-in ops (empty without CUDA kernels).
BUILD_VARIANTS = set(torch.ops.hfnn.lstm_variants()) if hasattr(torch.ops.hfnn, "lstm_variants") else set()
BENCH = Path(__file__).resolve().parents[2] / "bench" / "lstm.py"


@pytest.fixture
def counts(monkeypatch):
    """Fresh hfnn.nn.lstm_calls / lstm_fallbacks for the test."""
    calls, fallbacks = collections.Counter(), collections.Counter()
    monkeypatch.setattr(hfnn.nn, "lstm_calls", calls)
    monkeypatch.setattr(hfnn.nn, "lstm_fallbacks", fallbacks)
    return calls, fallbacks


_REAL_BUILTIN_ORDER = hfnn.nn._lstm_builtin_order


@pytest.fixture
def any_variant(monkeypatch):
    """The built-in choice tries every variant at any size (it keeps cuDNN at the tests' small ones)."""
    monkeypatch.setattr(hfnn.nn, "_lstm_builtin_order", lambda batch, hidden, dtype: ("persistent", "steps"))


@pytest.fixture
def standin(monkeypatch, counts):
    """The stand-in ops, and hfnn's path taken for CPU tensors (this test only)."""
    monkeypatch.setattr(hfnn.nn, "_lstm_takes_cpu", True)
    # The built-in choice keeps cuDNN at the tests' small sizes: here every variant may run.
    monkeypatch.setattr(hfnn.nn, "_lstm_builtin_order", lambda batch, hidden, dtype: ("persistent", "steps"))
    monkeypatch.setattr(hfnn._dispatch, "active", False)
    return StandIn().install(monkeypatch)


def pair(input_size, hidden, layers=1, bidirectional=False, batch_first=False, bias=True, dropout=0.0,
         dtype=torch.float32, device="cpu", **kw):
    torch.manual_seed(input_size * 131 + hidden * 7 + layers)
    ref = nn.LSTM(input_size, hidden, layers, bias=bias, batch_first=batch_first, dropout=dropout,
                  bidirectional=bidirectional, dtype=dtype, device=device, **kw)
    ours = hfnn.nn.LSTM(input_size, hidden, layers, bias=bias, batch_first=batch_first, dropout=dropout,
                        bidirectional=bidirectional, dtype=dtype, device=device, **kw)
    ours.load_state_dict(ref.state_dict())
    # A module built on the GPU keeps separate weights until flattened (torch flattens in .to() and
    # .cuda(), not in the constructor); cuDNN would copy them into one buffer on every call.
    ref.flatten_parameters()
    ours.flatten_parameters()
    return ref, ours


def inputs(m, batch, steps, with_state, dtype=torch.float32, device="cpu"):
    dirs = 2 if m.bidirectional else 1
    shape = (batch, steps, m.input_size) if m.batch_first else (steps, batch, m.input_size)
    x = torch.randn(shape, dtype=dtype, device=device)
    hx = None
    if with_state:
        hx = tuple(torch.randn(m.num_layers * dirs, batch, m.hidden_size, dtype=dtype, device=device) for _ in range(2))
    return x, hx


def run(m, x, hx, grads=None, use=("y", "h", "c")):
    """Output, h_n, c_n and the gradients of x, h0, c0 and every parameter (in order) for the loss
    sum(out * grad) over the outputs named in `use`."""
    x = x.detach().clone().requires_grad_()
    hx = None if hx is None else tuple(t.detach().clone().requires_grad_() for t in hx)
    y, (h, c) = m(x, hx)
    outs = {"y": y, "h": h, "c": c}
    if grads is None:
        torch.manual_seed(99)
        grads = {k: torch.randn_like(v) for k, v in outs.items()}
    leaves = [x] + ([] if hx is None else list(hx)) + list(m.parameters())
    g = torch.autograd.grad([outs[k] for k in use], leaves, [grads[k] for k in use], allow_unused=True)
    return (y, h, c), g, grads


def assert_same(ref, ours, x, hx, tol=2e-5, use=("y", "h", "c")):
    (y_r, h_r, c_r), g_r, grads = run(ref, x, hx, use=use)
    (y, h, c), g, _ = run(ours, x, hx, grads, use=use)
    assert y.shape == y_r.shape and h.shape == h_r.shape and c.shape == c_r.shape
    assert y.dtype == y_r.dtype
    for a, b in zip((y, h, c), (y_r, h_r, c_r)):
        torch.testing.assert_close(a, b, rtol=tol, atol=tol)
    assert len(g) == len(g_r)
    for i, (a, b) in enumerate(zip(g, g_r)):
        assert (a is None) == (b is None), i
        if a is not None:
            torch.testing.assert_close(a, b, rtol=tol, atol=tol, msg=lambda m: f"gradient {i}: {m}")


# ---- the glue, on the CPU with the stand-in ops ---------------------------------------------------------

@pytest.mark.parametrize("layers,bidirectional,batch_first,bias,with_state", list(itertools.product(
    [1, 2, 3], [False, True], [False, True], [True, False], [False, True])))
def test_matches_torch_outputs_states_and_every_gradient(standin, counts, layers, bidirectional, batch_first, bias,
                                                         with_state):
    ref, ours = pair(5, 4, layers, bidirectional, batch_first, bias)
    x, hx = inputs(ours, 3, 6, with_state)
    assert_same(ref, ours, x, hx)
    calls, fallbacks = counts
    assert calls == {"persistent": 1} and not fallbacks
    dirs = 2 if bidirectional else 1
    fwd = [e for e in standin.log if e[0] == "fwd"]
    bwd = [e for e in standin.log if e[0] == "bwd"]
    assert len(fwd) == len(bwd) == layers * dirs
    assert [e[2] for e in fwd] == [d == 1 for _ in range(layers) for d in range(dirs)]  # reverse per direction
    assert [e[3] for e in fwd] == [(6, 3, 5 if i < dirs else 4 * dirs) for i in range(layers * dirs)]  # time-major
    assert all(e[4] == with_state for e in fwd)


@pytest.mark.parametrize("input_size,hidden,batch,steps", [(1, 1, 1, 1), (3, 2, 1, 1), (1, 7, 5, 2), (7, 3, 1, 9),
                                                           (11, 13, 7, 5), (16, 17, 2, 3)])
def test_batch_one_and_odd_sizes(standin, input_size, hidden, batch, steps):
    for bidirectional, batch_first in ((False, True), (True, False)):
        ref, ours = pair(input_size, hidden, 2, bidirectional, batch_first)
        x, hx = inputs(ours, batch, steps, steps % 2 == 1)
        assert_same(ref, ours, x, hx)


@pytest.mark.parametrize("use", [("h",), ("c",), ("y",), ("h", "c")])
def test_only_some_outputs_reach_the_loss(standin, use):
    ref, ours = pair(4, 5, 2, True, True)
    x, hx = inputs(ours, 2, 4, True)
    assert_same(ref, ours, x, hx, use=use)
    bwd = [e for e in standin.log if e[0] == "bwd"]
    # h_n / c_n unused: the op is given None, not zeros.
    top = [e for e in bwd if e[3][2] != 4]  # the second layer's nodes (input 2 x 5)
    assert all(e[4] == ("h" in use) and e[5] == ("c" in use) for e in top), bwd


def test_dropout_off_in_eval_and_between_layers_in_training(standin, counts):
    ref, ours = pair(4, 6, 3, False, True, dropout=0.4)
    ref.eval(), ours.eval()
    x, hx = inputs(ours, 3, 5, True)
    assert_same(ref, ours, x, hx)
    # Training with p = 1: every layer's output but the last is zeroed, as torch's LSTM does.
    ref1, ours1 = pair(4, 6, 2, False, True, dropout=1.0)
    x, _ = inputs(ours1, 3, 5, False)
    torch.testing.assert_close(ours1(x)[0], ref1(x)[0], rtol=1e-5, atol=1e-5)
    # The last layer's output is not dropped: p = 0.5 leaves it dense, and the result is random.
    _, ours2 = pair(4, 6, 2, False, True, dropout=0.5)
    a, b = ours2(x)[0], ours2(x)[0]
    assert (a != 0).all() and not torch.equal(a, b)
    ours2.eval()
    assert torch.equal(ours2(x)[0], ours2(x)[0])


def test_autocast_computes_in_the_autocast_dtype(standin):
    """As cuDNN's LSTM under autocast: input, states and weights cast once, outputs in the autocast
    dtype, parameter gradients in the parameters' dtype. (torch's own CPU LSTM under autocast is not
    the reference: oneDNN refuses it on some CPUs; the GPU test compares with cuDNN.)"""
    ref, ours = pair(8, 6, 2, True, True)
    x, hx = inputs(ours, 3, 5, True)
    xl = x.clone().requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y, (h, c) = ours(xl, hx)
    assert y.dtype == h.dtype == c.dtype == torch.bfloat16
    (y.float().sum() + h.float().sum()).backward()
    assert xl.grad.dtype == torch.float32 and all(p.grad.dtype == torch.float32 for p in ours.parameters())
    fwd = [e for e in standin.log if e[0] == "fwd"]
    assert len(fwd) == 4
    # The same module in bfloat16, run without autocast: the same computation.
    low = copy.deepcopy(ref).bfloat16()
    hfnn.to_hfnn(low)
    y_low, (h_low, _) = low(x.bfloat16(), tuple(t.bfloat16() for t in hx))
    torch.testing.assert_close(y, y_low, rtol=0, atol=0)
    torch.testing.assert_close(y.float(), ref(x, hx)[0], rtol=3e-2, atol=3e-2)


def test_no_grad_builds_no_graph_and_in_place_on_the_output_works(standin):
    _, ours = pair(4, 5, 2, True, True)
    x, _ = inputs(ours, 2, 3, False)
    with torch.no_grad():
        y, (h, c) = ours(x)
    assert y.grad_fn is None and h.grad_fn is None
    with torch.inference_mode():
        assert ours(x)[0].grad_fn is None
    xl = x.clone().requires_grad_()
    y, _ = ours(xl)
    y.mul_(2)
    y.sum().backward()
    assert torch.isfinite(xl.grad).all()


def test_double_backward_is_a_clear_error(standin):
    _, ours = pair(4, 5)
    x = torch.randn(3, 2, 4, requires_grad=True)
    y, _ = ours(x)
    g, = torch.autograd.grad(y.square().sum(), x, create_graph=True)  # dy depends on y: a graph to go through
    with pytest.raises(RuntimeError, match="differentiate twice"):
        g.sum().backward()


def test_bad_arguments_give_torchs_errors(standin):
    ref, ours = pair(4, 5, 2)
    x = torch.randn(3, 2, 4)
    bad_calls = [(torch.randn(3, 2, 7), None), (x.double(), None), (x, (torch.randn(2, 2, 5), torch.randn(2, 3, 5))),
                 (x, (torch.randn(2, 5), torch.randn(2, 5))), (x, (torch.randn(3, 2, 5), torch.randn(3, 2, 5)))]
    for bad_x, bad_hx in bad_calls:
        with pytest.raises((RuntimeError, ValueError)) as want:
            ref(bad_x, bad_hx)
        with pytest.raises(want.type) as got:
            ours(bad_x, bad_hx)
        assert str(got.value) == str(want.value)


# ---- the choice of variant ----------------------------------------------------------------------------

def test_builtin_choice_is_persistent_where_it_takes_the_layer_else_steps(standin, counts):
    # persistent takes inputs of at most 6 features here: layer 0 (input 9) runs steps, layers 1-2 persistent.
    standin.supports_fn = lambda x, w_hh, v: v == "steps" or x.shape[2] <= 6
    ref, ours = pair(9, 3, 3)
    x, hx = inputs(ours, 2, 4, True)
    assert_same(ref, ours, x, hx)
    fwd = [e[1] for e in standin.log if e[0] == "fwd"]
    bwd = [e[1] for e in standin.log if e[0] == "bwd"]
    assert fwd == ["steps", "persistent", "persistent"] and sorted(bwd) == sorted(fwd)  # each backward its forward's
    assert counts[0] == {"steps": 1}  # counted by the first layer's variant


def test_no_variant_takes_it_runs_torch_exactly(standin, counts):
    standin.supports_fn = lambda x, w_hh, v: x.shape[2] != 5  # refuses the second layer's input (5)
    ref, ours = pair(4, 5, 2)
    x, hx = inputs(ours, 2, 3, True)
    y_r, (h_r, c_r) = ref(x, hx)
    y, (h, c) = ours(x, hx)
    assert torch.equal(y, y_r) and torch.equal(h, h_r) and torch.equal(c, c_r)
    assert counts == ({"torch": 1}, {"input no variant takes": 1})


# ---- every fall-back: torch's forward, its result exactly, the reason counted -----------------------------

FALLBACKS = {
    "CPU tensor": "cpu",
    "PackedSequence": "packed",
    "proj_size": "proj",
    "unbatched input": "unbatched",
    "dtype not float32/bfloat16/float16": "float64",
    "torch won the tuning": "table_torch",
    "winner refused the input": "table_refused",
    "torch.compile": "compiling",
}


@pytest.mark.parametrize("why", list(FALLBACKS))
def test_each_fallback_runs_torchs_forward_with_its_reason(standin, counts, monkeypatch, why):
    case = FALLBACKS[why]
    dtype = torch.float64 if case == "float64" else torch.float32
    ref, ours = pair(4, 5, 2, True, True, dtype=dtype, proj_size=3 if case == "proj" else 0)
    if case == "cpu":
        monkeypatch.setattr(hfnn.nn, "_lstm_takes_cpu", False)
    if case.startswith("table"):
        monkeypatch.setattr(hfnn._dispatch, "active", True)
        key = (4, 5, 2, 2, 3, torch.float32, True, True, True, False)
        standin.table[key] = "torch" if case == "table_torch" else "persistent"
        if case == "table_refused":
            standin.supports_fn = lambda x, w_hh, v: v != "persistent"
    if case == "compiling":
        monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    x, hx = inputs(ours, 2, 3, True, dtype=dtype)
    if case == "proj":
        hx = (hx[0][..., :3].contiguous(), hx[1])
    if case == "unbatched":
        x, hx = x[0], tuple(t[:, 0] for t in hx)
    if case == "packed":
        x = pack_padded_sequence(x, torch.tensor([3, 2]), batch_first=True)
    y_r, (h_r, c_r) = ref(x, hx)
    y, (h, c) = ours(x, hx)
    if case == "packed":
        y, y_r = y.data, y_r.data
    assert torch.equal(y, y_r) and torch.equal(h, h_r) and torch.equal(c, c_r)
    assert counts == ({"torch": 1}, {why: 1})
    assert not [e for e in standin.log if e[0] == "fwd"]


@pytest.mark.skipif(REAL_OPS, reason="this op library has LSTM kernels")
def test_without_the_ops_every_call_runs_torch(counts):
    ref, ours = pair(4, 5, 2, True, True)
    x, hx = inputs(ours, 2, 3, True)
    y_r, (h_r, c_r) = ref(x, hx)
    y, (h, c) = ours(x, hx)
    assert torch.equal(y, y_r) and torch.equal(h, h_r) and torch.equal(c, c_r)
    assert counts == ({"torch": 1}, {"op library has no LSTM kernels": 1})
    stats = hfnn.dispatch_stats()["ops"]["lstm"]
    assert stats["calls"]["train"] == {"torch": 1}
    assert stats["fallbacks"]["train"] == {"op library has no LSTM kernels": 1}


# ---- to_hfnn / to_torch -------------------------------------------------------------------------------

class Tagger(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(20, 6)
        self.lstm = nn.LSTM(6, 5, num_layers=2, bidirectional=True, batch_first=True)
        self.head = nn.Linear(10, 3)

    def forward(self, tokens):
        return self.head(self.lstm(self.embed(tokens))[0])


def test_to_hfnn_and_back_keeps_parameters_state_dict_and_outputs(standin, counts):
    torch.manual_seed(0)
    model = Tagger()
    tokens = torch.randint(0, 20, (3, 7))
    want = model(tokens)
    params = dict(model.named_parameters())
    flat = list(model.lstm._flat_weights)
    keys = {k: v.clone() for k, v in model.state_dict().items()}
    assert hfnn.to_hfnn(model) is model
    assert type(model.lstm) is hfnn.nn.LSTM and isinstance(model.lstm, nn.LSTM)
    assert all(p is params[n] for n, p in model.named_parameters())
    assert all(a is b for a, b in zip(model.lstm._flat_weights, flat))
    assert model.lstm.flatten_parameters.__func__ is nn.LSTM.flatten_parameters
    torch.testing.assert_close(model(tokens), want, rtol=2e-5, atol=2e-5)
    assert counts[0] == {"persistent": 1}
    buf = io.BytesIO()
    torch.save(model.state_dict(), buf)  # an hfnn checkpoint loads into torch's model and back
    buf.seek(0)
    plain = Tagger()
    plain.load_state_dict(torch.load(buf))
    assert torch.equal(plain(tokens), want)
    assert hfnn.to_torch(model) is model
    assert type(model.lstm) is nn.LSTM
    assert all(p is params[n] for n, p in model.named_parameters())
    assert list(model.state_dict()) == list(keys) and all(torch.equal(v, keys[k]) for k, v in model.state_dict().items())
    assert torch.equal(model(tokens), want)


def test_subclasses_are_left_alone():
    class MyLSTM(nn.LSTM):
        pass

    model = nn.Sequential(MyLSTM(3, 4), nn.LSTM(3, 4))
    hfnn.to_hfnn(model)
    assert type(model[0]) is MyLSTM and type(model[1]) is hfnn.nn.LSTM


def test_constructed_like_torchs():
    kw = dict(num_layers=2, bias=False, batch_first=True, dropout=0.1, bidirectional=True, proj_size=2,
              dtype=torch.float64)
    ours, ref = hfnn.nn.LSTM(5, 4, **kw), nn.LSTM(5, 4, **kw)
    assert list(ours.state_dict()) == list(ref.state_dict())
    assert [p.shape for p in ours.parameters()] == [p.shape for p in ref.parameters()]
    assert repr(ours).replace("hfnn.nn.", "") == repr(ref) or repr(ours).startswith("LSTM(")


# ---- HFNN_DISPATCH_DB: plain nn.LSTM routed by the table ------------------------------------------------------

@pytest.fixture
def routed(standin, monkeypatch):
    """install_dispatch() as the start-up hook runs it under HFNN_DISPATCH_DB with LSTM keys in the table
    (the table answered by the stand-in's lstm_choose); undone after the test."""
    monkeypatch.setattr(nn.LSTM, "forward", nn.LSTM.forward)  # restored at the end
    monkeypatch.setattr(lstm_family, "torch_forward", None)
    monkeypatch.setattr(hfnn._dispatch, "active", True)
    monkeypatch.setattr(hfnn._dispatch, "policy", "torch")
    assert not lstm_family.install_dispatch({"ops": {"lstm": {"keys": 0}}})  # no LSTM keys: left alone
    assert lstm_family.install_dispatch({"ops": {"lstm": {"keys": 3}}})
    assert not lstm_family.install_dispatch({"ops": {"lstm": {"keys": 3}}})  # once
    return standin


def key_of(m, batch, steps, dtype=torch.float32):
    return (m.input_size, m.hidden_size, m.num_layers, batch, steps, dtype, m.bidirectional, m.batch_first, m.bias,
            bool(m.dropout > 0 and m.training and m.num_layers > 1))


def test_dispatch_routes_plain_modules_by_the_table(routed, counts, monkeypatch):
    assert hasattr(nn.LSTM.forward, "__wrapped__")
    won = nn.LSTM(4, 5, 2, batch_first=True)          # the table: "steps"
    lost = nn.LSTM(4, 5, bidirectional=True)           # the table: torch
    untuned = nn.LSTM(3, 2)                            # not in the table
    routed.table[key_of(won, 2, 6)] = "steps"
    routed.table[key_of(lost, 3, 4)] = "torch"
    for m, shape in ((won, (2, 6, 4)), (lost, (4, 3, 4)), (untuned, (5, 2, 3))):
        x = torch.randn(shape)
        ref = copy.deepcopy(m)
        monkeypatch.setattr(ref, "forward", lstm_family.torch_forward.__get__(ref))
        y_r, (h_r, c_r) = ref(x)
        y, (h, c) = m(x)
        torch.testing.assert_close(y, y_r, rtol=2e-5, atol=2e-5)
        torch.testing.assert_close(h, h_r, rtol=2e-5, atol=2e-5)
    assert [e[1] for e in routed.log if e[0] == "fwd"] == ["steps", "steps"]
    calls, fallbacks = counts
    assert calls == {"steps": 1, "torch": 2}
    assert fallbacks == {"torch won the tuning": 1, "shape not tuned": 1}
    stats = hfnn.dispatch_stats()["ops"]["lstm"]
    assert stats["calls"]["train"] == {"steps": 1, "torch": 2}
    assert stats["fallbacks"]["train"] == {"torch won the tuning": 1, "shape not tuned": 1}
    assert "LSTM forward + backward: 3 calls" in hfnn._dispatch.summary(dict(hfnn.dispatch_stats(), active=True, db="x",
                                                                            keys=3, policy="torch"))


def test_dispatch_policy_heuristic_and_hfnn_modules_run_the_builtin_choice(routed, counts, monkeypatch):
    untuned = nn.LSTM(3, 2)
    ours = hfnn.to_hfnn(nn.LSTM(3, 2))
    x = torch.randn(5, 2, 3)
    ours(x)  # hfnn's module: a key without a winner runs the built-in choice
    monkeypatch.setattr(hfnn._dispatch, "policy", "heuristic")
    untuned(x)
    assert counts == ({"persistent": 2}, {})
    # hfnn's module falls back to torch's own forward, not the wrapper: one count per call.
    routed.table[key_of(ours, 2, 5)] = "torch"
    ours(x)
    assert counts == ({"persistent": 2, "torch": 1}, {"torch won the tuning": 1})


def test_training_mode_dropout_is_part_of_the_key(routed):
    m = nn.LSTM(3, 4, 2, dropout=0.3)
    x = torch.randn(5, 2, 3)
    m(x)
    m.eval()
    m(x)
    chosen = [e[1] for e in routed.log if e[0] == "choose"]
    assert [k[-1] for k in chosen] == [True, False]


def test_stats_have_the_lstm_family_with_the_op_library_or_without(counts, monkeypatch):
    monkeypatch.setattr(hfnn._ops, "available", False)
    counts[0]["torch"] += 2
    counts[1]["CPU tensor"] += 2
    stats = hfnn.dispatch_stats()
    assert stats["ops"]["lstm"] == {"title": "LSTM", "keys": 0, "calls": {"train": {"torch": 2}},
                                    "fallbacks": {"train": {"CPU tensor": 2}}}


# ---- the family's key, as kernels/lstm/lstm_family.cpp writes it ------------------------------------------------

def test_parse_key():
    k = lstm_family.parse_key("input=985,hidden=985,layers=1,bidirectional=0,batch=4,steps=1000,batch_first=1,"
                              "bias=1,dropout=0")
    assert k == {"input": 985, "hidden": 985, "layers": 1, "bidirectional": False, "batch": 4, "steps": 1000,
                 "batch_first": True, "bias": True, "dropout": False}
    for bad in ["input=985,hidden=985", "input=0,hidden=4,layers=1,bidirectional=0,batch=4,steps=10,batch_first=1,"
                "bias=1,dropout=0", "input=4,hidden=4,layers=1,bidirectional=0,batch=4,steps=10,batch_first=1,bias=1,"
                "dropout=1", "hidden=4,input=4,layers=1,bidirectional=0,batch=4,steps=10,batch_first=1,bias=1,dropout=0"]:
        with pytest.raises(ValueError, match="not an LSTM key"):
            lstm_family.parse_key(bad)


def test_the_family_is_listed_and_swaps_lstm():
    from hfnn import _families

    assert _families.find("lstm") is lstm_family and lstm_family in _families.ALL
    assert lstm_family.swaps() == {nn.LSTM: hfnn.nn.LSTM}
    assert all(hasattr(lstm_family, f) for f in ("measure", "install_dispatch", "add_stats", "parse_key"))


@pytest.mark.parametrize("key,dtype", [
    ("input=5,hidden=4,layers=2,bidirectional=1,batch=3,steps=6,batch_first=1,bias=1,dropout=1", "float32"),
    ("input=3,hidden=6,layers=1,bidirectional=0,batch=2,steps=5,batch_first=0,bias=0,dropout=0", "bfloat16"),
])
def test_measure_gates_every_candidate_against_float64(standin, monkeypatch, key, dtype):
    """The tune worker's answer, on the CPU with the stand-in ops: torch's module and both variants
    timed and within the family's tolerance, the planted wrong candidate far outside it."""
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    r = lstm_family.measure(torch, hfnn, {"key": key, "dtype": dtype, "passes": ["train"], "seconds": 0.2}, 1 << 16,
                            plant=True, device="cpu")
    assert r["key"] == key and r["op"] == "lstm" and r["dtype"] == dtype
    by = {c["name"]: c for c in r["candidates"]}
    assert list(by) == ["torch", "persistent", "steps", "planted_wrong"], by
    tol = {"float32": 1e-3, "bfloat16": 5e-2}[dtype]
    for name, c in by.items():
        assert c.get("ran", True) and c["pass"] == "train" and len(c["samples_us"]) >= 7, (name, c)
        assert (c["max_error"] <= tol) == (name != "planted_wrong"), (name, c["max_error"])
    standin.supports_fn = lambda x, w_hh, v: v == "steps"
    r = lstm_family.measure(torch, hfnn, {"key": key, "dtype": dtype, "seconds": 0.1}, 1 << 16, plant=False,
                            device="cpu")
    assert [c["name"] for c in r["candidates"]] == ["torch", "steps"]


def test_measure_refuses_what_is_not_a_key_or_a_tunable_dtype():
    key = "input=5,hidden=4,layers=1,bidirectional=0,batch=3,steps=6,batch_first=1,bias=1,dropout=0"
    with pytest.raises(ValueError, match="not tunable"):
        lstm_family.measure(torch, hfnn, {"key": key, "dtype": "float64"}, 1 << 16, plant=False, device="cpu")
    with pytest.raises(ValueError, match="not an LSTM key"):
        lstm_family.measure(torch, hfnn, {"key": "rows=4,D=8,affine=1", "dtype": "float32"}, 1 << 16, plant=False)


# ---- the whole chain: hfnn profile, hfnn tune (the stand-in worker), HFNN_DISPATCH_DB ---------------------------

HFNN = shutil.which("hfnn")
SCRIPTS = Path(__file__).parent / "scripts"
LSTM_TRAIN = SCRIPTS / "lstm_train.py"
STEPS_TRAINED = 3


def _cpp_family_reason():
    if HFNN is None:
        return "the hfnn executable is not on PATH: run scripts/setup.sh"
    if not REAL_OPS or not hasattr(torch.ops.hfnn, "lstm_choose"):
        return "this op library has no LSTM ops (lstm_layer_fwd, lstm_choose)"
    if "lstm" not in json.loads(torch.ops.hfnn.dispatch_stats())["ops"]:
        return "the op library's families (kernels/common/family.cpp) do not list lstm yet: hfnn tune has no LSTM keys"
    if not hfnn.build_info().get("variants", {}).get("lstm", {}).get("train"):
        return "this build has no LSTM kernel variants (built without nvcc): hfnn tune skips LSTM keys"
    return None


requires_chain = pytest.mark.skipif(_cpp_family_reason() is not None, reason=_cpp_family_reason() or "")


def chain(tmp_path, device, winner):
    """profile lstm_train.py, then `hfnn tune` with the stand-in worker naming `winner` (or torch, by
    timing it slower) for every key, for this machine's versions and GPU; returns the database."""
    env = {k: v for k, v in os.environ.items() if k not in ("HFNN_PROFILE_DIR", "HFNN_DISPATCH_DB")}
    db = tmp_path / "shapes.db"
    out = subprocess.run([HFNN, "profile", "-q", "--db", str(db), "--python", sys.executable, str(LSTM_TRAIN), device,
                          "4"], capture_output=True, text=True, timeout=240, env=env)  # 2 warm-up steps, 2 recorded
    assert out.returncode == 0, out.stderr
    env.update(HFNN_TUNE_WORKER=str(SCRIPTS / "fake_tune_worker.py"), FAKE_TUNE_TORCH=torch.__version__,
               FAKE_TUNE_CUDA=torch.version.cuda or "", FAKE_TUNE_HFNN=hfnn.__version__,
               FAKE_TUNE_WINNER_TRAIN="steps" if winner == "torch" else winner,
               FAKE_TUNE_GOOD_US="200" if winner == "torch" else "50")
    if device == "cuda":
        props = torch.cuda.get_device_properties(0)
        env.update(FAKE_TUNE_GPU=props.name, FAKE_TUNE_CC=f"{props.major}.{props.minor}",
                   FAKE_TUNE_SMS=str(props.multi_processor_count))
    out = subprocess.run([HFNN, "tune", "-q", "--db", str(db), "--python", sys.executable], capture_output=True,
                         text=True, timeout=240, env=env)
    assert out.returncode == 0, out.stderr
    return db


def train_script(device, db=None, mode=""):
    env = {k: v for k, v in os.environ.items() if k not in ("HFNN_PROFILE_DIR", "HFNN_DISPATCH_DB")}
    if db is not None:
        env["HFNN_DISPATCH_DB"] = str(db)
    out = subprocess.run([sys.executable, str(LSTM_TRAIN), device, str(STEPS_TRAINED), mode], capture_output=True,
                         text=True, timeout=300, env=env)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


@requires_chain
def test_chain_tunes_lstm_keys_and_dispatch_counts_every_call_on_the_cpu(tmp_path):
    db = chain(tmp_path, "cpu", "persistent")
    keys = sqlite3.connect(db).execute("SELECT key, winner FROM tune_winners WHERE op = 'lstm' ORDER BY key").fetchall()
    assert keys == [("input=16,hidden=24,layers=1,bidirectional=0,batch=4,steps=12,batch_first=1,bias=1,dropout=0",
                     "persistent"),
                    ("input=24,hidden=24,layers=2,bidirectional=1,batch=4,steps=12,batch_first=0,bias=1,dropout=0",
                     "persistent")]  # proj_size has no key
    plain = train_script("cpu")
    tuned = train_script("cpu", db)
    assert tuned["wrapped"] and not plain["wrapped"]
    assert tuned["losses"] == plain["losses"]  # torch's module ran every call
    lstm = tuned["stats"]["ops"]["lstm"]
    assert lstm["keys"] == 2
    assert lstm["calls"]["train"] == {"torch": 3 * STEPS_TRAINED}
    assert lstm["fallbacks"]["train"] == {"CPU tensor": 2 * STEPS_TRAINED, "proj_size": STEPS_TRAINED}


@requires_chain
@pytest.mark.skipif(_gpu_skip_reason() is not None, reason=_gpu_skip_reason() or "")
@pytest.mark.parametrize("winner", ["persistent", "steps", "torch"])
def test_chain_runs_the_stored_winner_on_the_gpu(tmp_path, winner):
    db = chain(tmp_path, "cuda", winner)
    plain = train_script("cuda")
    tuned = train_script("cuda", db)
    lstm = tuned["stats"]["ops"]["lstm"]
    if winner == "torch":
        assert lstm["calls"]["train"] == {"torch": 3 * STEPS_TRAINED}
        assert lstm["fallbacks"]["train"] == {"torch won the tuning": 2 * STEPS_TRAINED, "proj_size": STEPS_TRAINED}
        assert tuned["losses"] == plain["losses"]
        return
    assert lstm["calls"]["train"] == {winner: 2 * STEPS_TRAINED, "torch": STEPS_TRAINED}
    assert lstm["fallbacks"]["train"] == {"proj_size": STEPS_TRAINED}
    for a, b in zip(tuned["losses"], plain["losses"]):
        assert abs(a - b) <= 1e-3 * abs(b), (tuned["losses"], plain["losses"])
    # hfnn's modules under the same table: the same winners, counted once per call.
    swapped = train_script("cuda", db, "to_hfnn")
    assert swapped["stats"]["ops"]["lstm"]["calls"]["train"] == lstm["calls"]["train"]


_PROFILED_STANDIN = r"""
import sys
sys.path.insert(0, {tests!r})
import torch
import hfnn
from lstm_standin import StandIn

ops = StandIn()
for name in ("lstm_layer_fwd", "lstm_layer_bwd", "lstm_supports", "lstm_variants", "lstm_choose"):
    setattr(torch.ops.hfnn, name, getattr(ops, name))
hfnn.nn._lstm_takes_cpu = True
hfnn.nn._lstm_builtin_order = lambda batch, hidden, dtype: ("persistent", "steps")
torch.manual_seed(0)
m = hfnn.nn.LSTM(4, 6, num_layers=2, bidirectional=True, batch_first=True)
for step in range(3):
    m(torch.randn(3, 5, 4))[0].sum().backward()
    m.eval()
    m(torch.randn(3, 5, 4))  # the eval calls: no dropout either way
    m.train()
assert dict(hfnn.nn.lstm_calls) == {{"persistent": 6}}, dict(hfnn.nn.lstm_calls)
"""


@pytest.mark.skipif(HFNN is None, reason="the hfnn executable is not on PATH: run scripts/setup.sh")
def test_profile_records_the_shapes_hfnn_s_path_runs(tmp_path):
    """hfnn.nn.LSTM's own path runs no aten::lstm: it records its calls in a shape scope the profiler
    reads, with the settings aten::lstm's record has, so a to_hfnn'd model is profiled and tuned too."""
    script = tmp_path / "profiled.py"
    script.write_text(_PROFILED_STANDIN.format(tests=str(Path(__file__).parent)))
    db = tmp_path / "shapes.db"
    env = {k: v for k, v in os.environ.items() if k not in ("HFNN_PROFILE_DIR", "HFNN_DISPATCH_DB")}
    out = subprocess.run([HFNN, "profile", "-q", "--db", str(db), "--python", sys.executable, str(script)],
                         capture_output=True, text=True, timeout=240, env=env)
    assert out.returncode == 0, out.stderr
    rows = sqlite3.connect(db).execute("SELECT shape, dtype, flags, calls FROM shape_stats WHERE op = 'lstm'").fetchall()
    assert rows == [("[3,5,4]", "float32", "input=4,hidden=6,layers=2,bidirectional=1,batch_first=1,bias=1,proj=0,"
                                           "dropout=0", 6)]


# ---- bench/e2e.py runs the LSTM example --------------------------------------------------------------------------

def test_e2e_runs_the_lstm_example():
    sys.path.insert(0, str(BENCH.parent))
    try:
        spec = importlib.util.spec_from_file_location("bench_e2e", BENCH.parent / "e2e.py")
        e2e = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(e2e)
    finally:
        sys.path.remove(str(BENCH.parent))
    args = e2e.parse_args(["--example", "lstm_lm", "--dtype", "bfloat16", "--layers", "2"])
    cmd = e2e.example_command(args)
    assert Path(cmd[0]).name == "lstm_lm.py" and Path(cmd[0]).is_file()
    assert cmd[1:] == ["--dtype", "bfloat16", "--layers", "2"]
    assert Path(e2e.example_command(e2e.parse_args([]))[0]).name == "evoformer.py"
    with pytest.raises(SystemExit, match="--layers is an option of lstm_lm and transformer"):
        e2e.example_command(e2e.parse_args(["--layers", "2"]))
    cmd_t = e2e.example_command(e2e.parse_args(["--example", "transformer", "--config", "2", "--dtype", "bfloat16"]))
    assert Path(cmd_t[0]).name == "transformer.py" and cmd_t[1:] == ["--dtype", "bfloat16", "--config", "2"]
    with pytest.raises(SystemExit, match="--config is an option of transformer"):
        e2e.example_command(e2e.parse_args(["--example", "lstm_lm", "--config", "2"]))
    # The example itself, as e2e runs it (small on the CPU), with and without hfnn's module.
    for extra in ([], ["--hfnn"]):
        out = subprocess.run([sys.executable, cmd[0], "--steps", "1", "--warmup", "0", "--device", "cpu", "--layers",
                              "2", *extra], capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
    assert "hfnn on, 1 LSTM(s), torch's LSTM on the CPU" in out.stdout


# ---- bench/lstm.py, the parts that run without a GPU ----------------------------------------------------------

def bench_module():
    spec = importlib.util.spec_from_file_location("bench_lstm", BENCH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_lstm_steps_ab_alternates_the_switch_and_keeps_each_settings_medians(tmp_path):
    """bench/lstm_steps.py --ab NAME (the lstm-ab stage): the timing test runs with NAME at 1, then 0,
    --rounds times each; each setting's records carry its value, and each shape's ratio is printed.
    A stand-in for the C++ test binary prints step times from its environment."""
    fake = tmp_path / "hfnn_kernel_tests"
    log = tmp_path / "calls"
    fake.write_text(
        "#!/bin/sh\n"
        f"echo \"$HFNN_AB_SWITCH ${{HFNN_LSTM_TIMING_DTYPE:-all}}\" >> {log}\n"
        "if [ \"$HFNN_AB_SWITCH\" = 1 ]; then bwd=10.00; else bwd=15.00; fi\n"
        "echo \"[ LSTM     ] persistent T1000 B32 I1024 H1024 bfloat16 bias: fwd 8.00 us/step, "
        "bwd $bwd us/step, fwd+bwd 18.000 ms\"\n")
    fake.chmod(0o755)
    steps = BENCH.parent / "lstm_steps.py"
    out_json = tmp_path / "ab.json"
    out = subprocess.run([sys.executable, str(steps), "--tests", str(fake), "--version", "trial", "--ab", "HFNN_AB_SWITCH",
                          "--rounds", "2", "--dtype", "bfloat16", "--out", str(out_json)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert log.read_text().split("\n")[:4] == ["1 bfloat16", "0 bfloat16", "1 bfloat16", "0 bfloat16"]
    records = json.loads(out_json.read_text())
    by = {r["switch"]["HFNN_AB_SWITCH"]: r for r in records}
    assert set(by) == {"1", "0"} and by["1"]["bwd_us_per_step"] == 10.0 and by["0"]["bwd_us_per_step"] == 15.0
    assert by["1"]["version"] == "trial, HFNN_AB_SWITCH=1" and by["1"]["rounds"] == 2
    assert "bwd  10.00 /  15.00 (1.50x)" in out.stdout
    bad = subprocess.run([sys.executable, str(steps), "--tests", str(fake), "--version", "t", "--ab", "not a name"],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 1 and "--ab" in bad.stderr and "Traceback" not in bad.stderr


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU: the benchmark runs")
def test_bench_says_it_needs_a_gpu():
    out = subprocess.run([sys.executable, str(BENCH), "--quick"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 1 and "needs a GPU" in out.stderr and "Traceback" not in out.stderr


def test_bench_help_teaches_and_the_map_plots(tmp_path):
    out = subprocess.run([sys.executable, str(BENCH), "--help"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "cudnn" in out.stdout and "--grid" in out.stdout and "Examples" in out.stdout
    bench = bench_module()
    assert [bench.gpu_slug(n) for n in ("NVIDIA H200", "NVIDIA H100 80GB HBM3")] == ["h200", "h100"]
    records = []
    for hidden, batch, cand, ms in [(128, 1, "cudnn", 2.0), (128, 1, "persistent", 0.5), (128, 1, "steps", 1.0),
                                    (4096, 256, "cudnn", 2.0), (4096, 256, "steps", 4.0)]:
        for pass_ in ("fwd", "bwd"):
            records.append({"gpu": "NVIDIA H200", "config": [hidden, hidden, batch, 100], "dtype": "bfloat16",
                            "pass": pass_, "candidate": cand, "median_ms": ms, "grid": True, "correct": True})
    assert bench.speedups(records) == {"bfloat16": {(128, 1): (4.0, "persistent"), (4096, 256): (0.5, "steps")}}
    (tmp_path / "grid.json").write_text(json.dumps(records))
    out = subprocess.run([sys.executable, str(BENCH), "--plot-from", str(tmp_path / "grid.json"), "--plot",
                          str(tmp_path / "map.svg")], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    svg = (tmp_path / "map.svg").read_text()
    assert svg.startswith("<svg") and ">4.00<" in svg and ">0.50<" in svg and "bfloat16" in svg
    assert "not measured" in svg  # (128, 256) and (4096, 1) were not timed
    # The built-in choice: variants at least 1.1x faster than cuDNN, fastest first; a wrong one never.
    more = [dict(records[0], config=[256, 256, 8, 100], candidate=c, median_ms=ms, correct=ok)
            for c, ms, ok in [("cudnn", 1.0, True), ("persistent", 0.95, True), ("steps", 0.5, False)]]
    orders = bench.builtin_orders(records + more)
    assert orders == {"bfloat16": {128: {1: ("persistent", "steps")}, 256: {8: ()}, 4096: {256: ()}}}
    out = subprocess.run([sys.executable, str(BENCH), "--plot-from", str(tmp_path / "grid.json"), "--builtin-out",
                          str(tmp_path / "builtin.py")], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    spec = importlib.util.spec_from_file_location("builtin", tmp_path / "builtin.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.ORDERS == {"bfloat16": {128: {1: ("persistent", "steps")}, 4096: {256: ()}}}
    assert module.GPU == ["NVIDIA H200"] and module.MARGIN == 1.1
    # Input that is not grid records: one line naming the file, nothing written, for either output.
    for text, says in [("[]", "no grid records"), ("[1, 2]", "no grid records"), ('{"a": 1}', "no grid records"),
                       ('[{"grid": true}]', "grid records without"), ("not json", "not a result file")]:
        (tmp_path / "bad.json").write_text(text)
        for flag, dest in (("--builtin-out", "b2.py"), ("--plot", "b2.svg")):
            out = subprocess.run([sys.executable, str(BENCH), "--plot-from", str(tmp_path / "bad.json"), flag,
                                  str(tmp_path / dest)], capture_output=True, text=True, timeout=60)
            assert out.returncode != 0 and says in out.stderr and "Traceback" not in out.stderr, (text, out.stderr)
            assert len(out.stderr.strip().splitlines()) == 1 and not (tmp_path / dest).exists(), (text, out.stderr)
    # Several files: one map; a point timed in two of them is refused (it would be summed as one).
    (tmp_path / "more.json").write_text(json.dumps(more))
    out = subprocess.run([sys.executable, str(BENCH), "--plot-from", str(tmp_path / "grid.json"), str(tmp_path / "more.json"),
                          "--builtin-out", str(tmp_path / "two.py")], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "256: {8: ()}" in (tmp_path / "two.py").read_text()
    out = subprocess.run([sys.executable, str(BENCH), "--plot-from", str(tmp_path / "grid.json"), str(tmp_path / "grid.json"),
                          "--builtin-out", str(tmp_path / "dup.py")], capture_output=True, text=True, timeout=60)
    assert out.returncode != 0 and "in both" in out.stderr and not (tmp_path / "dup.py").exists(), out.stderr
    assert len(out.stderr.strip().splitlines()) == 1
    out = subprocess.run([sys.executable, str(BENCH), "--builtin-out", str(tmp_path / "b3.py")], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode != 0 and "--grid" in out.stderr and not (tmp_path / "b3.py").exists()


# ---- GPU: the real ops ----------------------------------------------------------------------------------------

requires_lstm_ops = pytest.mark.skipif(
    _gpu_skip_reason() is not None or not REAL_OPS,
    reason=_gpu_skip_reason() or "this op library has no LSTM kernels (no hfnn::lstm_layer_fwd)")

# Largest error against float64 (max|out - ref| / max|ref|), as the tuner's gate
# (kernels/lstm/lstm_family.cpp); and never worse than 4x torch's own module in the same dtype.
TOLERANCE = {torch.float32: 1e-3, torch.float16: 1e-2, torch.bfloat16: 5e-2}
HIDDEN = [*range(1, 18), 31, 32, 33, 63, 64, 65, 127, 128, 129, 255, 256, 257, 511, 512, 513, 1023, 1024, 1025]
BATCH = [1, 2, 3, 5, 8, 31, 32, 33, 64, 128]
STEPS = [1, 2, 7, 64]


def rel(a, b):
    return ((a.double() - b.double()).abs().max() / b.double().abs().max().clamp_min(1e-6)).item()


def gpu_reference(m, x, hx):
    """m in float64 on the GPU: output, h_n, c_n, then the gradients of x, h0, c0 and every parameter,
    for random output gradients (returned too)."""
    m64 = copy.deepcopy(m).double()
    nn.LSTM.flatten_parameters(m64)
    (y64, h64, c64), g64, grads = run(m64, x.double(), tuple(t.double() for t in hx))
    return [y64, h64, c64, *g64], grads


def gpu_errors(m, variant, x, hx, dtype, ref):
    """Errors of `variant` ("torch": the module's torch path) in `dtype` against gpu_reference's, in its order."""
    values, grads = ref
    low = {k: v.to(dtype) for k, v in grads.items()}
    xl = x.detach().to(dtype).clone().requires_grad_()  # fresh leaves: no gradient of another run in .grad
    hxl = tuple(t.detach().to(dtype).clone().requires_grad_() for t in hx)
    for p in m.parameters():
        p.grad = None
    if variant == "torch":
        y, (h, c) = (lstm_family.torch_forward or nn.LSTM.forward)(m, xl, hxl)
    else:
        y, (h, c), _ = hfnn.nn._lstm_run(m, xl, hxl, variant)
    torch.autograd.backward([y, h, c], [low["y"], low["h"], low["c"]])
    got = [y, h, c, xl.grad, *(t.grad for t in hxl), *(p.grad for p in m.parameters())]
    return [rel(a, b) for a, b in zip(got, values)]


def gpu_check(m, x, hx, dtype, failures, label):
    """Every variant that takes the shape against float64, within the tolerance or 4x torch's own
    error; returns the variants that ran."""
    ref = gpu_reference(m, x, hx)
    errs_torch = gpu_errors(m, "torch", x, hx, dtype, ref)
    ran = []
    xt = (x.transpose(0, 1) if m.batch_first else x).to(dtype).contiguous()
    for v in torch.ops.hfnn.lstm_variants():
        if not torch.ops.hfnn.lstm_supports(xt, m.weight_hh_l0, v):
            continue
        ran.append(v)
        errs = gpu_errors(m, v, x, hx, dtype, ref)
        for i, (e, et) in enumerate(zip(errs, errs_torch)):
            if e > max(TOLERANCE[dtype], 4 * et):
                failures.append(f"{label} {v} output#{i}: {e:.2e} (torch {et:.2e})")
    return ran


@requires_lstm_ops
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
def test_gpu_every_variant_over_a_dense_sweep(dtype, monkeypatch):
    """hidden 1..17 and around every power of two to 1025, batch 1..128, steps 1..64, layers 1-2,
    bidirectional and batch_first both ways, in turn (not the full product: a few hundred cases).
    float32 in IEEE (cuDNN's and hfnn's GEMMs alike): the kernels' own error, not TF32's, which at
    tiny sizes reaches the gate itself (test_gpu_float32_takes_tf32_exactly_where_cudnns_lstm_would)."""
    monkeypatch.setattr(torch.backends.cudnn.rnn, "fp32_precision", "ieee")
    failures, ran = [], collections.Counter()
    cases = 0
    for i, hidden in enumerate(HIDDEN):
        for j, batch in enumerate(BATCH):
            if (i + j) % 3:  # a third of the hidden x batch grid, every size of each seen
                continue
            steps = STEPS[(i + 2 * j) % len(STEPS)]
            layers, bidirectional, batch_first = 1 + (i + j) % 2, bool(j % 2), bool(i % 2)
            input_size = [hidden, 1, 64, 3 * hidden + 1][(i + j) % 4]
            torch.manual_seed(i * 100 + j)
            m = nn.LSTM(input_size, hidden, layers, batch_first=batch_first, bidirectional=bidirectional,
                        device="cuda", dtype=dtype)
            x, hx = inputs(m, batch, steps, True, dtype=torch.float32, device="cuda")
            label = f"I={input_size} H={hidden} B={batch} T={steps} L={layers} bi={bidirectional} bf={batch_first}"
            for v in gpu_check(m, x, hx, dtype, failures, label):
                ran[v] += 1
            cases += 1
    assert not failures, "\n".join(failures[:40])
    print(f"{dtype}: {cases} cases, variants ran on {dict(ran)}")
    assert ran["steps"] + ran["persistent"] > 0
    # cuDNN's persistent kernel takes every dtype on Hopper (hidden up to 1,024 on an H100)
    if torch.cuda.get_device_capability() == (9, 0):
        assert ran["cudnn_persistent"] > 0, dict(ran)


@requires_lstm_ops
@pytest.mark.parametrize("variant", ["persistent", "steps", "cudnn_persistent"])
def test_gpu_float32_takes_tf32_exactly_where_cudnns_lstm_would(variant):
    """hfnn's float32 LSTM follows torch.backends.cudnn.rnn.fp32_precision, the setting of the
    op it replaces (cuDNN's RNN; "tf32" is torch's default): "ieee" gives float32 GEMMs (within
    1e-5 of float64 everywhere), "tf32" TF32 ones (the projection and weight gradients then 2^-11
    operand rounding, well above the ieee errors) and still within the family's gate."""
    before = torch.backends.cudnn.rnn.fp32_precision
    torch.manual_seed(5)
    m = nn.LSTM(256, 256, batch_first=True, device="cuda")
    x, hx = inputs(m, 4, 16, True, dtype=torch.float32, device="cuda")
    xt = x.transpose(0, 1).contiguous()
    if not torch.ops.hfnn.lstm_supports(xt, m.weight_hh_l0, variant):
        pytest.skip(f"{variant} does not take hidden 256, batch 4 on this GPU")
    ref = gpu_reference(m, x, hx)
    errs = {}
    try:
        for precision in ("ieee", "tf32"):
            torch.backends.cudnn.rnn.fp32_precision = precision
            errs[precision] = gpu_errors(m, variant, x, hx, torch.float32, ref)
    finally:
        torch.backends.cudnn.rnn.fp32_precision = before
    assert max(errs["ieee"]) < 1e-5, errs["ieee"]
    assert max(errs["tf32"]) > 10 * max(errs["ieee"]), errs
    assert max(errs["tf32"]) < TOLERANCE[torch.float32], errs["tf32"]


@requires_lstm_ops
@pytest.mark.parametrize("layers,bidirectional,batch_first,bias,with_state", [
    (1, False, True, True, False), (2, True, False, True, True), (3, False, False, False, True),
    (2, True, True, False, False)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_gpu_module_against_torchs_module(counts, any_variant, dtype, layers, bidirectional, batch_first, bias,
                                          with_state):
    ref, ours = pair(48, 64, layers, bidirectional, batch_first, bias, dtype=dtype, device="cuda")
    x, hx = inputs(ours, 5, 33, with_state, dtype=dtype, device="cuda")
    tol = 2e-3 if dtype == torch.float32 else 6e-2
    (y_r, h_r, c_r), g_r, grads = run(ref, x, hx)
    (y, h, c), g, _ = run(ours, x, hx, grads)
    assert not counts[1], dict(counts[1])
    assert sum(counts[0].values()) == 1 and "torch" not in counts[0]
    for a, b in zip((y, h, c, *g), (y_r, h_r, c_r, *g_r)):
        assert rel(a, b) < tol


@requires_lstm_ops
def test_gpu_autocast_matches_cudnn_under_autocast(counts, any_variant):
    ref, ours = pair(64, 96, 2, True, True, device="cuda")
    x, hx = inputs(ours, 4, 20, True, device="cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        y_r, (h_r, c_r) = ref(x, hx)
        y, (h, c) = ours(x, hx)
    assert y.dtype == y_r.dtype and h.dtype == h_r.dtype and c.dtype == c_r.dtype
    for a, b in ((y, y_r), (h, h_r), (c, c_r)):
        assert rel(a, b) < 5e-2
    assert not counts[1]


@requires_lstm_ops
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
def test_gpu_a_second_backward_over_one_forward_gives_the_first_gradients(dtype, counts, monkeypatch):
    """autograd's retain_graph through hfnn.nn.LSTM: every variant gives the same gradients twice
    over one forward. cuDNN's persistent kernel writes into its reserve space in the backward, and a
    second backward straight over it was wrong (relative errors about 1, H100, cuDNN 9.19): the
    variant's backward works on a copy (kernels/lstm/lstm_cudnn.cu)."""
    ran = []
    for v in torch.ops.hfnn.lstm_variants():
        monkeypatch.setattr(hfnn.nn, "_lstm_builtin_order", lambda batch, hidden, dt, v=v: (v,))
        torch.manual_seed(3)
        m = hfnn.nn.LSTM(128, 128, batch_first=True, device="cuda", dtype=dtype)
        x = torch.randn(8, 12, 128, device="cuda", dtype=dtype, requires_grad=True)
        if not torch.ops.hfnn.lstm_supports(x.transpose(0, 1).contiguous(), m.weight_hh_l0, v):
            continue
        before = counts[0][v]
        y, (h, c) = m(x)
        assert counts[0][v] == before + 1, (v, dict(counts[0]))
        loss = (y.float() * torch.randn(y.shape, device="cuda")).sum() + (h.float() * c.float()).sum()
        params = [x, *m.parameters()]
        first = torch.autograd.grad(loss, params, retain_graph=True)
        second = torch.autograd.grad(loss, params)
        for i, (a, b) in enumerate(zip(first, second)):
            if v == "cudnn_persistent":  # cuDNN's: not held to bit-identical runs; wrong was off by about 1
                assert (a.float() - b.float()).abs().max() <= TOLERANCE[dtype] * a.float().abs().max(), (v, i)
            else:
                assert torch.equal(a, b), (v, i, (a.float() - b.float()).abs().max().item())
        ran.append(v)
    assert {"persistent", "steps"} <= set(ran), ran
    if torch.cuda.get_device_capability() == (9, 0):
        assert "cudnn_persistent" in ran, ran


@requires_lstm_ops
def test_gpu_flatten_parameters_and_the_swap_keep_cudnns_flat_weights():
    """hfnn.nn.LSTM inherits flatten_parameters: after the swap and a flatten the parameters are the
    same objects, views of one buffer in cuDNN's order, and torch's module runs on them unwarned."""
    import warnings

    def one_buffer(m):  # cuDNN's layout: every layer's matrices, then every bias, in one storage
        return len({t.untyped_storage().data_ptr() for t in m._flat_weights}) == 1

    m = nn.LSTM(16, 32, 2, batch_first=True).cuda()  # .cuda() flattens (the constructor does not)
    params = list(m.parameters())
    assert one_buffer(m)
    hfnn.to_hfnn(m)
    m.flatten_parameters()
    assert one_buffer(m) and all(a is b for a, b in zip(m.parameters(), params))
    x = torch.randn(3, 5, 16, device="cuda")
    y = m(x)[0]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "weights are not part of single contiguous chunk"
        torch.testing.assert_close(hfnn.to_torch(m)(x)[0], y, rtol=2e-3, atol=2e-3)


@requires_lstm_ops
def test_gpu_measure_times_torch_and_every_variant_and_rejects_the_planted_one():
    key = "input=64,hidden=96,layers=2,bidirectional=1,batch=3,steps=17,batch_first=1,bias=1,dropout=1"
    r = lstm_family.measure(torch, hfnn, {"key": key, "dtype": "float32", "passes": ["train"], "seconds": 1.0},
                            torch.cuda.get_device_properties(0).L2_cache_size, plant=True)
    by = {c["name"]: c for c in r["candidates"]}
    assert "torch" in by and "planted_wrong" in by and len(by) >= 3, by
    for name, c in by.items():
        assert c.get("ran", True), (name, c)
        assert len(c["samples_us"]) >= 7 and min(c["samples_us"]) > 0 and c["pass"] == "train"
    tol = max(1e-3, 2 * by["torch"]["max_error"])
    for name, c in by.items():
        if name != "planted_wrong":
            assert c["max_error"] <= tol, (name, c["max_error"])
    assert by["planted_wrong"]["max_error"] > tol


def test_the_builtin_choice_follows_the_measurements(monkeypatch, standin, counts):
    """Without a table: the crossover grid's choice (python/hfnn/_lstm_builtin.py, generated from
    bench/lstm.py --grid) at its points, the nearest point's of the same class (hidden a multiple of
    4, or not) in log2 of hidden and of batch between them, cuDNN beyond it and in a dtype it did not
    time; fp16 has a map of its own (torch runs cuDNN's persistent kernels in fp16)."""
    from hfnn import _lstm_builtin as grid

    order = _REAL_BUILTIN_ORDER  # the stand-in fixture lets every variant run
    monkeypatch.setattr(hfnn.nn, "_lstm_builtin_order", order)
    # the build's variants; a build without CUDA kernels has none: the family's (kernels/lstm/lstm_family.h)
    names = BUILD_VARIANTS or {"persistent", "steps", "cudnn_persistent"}
    assert set(grid.ORDERS) == {"float32", "bfloat16", "float16"} and grid.MARGIN >= 1.0
    for dtype_name, by_hidden in grid.ORDERS.items():
        dtype = getattr(torch, dtype_name)
        for hidden, by_batch in by_hidden.items():
            for batch, want in by_batch.items():
                assert set(want) <= names, (hidden, batch, want)
                assert order(batch, hidden, dtype) == want, (dtype_name, hidden, batch)
    f32, b16 = grid.ORDERS["float32"], grid.ORDERS["bfloat16"]
    # between points: hidden 700 -> 512 (log2 distance 0.45 against 0.55); batch 3 -> 4, 40 -> 32
    assert order(8, 700, torch.float32) == f32[512][8] and order(40, 128, torch.bfloat16) == b16[128][32]
    # the class: rows not a multiple of 4 take the points measured so (985 -> 1,023; 126 -> 127), the
    # others those that are (1,020 -> 1,024), however near a point of the other class is
    assert {h % 4 == 0 for h in f32} == {h % 4 == 0 for h in b16} == {True, False}
    assert order(4, 985, torch.float32) == f32[1023][4] and order(3, 985, torch.bfloat16) == b16[1023][4]
    # fp16 reads its own map, not bf16's: where torch's cuDNN runs its persistent kernel in fp16
    # (hidden and input multiples of 128, batch a multiple of 8) it beat hfnn's, which the bf16 map
    # runs there (bench/results/lstm_grid_f16-h100.json: hidden 1,024, batch 64)
    h16 = grid.ORDERS["float16"]
    assert order(4, 985, torch.float16) == h16[1023][4] and order(64, 1024, torch.float16) == h16[1024][64] == ()
    assert b16[1024][64] != () and order(64, 1024, torch.bfloat16) == b16[1024][64]
    assert "cudnn_persistent" in {v for by_batch in h16.values() for want in by_batch.values() for v in want}
    assert order(256, 126, torch.bfloat16) == b16[127][256] and order(256, 1020, torch.float32) == f32[1024][256]
    assert b16[127][1] != b16[128][1]  # where the classes were measured apart and differ
    assert order(1, 127, torch.bfloat16) == b16[127][1] and order(1, 128, torch.bfloat16) == b16[128][1]
    # the seed's shape is a measured win in both dtypes (bench/results/lstm_grid-h100.json)
    assert order(4, 985, torch.float32)[0] == order(4, 985, torch.bfloat16)[0] == "persistent"
    # beyond the grid by more than half a step, and a dtype it did not time: cuDNN
    assert order(4, 64, torch.float32) == order(4, 8192, torch.bfloat16) == order(512, 512, torch.bfloat16) == ()
    assert order(4, 512, torch.float64) == ()
    assert order(4, 88, torch.float32) == () and order(4, 92, torch.float32) == f32[128][4]
    assert order(4, 5792, torch.float32) == f32[4096][4] and order(4, 5796, torch.float32) == ()
    assert order(4, 89, torch.float32) == () and order(4, 90, torch.float32) == f32[127][4]  # 127 / sqrt(2) = 89.8
    assert order(4, 5791, torch.float32) == f32[4095][4] and order(4, 5793, torch.float32) == ()
    assert order(362, 512, torch.bfloat16) == b16[512][256] and order(363, 512, torch.bfloat16) == ()
    # A small module on the stand-in ops, its built-in choice cuDNN: torch's path, counted so.
    ref, ours = pair(8, 16)
    x, hx = inputs(ours, 3, 5, False)
    y_r = ref(x)[0]
    assert torch.equal(ours(x)[0], y_r)
    assert dict(counts[1]) == {"built-in choice: cuDNN": 1}
