"""Multi-head attention's part of `hfnn tune`, of HFNN_DISPATCH_DB and of the module swap (the
family's C++ description is kernels/multihead_attention/multihead_attention_family.cpp; the op is
src/multi_head_attention_op.cpp).

measure(): a request {"key": "B=..,L=..,S=..,E=..,H=..,batch_first=1,causal=0,inputs=self,bias=1,
dropout=0[,key_padding_mask=bool|float][,attn_mask=bool2d|float2d|bool3d|float3d]
[,weights=mean|per_head][,kdim=K,vdim=V]", "dtype", "passes": ["train"], "seconds"} answered with
torch's module path (nn.MultiheadAttention with the key's masks, need_weights as the key says, as a
training loop calls it) and hfnn's op with every core that takes the key, each timed as forward +
backward per call. The one pass is "train": a core's backward needs its own forward's state, so
forward and backward win together.
- samples_us, what the tuner judges: per-call wall time of back-to-back training calls, CPU launch
  cost included, as a training loop sees it (for launch-bound shapes torch's Python decides); every
  candidate checked first, then their samples taken in turn (hfnn/_measure.py's
  wall_samples_in_turn: a host's CPU speed drifts);
  (No GPU time under graph replay yet: capturing forward + backward of torch's module failed on
  the H200, and a failed capture leaves the CUDA generator unusable for the rest of the process.)
The error is max|out - ref| / max|ref| over the output, the weights (weights keys) and every
gradient (query, and key and value where they are other tensors; every parameter), on fresh inputs
with dropout 0, against torch's module in float64 (the weights' gradient reaches it too). Keys with
dropout=1 are timed with p = 0.1. The masks are drawn per key kind: a padding mask pads the end of
each sequence (random lengths, at least one key kept and, where S > 1, one padded), an attention mask hides about a quarter of the
scores at random (never a whole row: the first key stays); float masks add random values there and
-inf where a bool one masks out.
With `plant`, "planted_wrong" (hfnn's op without the key's masks and causal hint; where it has none, with
the causal hint, or with weights a causal mask) must be rejected by the gate.

install_dispatch(): under HFNN_DISPATCH_DB, when the table has attention keys, wraps
nn.MultiheadAttention.forward so each call asks hfnn::multi_head_attention_dispatch (C++: the
checks, the packed key's lookup and the counting); None back means torch's own forward runs.
"""
from __future__ import annotations

import math
import re
import time

from .._measure import first_line, rel_error, train_records, tunable_dtype
from ._route import replace_forward, table_has_keys

OP = "multihead_attention"

_KEY = re.compile(r"B=(\d+),L=(\d+),S=(\d+),E=(\d+),H=(\d+),batch_first=([01]),causal=([01]),"
                  r"inputs=(self|kv|qkv),bias=([01]),dropout=([01])(?:,key_padding_mask=(bool|float))?"
                  r"(?:,attn_mask=(bool|float)([23])d)?(?:,weights=(mean|per_head))?(?:,kdim=(\d+),vdim=(\d+))?")
# The dropout probability keys with dropout=1 are timed with (the key records only that there is one:
# the cores' cost does not depend on it).
TIMING_DROPOUT = 0.1

# torch's own nn.MultiheadAttention.forward, once install_dispatch() replaced it (hfnn.nn's module
# falls back to it, not to the wrapper); None while it is not replaced.
torch_forward = None


_MISMATCHED = "Support for mismatched key_padding_mask and attn_mask is deprecated. Use same type for both instead."


def warn_mismatched_masks(query, key_padding_mask, attn_mask) -> None:
    """torch's deprecation warnings for a call hfnn's op ran, where torch's module would give them:
    a padding mask whose dtype is not the attention mask's (nn.MultiheadAttention.forward's check),
    and again where they differ once bool masks are the query's dtype (F.multi_head_attention_forward's)."""
    if key_padding_mask is None or attn_mask is None:
        return
    import warnings

    import torch

    if key_padding_mask.dtype != attn_mask.dtype:
        warnings.warn(_MISMATCHED, stacklevel=3)

    def canonical(m):
        return query.dtype if m.dtype == torch.bool else m.dtype

    if canonical(key_padding_mask) != canonical(attn_mask):
        warnings.warn(_MISMATCHED, stacklevel=3)


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
            "bias": m.group(9) == "1", "dropout": m.group(10) == "1",
            "padding": m.group(11),  # None, "bool" or "float"
            "mask": (m.group(12), int(m.group(13))) if m.group(12) else None,  # ("bool" or "float", 2 or 3)
            "weights": m.group(14),  # None, "mean" or "per_head"
            "kdim": int(m.group(15) or 0), "vdim": int(m.group(16) or 0)}


def _inputs(torch, k: dict, dtype, gen, device="cuda"):
    """query, key, value of the key's shapes, drawn like activations; one tensor where the key says
    they are one (self-attention), key and value one for "kv"."""
    def draw(length, width):
        shape = (k["batch"], length, width) if k["batch_first"] else (length, k["batch"], width)
        return torch.randn(*shape, device=device, generator=gen).to(dtype).requires_grad_()

    q = draw(k["q_len"], k["embed"])
    if k["inputs"] == "self":
        return q, q, q
    kv = draw(k["kv_len"], k["kdim"] or k["embed"])
    return (q, kv, kv) if k["inputs"] == "kv" else (q, kv, draw(k["kv_len"], k["vdim"] or k["embed"]))


def masks(torch, k: dict, dtype, gen, device="cuda"):
    """(key_padding_mask, attn_mask) of the key's kinds (None where it has none), in the query's
    dtype where float: no row is fully masked (the first key always stays)."""
    b, q_len, kv_len, heads = k["batch"], k["q_len"], k["kv_len"], k["heads"]

    def of_kind(hidden, kind):
        if kind == "bool":
            return hidden
        values = 0.5 * torch.randn(hidden.shape, device=device, generator=gen)
        return values.masked_fill(hidden, float("-inf")).to(dtype)

    padding = None
    if k["padding"]:
        lengths = torch.randint(1, max(kv_len, 2), (b, 1), device=device, generator=gen)  # >= 1 key padded
        padding = of_kind(torch.arange(kv_len, device=device).expand(b, kv_len) >= lengths, k["padding"])
    attn = None
    if k["mask"]:
        kind, dims = k["mask"]
        shape = (q_len, kv_len) if dims == 2 else (b * heads, q_len, kv_len)
        hidden = torch.rand(shape, device=device, generator=gen) < 0.25
        hidden[..., 0] = False
        attn = of_kind(hidden, kind)
    if k["causal"]:  # the causal hint comes with its mask, as torch's module requires (and then drops)
        attn = torch.full((q_len, kv_len), float("-inf"), device=device, dtype=dtype).triu(1)
    return padding, attn


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
    return list(m.parameters())


def measure(torch, hfnn, req: dict, l2_bytes: int, plant: bool, device: str = "cuda") -> dict:
    """One tune request's answer: every candidate's timing samples and error, for the "train" pass.
    The tune worker measures on the GPU; tests/python/test_attention_masks.py runs it on the CPU
    (device="cpu", with a no-op torch.cuda.synchronize)."""
    import copy

    from torch import nn

    k = parse_key(req["key"])
    dtype = tunable_dtype(torch, req["dtype"])
    seconds = float(req.get("seconds", 2.0))
    started = time.perf_counter()
    p = TIMING_DROPOUT if k["dropout"] else 0.0
    heads, bf, causal = k["heads"], k["batch_first"], k["causal"]
    weights = k["weights"]
    torch.manual_seed(0)
    gen = torch.Generator(device=device).manual_seed(0)
    module = nn.MultiheadAttention(k["embed"], heads, dropout=p, bias=k["bias"], batch_first=bf, device=device,
                                   dtype=dtype, kdim=k["kdim"] or None, vdim=k["vdim"] or None).train()
    separate = not module._qkv_same_embed_dim
    padding, attn = masks(torch, k, dtype, gen, device)
    esize = torch.empty(0, dtype=dtype).element_size()
    tokens_q, tokens_kv = k["batch"] * k["q_len"], k["batch"] * k["kv_len"]
    set_bytes = max(1, (2 * tokens_q + (0 if k["inputs"] == "self" else 2 * tokens_kv)) * k["embed"] * esize)
    nsets = max(1, min(8, math.ceil(3 * l2_bytes / set_bytes)))
    sets = []
    for _ in range(nsets):
        q, kk, v = _inputs(torch, k, dtype, gen, device)
        sets.append((q, kk, v, torch.randn_like(q)))

    def torch_call(q, kk, v, dropout):
        module.dropout = dropout
        out, w = module(q, kk, v, key_padding_mask=padding, need_weights=weights is not None, attn_mask=attn,
                        average_attn_weights=weights == "mean", is_causal=causal)
        return out, w

    def op_call(core, kpm=padding, mask=attn, is_causal=causal):
        def call(q, kk, v, dropout):
            args = (q, kk, v, heads, module.in_proj_weight, module.in_proj_bias, module.out_proj.weight,
                    module.out_proj.bias, bf, is_causal, dropout, core, kpm, mask, module.q_proj_weight,
                    module.k_proj_weight, module.v_proj_weight)
            if weights is not None:
                return torch.ops.hfnn.multi_head_attention_with_weights(*args, weights == "mean")
            return torch.ops.hfnn.multi_head_attention(*args), None
        return call

    fns = {"torch": torch_call}
    q0, k0, v0, _ = sets[0]
    for core in hfnn.build_info().get("variants", {}).get(OP, {}).get("train", []):
        if torch.ops.hfnn.multi_head_attention_supports(q0, k0, v0, heads, bf, causal, p, core, padding, attn,
                                                        weights is not None, separate):
            fns[core] = op_call(core)
    if plant and k["kv_len"] > 1:
        if padding is not None or (attn is not None and not causal) or causal:
            fns["planted_wrong"] = op_call("", kpm=None, mask=None, is_causal=False)  # the masks (or hint) dropped
        elif weights is not None:  # a causal mask where there is none
            fns["planted_wrong"] = op_call("", mask=torch.ones(k["q_len"], k["kv_len"], dtype=torch.bool,
                                                               device=device).triu(1))
        else:
            fns["planted_wrong"] = op_call("", is_causal=True)  # the causal hint where there is none

    # Correctness: fresh inputs, dropout 0, against torch's module in float64.
    qc, kc, vc = _inputs(torch, k, dtype, gen, device)
    dyc = torch.randn_like(qc)
    ref_module = copy.deepcopy(module).double()
    q64, k64, v64 = _leaves((qc, kc, vc), torch.float64)
    ref_module.dropout = 0.0

    def double(m):
        return m if m is None or m.dtype == torch.bool else m.double()

    y_ref, w_ref = ref_module(q64, k64, v64, key_padding_mask=double(padding), need_weights=weights is not None,
                              attn_mask=double(attn), average_attn_weights=weights == "mean", is_causal=causal)
    dwc = None if w_ref is None else torch.randn(w_ref.shape, device=device, generator=gen).to(dtype)
    torch.autograd.backward([y_ref] + ([w_ref] if dwc is not None else []),
                            [dyc.double()] + ([dwc.double()] if dwc is not None else []))
    refs = ([y_ref.detach()] + ([w_ref.detach()] if dwc is not None else []) +
            [t.grad for t in _distinct(q64, k64, v64)] + [t.grad for t in _params(ref_module)])

    # Every candidate checked first, then all timed, their samples in turn (wall_samples_in_turn).
    names, errors, calls, failed = list(fns), {}, {}, {}
    for name in names:
        fn = fns[name]
        try:
            for prm in _params(module):
                prm.grad = None
            q, kk, v = _leaves((qc, kc, vc))
            y, w = fn(q, kk, v, 0.0)
            torch.autograd.backward([y] + ([w] if dwc is not None else []), [dyc] + ([dwc] if dwc is not None else []))
            got = ([y.detach()] + ([w.detach()] if dwc is not None else []) +
                   [t.grad for t in _distinct(q, kk, v)] + [t.grad for t in _params(module)])
            errors[name] = max(rel_error(g, r) for g, r in zip(got, refs))

            def train_call(j, fn=fn):
                qs, ks, vs, dy = sets[j % nsets]
                fn(qs, ks, vs, p)[0].backward(dy)

            calls[name] = train_call
        except Exception as e:
            failed[name] = first_line(e)  # not e: its traceback would keep this frame's tensors
    left = seconds - (time.perf_counter() - started)
    out = train_records(torch, names, errors, calls, failed, 0.35 * left)
    return {"key": req["key"], "dtype": req["dtype"], "op": OP, "candidates": out,
            "seconds": round(time.perf_counter() - started, 3)}


def install_dispatch(stats: dict) -> bool:
    """Under HFNN_DISPATCH_DB: routes nn.MultiheadAttention through the table when it has attention
    keys (any GPU); returns whether it did. Calls hfnn's op does not take, keys without a winner and
    keys torch won run torch's own forward, as without hfnn."""
    global torch_forward
    if not table_has_keys(stats, OP) or torch_forward is not None:
        return False
    import torch
    from torch import nn

    route = torch.ops.hfnn.multi_head_attention_dispatch.default
    is_compiling = torch.compiler.is_compiling

    def make(original):
        def forward(self, query, key, value, key_padding_mask=None, need_weights=True, attn_mask=None,
                    average_attn_weights=True, is_causal=False):
            if not is_compiling():  # torch.compile traces torch's module (its FX graph has no table)
                out, weights, _ = route(query, key, value, self.num_heads, self.in_proj_weight, self.in_proj_bias,
                                        self.out_proj.weight, self.out_proj.bias, self.batch_first,
                                        bool(is_causal), self.dropout if self.training else 0.0,
                                        bool(need_weights), key_padding_mask, attn_mask,
                                        self.bias_k is not None or self.add_zero_attn, False,
                                        bool(average_attn_weights), self.q_proj_weight, self.k_proj_weight,
                                        self.v_proj_weight)
                if out is not None:
                    warn_mismatched_masks(query, key_padding_mask, attn_mask)
                    return out, weights
            return original(self, query, key, value, key_padding_mask=key_padding_mask, need_weights=need_weights,
                            attn_mask=attn_mask, average_attn_weights=average_attn_weights, is_causal=is_causal)
        return forward

    torch_forward = replace_forward(nn.MultiheadAttention, make)
    return True
