"""Multi-head attention's part of `hfnn tune`, of HFNN_DISPATCH_DB and of the module swap (the
family's C++ description is kernels/multihead_attention/multihead_attention_family.cpp; the op is
src/multi_head_attention_op.cpp).

measure(): a request {"key": "B=..,L=..,S=..,E=..,H=..,batch_first=1,causal=0,inputs=self,bias=1,
dropout=0", "dtype", "passes": ["train"], "seconds"} answered with torch's module path
(nn.MultiheadAttention, need_weights=False, as a training loop calls it) and hfnn's op with every
core that takes the key, each timed as forward + backward per call. The one pass is "train": a
core's backward needs its own forward's state, so forward and backward win together.
- samples_us, what the tuner judges: per-call wall time of back-to-back training calls, CPU launch
  cost included, as a training loop sees it (for launch-bound shapes torch's Python decides);
  (No GPU time under graph replay yet: capturing forward + backward of torch's module failed on
  the H200, and a failed capture leaves the CUDA generator unusable for the rest of the process.)
The error is max|out - ref| / max|ref| over the output and every gradient (query, and key and value
where they are other tensors; in_proj weight and bias; out_proj weight and bias), on fresh inputs
with dropout 0, against torch's module in float64. Keys with dropout=1 are timed with p = 0.1.
With `plant`, "planted_wrong" (hfnn's op with the causal hint flipped: faster where it drops the
mask, wrong wherever a query sees more than one key) must be rejected by the gate.

install_dispatch(): under HFNN_DISPATCH_DB, when the table has attention keys, wraps
nn.MultiheadAttention.forward so each call asks hfnn::multi_head_attention_dispatch (C++: the
checks, the packed key's lookup and the counting); None back means torch's own forward runs.
"""
from __future__ import annotations

import math
import re
import time

from .._measure import failed_candidate, rel_error, tunable_dtype, wall_samples

OP = "multihead_attention"

_KEY = re.compile(r"B=(\d+),L=(\d+),S=(\d+),E=(\d+),H=(\d+),batch_first=([01]),causal=([01]),"
                  r"inputs=(self|kv|qkv),bias=([01]),dropout=([01])")
# The dropout probability keys with dropout=1 are timed with (the key records only that there is one:
# the cores' cost does not depend on it).
TIMING_DROPOUT = 0.1

# torch's own nn.MultiheadAttention.forward, once install_dispatch() replaced it (hfnn.nn's module
# falls back to it, not to the wrapper); None while it is not replaced.
torch_forward = None


def swaps() -> dict:
    """torch module class -> hfnn module class, for to_hfnn and to_torch."""
    from torch import nn

    from .. import nn as hfnn_nn

    return {nn.MultiheadAttention: hfnn_nn.MultiheadAttention}


def parse_key(key: str) -> dict:
    m = _KEY.fullmatch(key)
    if not m:
        raise ValueError(f"not a MultiheadAttention key: {key}")
    b, q_len, kv_len, embed, heads = (int(m.group(i)) for i in range(1, 6))
    return {"batch": b, "q_len": q_len, "kv_len": kv_len, "embed": embed, "heads": heads,
            "batch_first": m.group(6) == "1", "causal": m.group(7) == "1", "inputs": m.group(8),
            "bias": m.group(9) == "1", "dropout": m.group(10) == "1"}


def _inputs(torch, k: dict, dtype, gen):
    """query, key, value of the key's shapes, drawn like activations; one tensor where the key says
    they are one (self-attention), key and value one for "kv"."""
    def shape(length):
        return (k["batch"], length, k["embed"]) if k["batch_first"] else (length, k["batch"], k["embed"])

    def draw(length):
        return torch.randn(*shape(length), device="cuda", generator=gen).to(dtype).requires_grad_()

    q = draw(k["q_len"])
    if k["inputs"] == "self":
        return q, q, q
    kv = draw(k["kv_len"])
    return (q, kv, kv) if k["inputs"] == "kv" else (q, kv, draw(k["kv_len"]))


def _distinct(q, kk, v):
    out = [q]
    for t in (kk, v):
        if all(t is not o for o in out):
            out.append(t)
    return out


def _leaves(tensors, dtype=None):
    """Fresh leaf copies (in `dtype`) keeping which of them are one tensor."""
    copies = {}
    out = []
    for t in tensors:
        if id(t) not in copies:
            copies[id(t)] = (t.detach().to(dtype) if dtype else t.detach().clone()).requires_grad_()
        out.append(copies[id(t)])
    return out


def _params(m):
    return [p for p in (m.in_proj_weight, m.in_proj_bias, m.out_proj.weight, m.out_proj.bias) if p is not None]


def measure(torch, hfnn, req: dict, l2_bytes: int, plant: bool) -> dict:
    """One tune request's answer: every candidate's timing samples and error, for the "train" pass."""
    import copy

    from torch import nn

    k = parse_key(req["key"])
    dtype = tunable_dtype(torch, req["dtype"])
    seconds = float(req.get("seconds", 2.0))
    started = time.perf_counter()
    p = TIMING_DROPOUT if k["dropout"] else 0.0
    heads, bf, causal = k["heads"], k["batch_first"], k["causal"]
    torch.manual_seed(0)
    gen = torch.Generator(device="cuda").manual_seed(0)
    module = nn.MultiheadAttention(k["embed"], heads, dropout=p, bias=k["bias"], batch_first=bf, device="cuda",
                                   dtype=dtype).train()
    # The causal hint comes with its mask, as torch's module requires (it then drops the mask for SDPA's
    # is_causal, as hfnn's op does).
    mask = (torch.full((k["q_len"], k["kv_len"]), float("-inf"), device="cuda").triu(1) if causal else None)
    esize = torch.empty(0, dtype=dtype).element_size()
    tokens_q, tokens_kv = k["batch"] * k["q_len"], k["batch"] * k["kv_len"]
    set_bytes = max(1, (2 * tokens_q + (0 if k["inputs"] == "self" else 2 * tokens_kv)) * k["embed"] * esize)
    nsets = max(1, min(8, math.ceil(3 * l2_bytes / set_bytes)))
    sets = []
    for _ in range(nsets):
        q, kk, v = _inputs(torch, k, dtype, gen)
        sets.append((q, kk, v, torch.randn_like(q)))

    def torch_call(q, kk, v, dropout):
        module.dropout = dropout
        return module(q, kk, v, need_weights=False, attn_mask=mask, is_causal=causal)[0]

    def op_call(core, flip=False):
        def call(q, kk, v, dropout):
            return torch.ops.hfnn.multi_head_attention(q, kk, v, heads, module.in_proj_weight, module.in_proj_bias,
                                                       module.out_proj.weight, module.out_proj.bias, bf,
                                                       causal != flip, dropout, core)
        return call

    fns = {"torch": torch_call}
    q0, k0, v0, _ = sets[0]
    for core in hfnn.build_info().get("variants", {}).get(OP, {}).get("train", []):
        if torch.ops.hfnn.multi_head_attention_supports(q0, k0, v0, heads, bf, causal, p, core):
            fns[core] = op_call(core)
    if plant and k["kv_len"] > 1:
        fns["planted_wrong"] = op_call("", flip=True)

    # Correctness: fresh inputs, dropout 0, against torch's module in float64.
    qc, kc, vc = _inputs(torch, k, dtype, gen)
    dyc = torch.randn_like(qc)
    ref_module = copy.deepcopy(module).double()
    q64, k64, v64 = _leaves((qc, kc, vc), torch.float64)
    ref_module.dropout = 0.0
    y_ref = ref_module(q64, k64, v64, need_weights=False, attn_mask=mask, is_causal=causal)[0]
    y_ref.backward(dyc.double())
    refs = [y_ref.detach()] + [t.grad for t in _distinct(q64, k64, v64)] + [t.grad for t in _params(ref_module)]

    out = []
    names = list(fns)
    for i, name in enumerate(names):
        fn = fns[name]
        left = seconds - (time.perf_counter() - started)
        budget = max(0.02, 0.35 * left / (len(names) - i))
        try:
            for prm in _params(module):
                prm.grad = None
            q, kk, v = _leaves((qc, kc, vc))
            y = fn(q, kk, v, 0.0)
            y.backward(dyc)
            got = [y.detach()] + [t.grad for t in _distinct(q, kk, v)] + [t.grad for t in _params(module)]
            err = max(rel_error(g, r) for g, r in zip(got, refs))

            def train_call(j, fn=fn):
                qs, ks, vs, dy = sets[j % nsets]
                fn(qs, ks, vs, p).backward(dy)

            samples = wall_samples(torch, train_call, budget)
            cand = {"pass": "train", "name": name, "samples_us": [round(s, 3) for s in samples],
                    "max_error": err if math.isfinite(err) else None}
            out.append(cand)
        except Exception as e:
            out.append(failed_candidate(torch, "train", name, e))
    module.dropout = p
    return {"key": req["key"], "dtype": req["dtype"], "op": OP, "candidates": out,
            "seconds": round(time.perf_counter() - started, 3)}


def install_dispatch(stats: dict) -> bool:
    """Under HFNN_DISPATCH_DB: routes nn.MultiheadAttention through the table when it has attention
    keys (any GPU); returns whether it did. Calls hfnn's op does not take, keys without a winner and
    keys torch won run torch's own forward, as without hfnn."""
    global torch_forward
    if not stats.get("ops", {}).get(OP, {}).get("keys") or torch_forward is not None:
        return False
    import torch
    from torch import nn

    original = nn.MultiheadAttention.forward
    route = torch.ops.hfnn.multi_head_attention_dispatch.default
    is_compiling = torch.compiler.is_compiling

    def forward(self, query, key, value, key_padding_mask=None, need_weights=True, attn_mask=None,
                average_attn_weights=True, is_causal=False):
        if not is_compiling():  # torch.compile traces torch's module (its FX graph has no table)
            out = route(query, key, value, self.num_heads, self.in_proj_weight, self.in_proj_bias,
                        self.out_proj.weight, self.out_proj.bias, self.batch_first, bool(is_causal),
                        self.dropout if self.training else 0.0, bool(need_weights), key_padding_mask, attn_mask,
                        self.bias_k is not None or self.add_zero_attn, False)
            if out is not None:
                return out, None
        return original(self, query, key, value, key_padding_mask=key_padding_mask, need_weights=need_weights,
                        attn_mask=attn_mask, average_attn_weights=average_attn_weights, is_causal=is_causal)

    forward.__wrapped__ = original
    nn.MultiheadAttention.forward = forward
    torch_forward = original
    return True
