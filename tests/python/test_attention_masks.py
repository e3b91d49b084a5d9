"""hfnn.nn.MultiheadAttention with masks, need_weights=True and kdim/vdim against torch's module
(issue 11's coverage): key_padding_mask and attn_mask (bool and float, 2-D [L, S] and 3-D
[B * heads, L, S], each alone, both, and with the is_causal hint), need_weights=True with
average_attn_weights both ways, self- and cross-attention with kdim/vdim, batch_first both ways,
bias on and off, dropout in training, and nn.TransformerEncoderLayer / DecoderLayer, which call it.

On the CPU in float64: outputs, weights and every gradient equal torch's module to rounding over a
dense set of shapes (L, S in 1..64, heads 1-4, batch 1-3), fully masked rows included (zero through
SDPA's cores, NaN with need_weights=True, as in torch); torch's checks, messages and warnings for
bad masks; what still runs torch's module, with its reason. On the GPU: every core that says it
takes a masked call (supports() true exactly where the op runs), fp32/bf16/fp16, against float64.
"""
import itertools
import random
import warnings

import pytest
import torch
from torch import nn

import hfnn
from conftest import requires_gpu
from hfnn._families import multihead_attention as mha_family

CORES = ["", "sdpa_flash", "sdpa_efficient", "sdpa_cudnn", "sdpa_math", "hfnn_short", "hfnn_mid"]


@pytest.fixture(autouse=True)
def one_cpu_thread():
    """These shapes are tiny: one intra-op thread runs them fastest (two threads on a busy 2-core
    runner spent 1.6 ms a linear in their barriers, 12 us on one)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
LENGTHS = [1, 2, 3, 7, 8, 16, 17, 64]
PADDING_KINDS = [None, "bool", "float"]
MASK_KINDS = [None, "bool2d", "float2d", "bool3d", "float3d"]
WEIGHTS = [None, "mean", "per_head"]
# Every combination torch's module takes: the causal hint comes with an attention mask.
# Every (L, S) of LENGTHS in a fixed shuffled order: each half ([0::2], [1::2]) has every L, every S
# and some L = S (self-attention).
LENGTH_PAIRS = list(itertools.product(LENGTHS, LENGTHS))
random.Random(11).shuffle(LENGTH_PAIRS)
MASK_CASES = [(p, m, c, w) for p, m, c, w in itertools.product(PADDING_KINDS, MASK_KINDS, [False, True], WEIGHTS)
              if m is not None or not c]


def case_id(case):
    p, m, c, w = case
    return f"pad={p}-mask={m}-{'causal' if c else 'nocausal'}-weights={w}"


def make_masks(padding, mask, batch, heads, q_len, kv_len, dtype=torch.float64, device="cpu", gen=None,
               density=0.3, causal=False):
    """(key_padding_mask, attn_mask) of the kinds asked for (None for none): bool True where masked
    out (about `density` of the positions, so short key lengths have fully masked rows), float with
    random values and -inf there. With `causal` and a 2-D mask kind, the mask is the causal one."""
    def of_kind(hidden, kind):
        if kind.startswith("bool"):
            return hidden
        values = 0.5 * torch.randn(hidden.shape, generator=gen, device=device, dtype=torch.float64)
        return values.masked_fill(hidden, float("-inf")).to(dtype)

    kpm = am = None
    if padding:
        kpm = of_kind(torch.rand(batch, kv_len, generator=gen, device=device) < density, padding)
    if mask:
        shape = (q_len, kv_len) if mask.endswith("2d") else (batch * heads, q_len, kv_len)
        hidden = torch.rand(shape, generator=gen, device=device) < density
        if causal:
            hidden = torch.ones(shape, dtype=torch.bool, device=device).triu(1)
        am = of_kind(hidden, mask)
    return kpm, am


def pair(embed, heads, batch_first, bias=True, dtype=torch.float64, device="cpu", dropout=0.0, kdim=None,
         vdim=None, seed=0):
    torch.manual_seed(seed)
    ref = nn.MultiheadAttention(embed, heads, batch_first=batch_first, bias=bias, dtype=dtype, device=device,
                                dropout=dropout, kdim=kdim, vdim=vdim)
    ours = hfnn.nn.MultiheadAttention(embed, heads, batch_first=batch_first, bias=bias, dtype=dtype, device=device,
                                      dropout=dropout, kdim=kdim, vdim=vdim)
    ours.load_state_dict(ref.state_dict())
    return ref, ours


def inputs(mode, batch, q_len, kv_len, embed, batch_first, dtype=torch.float64, device="cpu", kdim=None, vdim=None):
    def t(n, width):
        shape = (batch, n, width) if batch_first else (n, batch, width)
        return torch.randn(shape, dtype=dtype, device=device, requires_grad=True)

    q = t(q_len, embed)
    if mode == "self":
        return q, q, q
    if mode == "kv":  # encoder-decoder: key is value
        kv = t(kv_len, kdim or embed)
        return q, kv, kv
    return q, t(kv_len, kdim or embed), t(kv_len, vdim or embed)


def forward_backward(module, q, k, v, grad_out, grad_weights, **kw):
    """(out, weights, gradients of the distinct inputs and every parameter) of one call."""
    out, weights = module(q, k, v, **kw)
    loss = (out * grad_out).sum()
    if weights is not None and grad_weights is not None:
        loss = loss + (weights * grad_weights).sum()
    leaves = list(dict.fromkeys([q, k, v])) + list(module.parameters())
    return out, weights, torch.autograd.grad(loss, leaves, allow_unused=True)


def assert_same(got, want, tol=1e-10):
    if want is None:
        assert got is None
        return
    assert got is not None and got.shape == want.shape and got.dtype == want.dtype, (got, want)
    torch.testing.assert_close(got, want, rtol=tol, atol=tol, equal_nan=True)


def check_call(ref, ours, q, k, v, tol=1e-10, **kw):
    """ours(q, k, v, **kw) runs hfnn's op, and its output, weights and gradients equal ref's."""
    with torch.no_grad():
        out, weights = ref(q, k, v, **kw)
    grad_out = torch.randn_like(out)
    grad_weights = None if weights is None else torch.randn_like(weights)
    want = forward_backward(ref, q, k, v, grad_out, grad_weights, **kw)
    before = hfnn.nn.attention_calls["hfnn"]
    got = forward_backward(ours, q, k, v, grad_out, grad_weights, **kw)
    assert hfnn.nn.attention_calls["hfnn"] == before + 1, dict(hfnn.nn.attention_fallbacks)
    assert_same(got[0], want[0], tol)
    assert_same(got[1], want[1], tol)
    assert len(got[2]) == len(want[2])
    for g, w in zip(got[2], want[2]):
        assert_same(g, w, 10 * tol)


# ---- CPU, float64 -------------------------------------------------------------------------------

@pytest.mark.parametrize("case", MASK_CASES, ids=case_id)
def test_cpu_every_mask_kind_over_lengths_matches_torch(case):
    """One mask combination over half the (L, S) pairs of LENGTHS (the other half with the next
    combination: every pair meets about 40 combinations; each half has every L, every S, and L = S),
    the other settings in
    turn: heads 1, 2, 4, batch 1-3, batch_first both ways, bias on and off, self- / encoder-decoder /
    cross-attention."""
    padding, mask, causal, weights = case
    parity = MASK_CASES.index(case) % 2
    gen = torch.Generator().manual_seed(MASK_CASES.index(case))
    for i, (q_len, kv_len) in enumerate(LENGTH_PAIRS[parity::2]):
        heads, batch = (1, 2, 4)[i % 3], (1, 2, 3)[(i // 3) % 3]
        batch_first, bias = i % 2 == 0, (i // 2) % 2 == 0
        modes = ("self", "kv", "cross") if q_len == kv_len else ("kv", "cross")
        mode = modes[(i // 4) % len(modes)]
        embed = heads * (2 + i % 3)
        ref, ours = pair(embed, heads, batch_first, bias, seed=i)
        q, k, v = inputs(mode, batch, q_len, kv_len, embed, batch_first)
        kpm, am = make_masks(padding, mask, batch, heads, q_len, kv_len, gen=gen,
                             causal=causal and mask is not None and mask.endswith("2d") and q_len == kv_len)
        check_call(ref, ours, q, k, v, key_padding_mask=kpm, attn_mask=am, is_causal=causal,
                   need_weights=weights is not None, average_attn_weights=weights == "mean")


@pytest.mark.parametrize("weights", [None, "mean"])
@pytest.mark.parametrize("mask", ["bool", "float"])
def test_cpu_fully_masked_rows_are_what_torchs_module_gives(mask, weights):
    """A sequence whose keys are all padding and a query row whose scores are all masked: zero
    through SDPA's cores (need_weights=False), NaN through the weights' softmax, as in torch."""
    ref, ours = pair(8, 2, True)
    q, k, v = inputs("cross", 2, 3, 4, 8, True)
    kpm = torch.zeros(2, 4, dtype=torch.bool)
    kpm[1] = True
    am = torch.zeros(3, 4, dtype=torch.bool)
    am[2] = True
    if mask == "float":
        kpm = torch.zeros(2, 4, dtype=torch.float64).masked_fill(kpm, float("-inf"))
        am = torch.zeros(3, 4, dtype=torch.float64).masked_fill(am, float("-inf"))
    kw = dict(key_padding_mask=kpm, attn_mask=am, need_weights=weights is not None)
    out = ours(q, k, v, **kw)[0]
    assert bool(out[1].isnan().all()) == (weights is not None) and bool(out[0, 2].isnan().all()) == (weights is not None)
    check_call(ref, ours, q, k, v, **kw)


@pytest.mark.parametrize("weights", [None, "mean", "per_head"])
@pytest.mark.parametrize("masks", ["none", "padding", "both"])
def test_cpu_dropout_in_training_draws_what_torch_draws(masks, weights):
    """In training with dropout the op draws the same dropout mask from the same seed as torch's
    module (the same ops in the same order), so outputs, weights and gradients are equal."""
    ref, ours = pair(12, 3, False, dropout=0.3)
    ref.train(), ours.train()
    q, k, v = inputs("cross", 2, 5, 6, 12, False)
    kpm, am = make_masks(None if masks == "none" else "bool", "float3d" if masks == "both" else None, 2, 3, 5, 6)
    kw = dict(key_padding_mask=kpm, attn_mask=am, need_weights=weights is not None,
              average_attn_weights=weights == "mean")
    torch.manual_seed(5)
    out_ref, w_ref = ref(q, k, v, **kw)
    grads_ref = torch.autograd.grad(out_ref.sum() + (0 if w_ref is None else w_ref.sum()), [q, k, v])
    torch.manual_seed(5)
    out, w = ours(q, k, v, **kw)
    grads = torch.autograd.grad(out.sum() + (0 if w is None else w.sum()), [q, k, v])
    assert_same(out, out_ref)
    assert_same(w, w_ref)
    for g, g_ref in zip(grads, grads_ref):
        assert_same(g, g_ref)
    torch.manual_seed(6)
    assert not torch.equal(ours(q, k, v, **kw)[0], out), "dropout drew the same mask from another seed"


@pytest.mark.parametrize("weights", [None, "mean", "per_head"])
@pytest.mark.parametrize("mode,kdim,vdim", [("kv", 6, 6), ("cross", 6, 10), ("cross", 12, 3), ("cross", 1, 1)])
@pytest.mark.parametrize("batch_first,bias", [(True, True), (False, False)])
def test_cpu_kdim_vdim(mode, kdim, vdim, weights, batch_first, bias):
    """Key and value of other widths (the module's q/k/v_proj_weight): one GEMM per input, each
    core, with and without masks."""
    ref, ours = pair(8, 2, batch_first, bias, kdim=kdim, vdim=vdim)
    assert ours.in_proj_weight is None
    for padding, mask in [(None, None), ("bool", "float2d"), ("float", "bool3d")]:
        q, k, v = inputs(mode, 3, 4, 5, 8, batch_first, kdim=kdim, vdim=vdim)
        kpm, am = make_masks(padding, mask, 3, 2, 4, 5, density=0.2)
        check_call(ref, ours, q, k, v, key_padding_mask=kpm, attn_mask=am, need_weights=weights is not None,
                   average_attn_weights=weights == "mean")


@pytest.mark.parametrize("core", ["", "sdpa_flash", "sdpa_math"])
@pytest.mark.parametrize("padding,mask", [("bool", None), (None, "float2d"), ("float", "bool3d"), ("bool", "bool2d")])
def test_cpu_each_core_of_the_op_with_masks(core, padding, mask):
    """The op itself with each CPU core: torch's CPU flash kernel (the op's one autograd node, the
    mask saved for its backward) and the math composite; torch's pick (flash on the CPU)."""
    embed, heads, batch = 12, 3, 2
    ref, _ = pair(embed, heads, True)
    for q_len, kv_len in [(5, 5), (4, 9), (9, 2)]:
        q, k, v = inputs("self" if q_len == kv_len else "cross", batch, q_len, kv_len, embed, True)
        kpm, am = make_masks(padding, mask, batch, heads, q_len, kv_len)
        assert torch.ops.hfnn.multi_head_attention_supports(q, k, v, heads, True, False, 0.0, core, kpm, am)
        out = torch.ops.hfnn.multi_head_attention(q, k, v, heads, ref.in_proj_weight, ref.in_proj_bias,
                                                  ref.out_proj.weight, ref.out_proj.bias, True, False, 0.0, core, kpm, am)
        assert ("MhaFunction" in out.grad_fn.name()) == (core != "sdpa_math"), out.grad_fn.name()
        grad = torch.randn_like(out)
        leaves = list(dict.fromkeys([q, k, v])) + list(ref.parameters())
        grads = torch.autograd.grad(out, leaves, grad)
        out_ref = ref(q, k, v, key_padding_mask=kpm, attn_mask=am, need_weights=False)[0]
        grads_ref = torch.autograd.grad(out_ref, leaves, grad)
        assert_same(out, out_ref)
        for g, g_ref in zip(grads, grads_ref):
            assert_same(g, g_ref)


def test_cpu_the_weights_op_returns_torchs_weights():
    ref, _ = pair(8, 2, False)
    q, k, v = inputs("kv", 3, 4, 6, 8, False)
    kpm, am = make_masks("bool", "float2d", 3, 2, 4, 6, density=0.2)
    args = (q, k, v, 2, ref.in_proj_weight, ref.in_proj_bias, ref.out_proj.weight, ref.out_proj.bias, False, False,
            0.0)
    for core in ["", "sdpa_math"]:
        for average in (True, False):
            out, w = torch.ops.hfnn.multi_head_attention_with_weights(*args, core, kpm, am, None, None, None, average)
            out_ref, w_ref = ref(q, k, v, key_padding_mask=kpm, attn_mask=am, average_attn_weights=average)
            assert_same(out, out_ref)
            assert_same(w, w_ref)
    for core in ["sdpa_flash", "sdpa_efficient", "sdpa_cudnn"]:
        assert not torch.ops.hfnn.multi_head_attention_supports(q, k, v, 2, False, False, 0.0, core, kpm, am, True)
        with pytest.raises(RuntimeError, match=f"core {core} does not take this input.*need_weights"):
            torch.ops.hfnn.multi_head_attention_with_weights(*args, core, kpm, am)


def test_cpu_supports_says_what_takes_a_masked_call():
    q = torch.randn(2, 8, 16)
    kpm = torch.zeros(2, 8, dtype=torch.bool)
    am = torch.zeros(8, 8)

    def said(core, **kw):
        kw = dict(dict(key_padding_mask=kpm, attn_mask=am), **kw)
        return torch.ops.hfnn.multi_head_attention_supports(q, q, q, 2, True, False, 0.0, core, **kw)

    # The CPU flash kernel takes a mask; efficient and cuDNN are GPU kernels.
    assert {c: said(c) for c in CORES} == {"": True, "sdpa_flash": True, "sdpa_efficient": False,
                                          "sdpa_cudnn": False, "sdpa_math": True, "hfnn_short": False,
                                          "hfnn_mid": False}
    assert {c: said(c, need_weights=True) for c in CORES} == {"": True, "sdpa_flash": False, "sdpa_efficient": False,
                                                              "sdpa_cudnn": False, "sdpa_math": True,
                                                              "hfnn_short": False, "hfnn_mid": False}
    assert not said("", attn_mask=torch.zeros(8, 7))  # torch's module rejects it
    assert not said("", attn_mask=torch.zeros(8, 8, dtype=torch.float64))  # the op does not take it
    assert not said("", key_padding_mask=torch.zeros(2, 8, dtype=torch.int32))
    assert said("", attn_mask=None) and said("sdpa_math", key_padding_mask=None, attn_mask=None)
    kv = torch.randn(2, 5, 6)
    assert torch.ops.hfnn.multi_head_attention_supports(q, kv, kv, 2, True, False, 0.0, "", separate_proj=True)
    assert not torch.ops.hfnn.multi_head_attention_supports(q, kv, kv, 2, True, False, 0.0, "")  # needs kdim's weights


# torch's checks of a batched call's masks: each bad input raises torch's error, the same type and
# message, through hfnn's module as through torch's (hfnn's module runs torch's forward for them).
BAD_MASKS = {
    "padding dtype": dict(key_padding_mask=torch.zeros(2, 5, dtype=torch.int64)),
    "mask dtype": dict(attn_mask=torch.zeros(5, 5, dtype=torch.int32)),
    "padding dims": dict(key_padding_mask=torch.zeros(5, dtype=torch.bool)),
    "mask dims": dict(attn_mask=torch.zeros(1, 2, 5, 5, dtype=torch.bool)),
    "causal without mask": dict(is_causal=True),
    "causal with padding, no mask": dict(is_causal=True, key_padding_mask=torch.zeros(2, 5, dtype=torch.bool)),
    "2-D mask shape": dict(attn_mask=torch.zeros(5, 4, dtype=torch.bool)),
    "3-D mask shape": dict(attn_mask=torch.zeros(2, 5, 5, dtype=torch.bool)),
    "padding batch": dict(key_padding_mask=torch.zeros(3, 5, dtype=torch.bool)),
    "padding length": dict(key_padding_mask=torch.zeros(2, 6, dtype=torch.bool)),
    "weights, causal, no mask": dict(is_causal=True, need_weights=True),
}


@pytest.mark.parametrize("name", list(BAD_MASKS))
def test_bad_masks_raise_torchs_message(name):
    ref, ours = pair(8, 2, True)
    x = torch.randn(2, 5, 8, dtype=torch.float64)
    kw = dict(dict(need_weights=False), **BAD_MASKS[name])
    with pytest.raises((AssertionError, RuntimeError)) as torch_error:
        ref(x, x, x, **kw)
    with pytest.raises(torch_error.type) as hfnn_error:
        ours(x, x, x, **kw)
    assert str(hfnn_error.value) == str(torch_error.value)
    assert "\n" not in str(hfnn_error.value)


def test_the_causal_hint_drops_a_mask_torch_would_not_check():
    """With the hint alone, torch's module drops attn_mask unchecked (any shape, float of any dtype),
    and runs SDPA causal: so does hfnn's module."""
    ref, ours = pair(8, 2, True)
    q, k, v = inputs("self", 2, 5, 5, 8, True)
    for am in [torch.zeros(3, 3), torch.zeros(5, 5, dtype=torch.float32, requires_grad=True)]:
        check_call(ref, ours, q, k, v, attn_mask=am, is_causal=True, need_weights=False)


@pytest.mark.parametrize("padding,mask,warned", [
    (torch.bool, torch.float64, 1), (torch.float64, torch.bool, 1), (torch.bool, torch.bool, 0),
    (torch.float64, torch.float64, 0),
    (torch.bool, torch.float32, 2),  # the module's check, and F's: float64 (the bool one canonical) against float32
    (torch.float32, torch.float64, 2),  # (these two run torch's module: a mask of another dtype than the query)
])
def test_mismatched_mask_types_warn_as_torch_does(padding, mask, warned):
    ref, ours = pair(8, 2, True)
    x = torch.randn(2, 5, 8, dtype=torch.float64)
    kpm = torch.zeros(2, 5, dtype=padding)
    am = torch.zeros(5, 5, dtype=mask)
    messages = []
    for m in (ref, ours):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            m(x, x, x, key_padding_mask=kpm, attn_mask=am, need_weights=False)
        messages.append([str(w.message) for w in caught])
    assert messages[1] == messages[0]
    assert len(messages[0]) == warned and all("mismatched key_padding_mask and attn_mask" in m for m in messages[0])


@pytest.mark.parametrize("case,why", [
    ("float mask requires grad", "mask requires grad"),
    ("padding requires grad", "mask requires grad"),
    ("mask of another dtype", "mask the op does not take"),
    ("add_zero_attn", "module settings the op does not take"),
    ("add_bias_kv", "module settings the op does not take"),
    ("unbatched", "unbatched input"),
])
def test_what_runs_torchs_module_says_why(case, why):
    kwargs = {"add_bias_kv": True} if case == "add_bias_kv" else {"add_zero_attn": True} if case == "add_zero_attn" else {}
    torch.manual_seed(0)
    ref = nn.MultiheadAttention(8, 2, batch_first=True, dtype=torch.float64, **kwargs)
    ours = hfnn.nn.MultiheadAttention(8, 2, batch_first=True, dtype=torch.float64, **kwargs)
    ours.load_state_dict(ref.state_dict())
    x = torch.randn(5, 8, dtype=torch.float64) if case == "unbatched" else torch.randn(2, 5, 8, dtype=torch.float64)
    kw = {"need_weights": True, "key_padding_mask": torch.zeros(2, 5, dtype=torch.bool)}
    if case == "unbatched":
        kw["key_padding_mask"] = torch.zeros(5, dtype=torch.bool)
    if case == "float mask requires grad":
        kw["attn_mask"] = torch.zeros(5, 5, dtype=torch.float64, requires_grad=True)
    if case == "padding requires grad":
        kw["key_padding_mask"] = torch.zeros(2, 5, dtype=torch.float64, requires_grad=True)
    if case == "mask of another dtype":
        kw = {"need_weights": False, "attn_mask": torch.zeros(5, 5, dtype=torch.float32)}
    before_calls, before = hfnn.nn.attention_calls["hfnn"], hfnn.nn.attention_fallbacks[why]
    out, w = ours(x, x, x, **kw)
    out_ref, w_ref = ref(x, x, x, **kw)
    assert hfnn.nn.attention_fallbacks[why] == before + 1
    assert hfnn.nn.attention_calls["hfnn"] == before_calls
    assert_same(out, out_ref)
    assert_same(w, w_ref)


def test_nested_tensors_run_torchs_fast_path():
    """Nested tensors (torch's module takes them only on its inference fast path) run torch's module,
    counted as "nested tensor"."""
    ref, ours = pair(8, 2, True)
    ref.eval(), ours.eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # nested tensors are a prototype
        x = torch.nested.nested_tensor([torch.randn(3, 8, dtype=torch.float64), torch.randn(5, 8, dtype=torch.float64)])
    before = hfnn.nn.attention_fallbacks["nested tensor"]
    with torch.no_grad():
        out_ref = ref(x, x, x, need_weights=False)[0]
        out = ours(x, x, x, need_weights=False)[0]
    assert hfnn.nn.attention_fallbacks["nested tensor"] == before + 1
    assert out.is_nested and torch.equal(out.to_padded_tensor(0.0), out_ref.to_padded_tensor(0.0))


def test_a_float_mask_that_requires_grad_gets_torchs_gradient():
    """The op computes no gradient for a mask: such a call runs torch's module, whose gradient reaches
    the mask (under no_grad the op takes it)."""
    ref, ours = pair(8, 2, True)
    x = torch.randn(2, 5, 8, dtype=torch.float64)
    am = torch.randn(5, 5, dtype=torch.float64, requires_grad=True)
    ours(x, x, x, attn_mask=am, need_weights=False)[0].sum().backward()
    grad = am.grad.clone()
    am.grad = None
    ref(x, x, x, attn_mask=am, need_weights=False)[0].sum().backward()
    assert_same(grad, am.grad)
    before = hfnn.nn.attention_calls["hfnn"]
    with torch.no_grad():
        assert_same(ours(x, x, x, attn_mask=am, need_weights=False)[0], ref(x, x, x, attn_mask=am, need_weights=False)[0])
    assert hfnn.nn.attention_calls["hfnn"] == before + 1


def test_the_low_level_op_states_what_it_does_not_take():
    ref, _ = pair(8, 2, True)
    x = torch.randn(2, 5, 8, dtype=torch.float64)
    args = (x, x, x, 2, ref.in_proj_weight, ref.in_proj_bias, ref.out_proj.weight, ref.out_proj.bias, True, False, 0.0,
            "")
    with pytest.raises(RuntimeError, match=r"^hfnn.multi_head_attention: attn_mask has dtype Float, the query "
                                           r"Double: give a bool mask or one of the query's dtype$"):
        torch.ops.hfnn.multi_head_attention(*args, None, torch.zeros(5, 5))
    with pytest.raises(RuntimeError, match=r"^hfnn.multi_head_attention: key_padding_mask requires grad"):
        torch.ops.hfnn.multi_head_attention(*args, torch.zeros(2, 5, dtype=torch.float64, requires_grad=True))
    with pytest.raises(RuntimeError, match=r"^Expected key_padded_mask.shape\[1\] to be 5, but got 4$"):
        torch.ops.hfnn.multi_head_attention(*args, torch.zeros(2, 4, dtype=torch.bool))
    with pytest.raises(RuntimeError, match=r"give in_proj_weight, or q_proj_weight, k_proj_weight and v_proj_weight$"):
        torch.ops.hfnn.multi_head_attention(x, x, x, 2, None, None, ref.out_proj.weight, None)
    with pytest.raises(RuntimeError, match=r"k_proj_weight must be \[embed_dim, kdim\] = \[8, 8\] for a key of width 8"):
        torch.ops.hfnn.multi_head_attention(x, x, x, 2, None, None, ref.out_proj.weight, None, q_proj_weight=ref.out_proj.weight,
                                            k_proj_weight=torch.zeros(8, 3, dtype=torch.float64),
                                            v_proj_weight=ref.out_proj.weight)
    # The op alone reads the causal hint without a mask as a causal call (the module raises torch's error).
    out = torch.ops.hfnn.multi_head_attention(*args[:9], True, 0.0, "")
    causal = torch.ones(5, 5, dtype=torch.bool).triu(1)
    assert_same(out, ref(x, x, x, attn_mask=causal, need_weights=False)[0])


# ---- nn.Transformer*Layer -------------------------------------------------------------------------

def transformer_masks(batch, length, mem_length, kind, device="cpu", dtype=torch.float64):
    """(causal mask, padding mask, memory padding mask) as a training loop makes them."""
    causal = nn.Transformer.generate_square_subsequent_mask(length, device=device, dtype=dtype)
    if kind == "bool":
        causal = causal.isinf()
    pad = torch.zeros(batch, length, dtype=torch.bool, device=device)
    pad[0, -2:] = True
    mem_pad = torch.zeros(batch, mem_length, dtype=torch.bool, device=device)
    mem_pad[-1, :3] = True
    return causal, pad, mem_pad


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("kind", ["float", "bool"])
@pytest.mark.parametrize("batch_first", [True, False])
def test_transformer_layers_run_the_op_with_their_masks(batch_first, kind, norm_first):
    """nn.TransformerEncoderLayer and DecoderLayer (self-attention with a causal mask, hint or not,
    and padding; cross-attention to the memory with its padding) and nn.Transformer, to_hfnn'd:
    every attention call runs hfnn's op, outputs and gradients are torch's."""
    import copy

    d, heads, batch, length, mem_length = 16, 4, 3, 7, 9
    causal, pad, mem_pad = transformer_masks(batch, length, mem_length, kind)
    torch.manual_seed(0)
    enc = nn.TransformerEncoderLayer(d, heads, 32, dropout=0.0, batch_first=batch_first, norm_first=norm_first,
                                     dtype=torch.float64)
    dec = nn.TransformerDecoderLayer(d, heads, 32, dropout=0.0, batch_first=batch_first, norm_first=norm_first,
                                     dtype=torch.float64)
    full = nn.Transformer(d, heads, 1, 1, 32, dropout=0.0, batch_first=batch_first, norm_first=norm_first,
                          dtype=torch.float64)

    def shaped(n):
        return torch.randn((batch, n, d) if batch_first else (n, batch, d), dtype=torch.float64, requires_grad=True)

    x, mem = shaped(length), shaped(mem_length)
    calls = {
        "encoder": (enc, lambda m: m(x, src_mask=causal, src_key_padding_mask=pad, is_causal=kind == "float"), 1),
        "decoder": (dec, lambda m: m(x, mem, tgt_mask=causal, tgt_key_padding_mask=pad,
                                     memory_key_padding_mask=mem_pad, tgt_is_causal=kind == "float"), 2),
        "transformer": (full, lambda m: m(mem, x, tgt_mask=causal, src_key_padding_mask=mem_pad,
                                          tgt_key_padding_mask=pad, memory_key_padding_mask=mem_pad), 3),
    }
    for name, (module, call, attention_calls) in calls.items():
        ours = hfnn.to_hfnn(copy.deepcopy(module))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch's notes about nested tensors and mismatched masks
            out_ref = call(module)
            before = hfnn.nn.attention_calls["hfnn"]
            out = call(ours)
        assert hfnn.nn.attention_calls["hfnn"] == before + attention_calls, (name, dict(hfnn.nn.attention_fallbacks))
        grad = torch.randn_like(out_ref)
        grads_ref = torch.autograd.grad(out_ref, [x, mem] + list(module.parameters()), grad, allow_unused=True)
        grads = torch.autograd.grad(out, [x, mem] + list(ours.parameters()), grad, allow_unused=True)
        assert_same(out, out_ref, 1e-9)
        for g, g_ref in zip(grads, grads_ref):
            assert_same(g, g_ref, 1e-8)


def test_cpu_autocast_with_masks_computes_as_torchs_module_does():
    ref, ours = pair(32, 4, True, dtype=torch.float32)
    x = torch.randn(2, 9, 32, requires_grad=True)
    kpm, am = make_masks("bool", "float2d", 2, 4, 9, 9, dtype=torch.float32, density=0.2)
    for weights in (False, True):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out, w = ours(x, x, x, key_padding_mask=kpm, attn_mask=am, need_weights=weights)
            out_ref, w_ref = ref(x, x, x, key_padding_mask=kpm, attn_mask=am, need_weights=weights)
        assert out.dtype == out_ref.dtype == torch.bfloat16
        torch.testing.assert_close(out.float(), out_ref.float(), rtol=2e-2, atol=2e-2)
        if weights:
            assert w.dtype == w_ref.dtype
            torch.testing.assert_close(w, w_ref, rtol=2e-2, atol=2e-2)


# ---- the tune worker's measure() on the CPU ------------------------------------------------------------

MEASURE_KEYS = [
    "B=2,L=5,S=5,E=8,H=2,batch_first=1,causal=0,inputs=self,bias=1,dropout=0,key_padding_mask=bool",
    "B=2,L=5,S=7,E=8,H=2,batch_first=0,causal=0,inputs=kv,bias=0,dropout=1,key_padding_mask=float,attn_mask=bool3d",
    "B=3,L=4,S=6,E=8,H=2,batch_first=1,causal=0,inputs=qkv,bias=1,dropout=0,attn_mask=float2d,weights=per_head",
    "B=3,L=4,S=4,E=8,H=2,batch_first=1,causal=0,inputs=self,bias=1,dropout=0,weights=mean",
    "B=2,L=4,S=6,E=8,H=2,batch_first=1,causal=0,inputs=qkv,bias=1,dropout=0,key_padding_mask=bool,kdim=6,vdim=3",
    "B=2,L=6,S=6,E=8,H=2,batch_first=1,causal=1,inputs=kv,bias=1,dropout=0,kdim=5,vdim=5",
]


@pytest.mark.parametrize("key", MEASURE_KEYS)
def test_measure_on_the_cpu_gates_every_candidate(monkeypatch, key):
    """The tune worker's answer for masked, weights and kdim keys: torch's module and every core
    that says it takes the key ran within the float64 gate; the planted wrong candidate did not."""
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    assert mha_family.parse_key(key)  # the family's key grammar reads what the C++ key writes
    r = mha_family.measure(torch, hfnn, {"key": key, "dtype": "float32", "passes": ["train"], "seconds": 0.2},
                           1 << 16, plant=True, device="cpu")
    by = {c["name"]: c for c in r["candidates"]}
    assert "torch" in by and "sdpa_math" in by and "planted_wrong" in by, by
    for name, c in by.items():
        assert c.get("ran", True), (name, c)
    torch_err = by["torch"]["max_error"]
    assert torch_err <= 2e-3  # the reference applied the key's masks as torch's module in float32 did
    for name in [n for n in by if n != "planted_wrong"]:
        assert by[name]["max_error"] is not None and by[name]["max_error"] <= max(2e-3, 2 * torch_err), (name, by[name])
    planted = by["planted_wrong"].get("max_error")
    assert planted is None or planted > 1e-2, planted
    if "weights=" in key:
        assert set(by) == {"torch", "sdpa_math", "planted_wrong"}  # only the math composite returns weights


def test_parse_key_refuses_what_the_family_does_not_write():
    for bad in ["B=2,L=5,S=5,E=8,H=2,batch_first=1,causal=0,inputs=self,bias=1,dropout=0,attn_mask=bool4d",
                "B=2,L=5,S=5,E=8,H=2,batch_first=1,causal=0,inputs=self,bias=1,dropout=0,weights=all",
                "B=2,L=5,S=5,E=8,H=2,batch_first=1,causal=0,inputs=self,bias=1,dropout=0,kdim=3"]:
        with pytest.raises(ValueError):
            mha_family.parse_key(bad)


# ---- GPU: every core that takes a masked call, fp32/bf16/fp16, against float64 ----------------------

# Largest error against float64 (max|out - ref| / max|ref|) per dtype, for outputs, weights and
# gradients; and never worse than 4x torch's own module in the same dtype on the same inputs.
TOLERANCE = {torch.float32: 2e-4, torch.bfloat16: 4e-2, torch.float16: 8e-3}


def rel(a, b):
    """max|a - b| / max|b| over the positions finite in b (NaN where b is NaN must be NaN in a: inf
    otherwise), against at least 1e-3 (a gradient that is exactly zero in float64 is rounding noise
    in low precision)."""
    a, b = a.double(), b.double()
    if not torch.equal(a.isnan(), b.isnan()):
        return float("inf")
    finite = ~b.isnan()
    if not bool(finite.any()):
        return 0.0
    a, b = a[finite], b[finite]
    return ((a - b).abs().max() / b.abs().max().clamp_min(1e-3)).item()


def masked_core_sweep(device, dtype, shapes, combos, cores=CORES):
    """For each shape and mask combination: the float64 reference (torch's module in float64 on the
    device), torch's module in `dtype`, and the op with every core: supports() must be exactly where
    the op runs (it runs, or says the core does not take the input), and what runs must be within
    the dtype's tolerance of float64 (or 4x torch's own error). Returns {core: calls that ran} and
    the failures."""
    ran = {core: 0 for core in cores}
    failures = []
    gen = torch.Generator(device=device).manual_seed(0)
    for i, ((heads, head_dim, batch, q_len, kv_len, mode, batch_first), (padding, mask, causal, weights)) in \
            enumerate(itertools.product(shapes, combos)):
        embed = heads * head_dim
        ref64, _ = pair(embed, heads, batch_first, dtype=torch.float64, device=device, seed=i)
        lp = nn.MultiheadAttention(embed, heads, batch_first=batch_first, dtype=dtype, device=device)
        lp.load_state_dict(ref64.state_dict())
        q64, k64, v64 = inputs(mode, batch, q_len, kv_len, embed, batch_first, device=device)
        causal_mask = causal and mask is not None and mask.endswith("2d") and q_len == kv_len
        kpm, am = make_masks(padding, mask, batch, heads, q_len, kv_len, dtype=dtype, device=device, gen=gen,
                             density=0.25, causal=causal_mask)
        # No fully masked row here: NaN in the weights, and torch's pick may be cuDNN, which torch's
        # SDPA hands no -inf (test_gpu_fully_masked_rows_give_torchs_zeros checks hfnn's own cores there).
        if not causal_mask and am is not None:
            am[..., 0] = False if am.dtype == torch.bool else 0.0
        if kpm is not None:
            kpm[..., 0] = False if kpm.dtype == torch.bool else 0.0
        double = {id(m): (m if m is None or m.dtype == torch.bool else m.double()) for m in (kpm, am)}
        kw = dict(is_causal=causal, need_weights=weights is not None, average_attn_weights=weights == "mean")
        grad_out = torch.randn(q64.shape, dtype=torch.float64, device=device, generator=gen)
        out_ref, w_ref, grads_ref = forward_backward(
            ref64, q64, k64, v64, grad_out, None, key_padding_mask=double[id(kpm)], attn_mask=double[id(am)], **kw)

        lows = {id(t): t.detach().to(dtype).requires_grad_() for t in (q64, k64, v64)}
        q, k, v = lows[id(q64)], lows[id(k64)], lows[id(v64)]
        out_lp, w_lp, grads_lp = forward_backward(lp, q, k, v, grad_out.to(dtype), None, key_padding_mask=kpm,
                                                  attn_mask=am, **kw)
        errs_torch = [rel(out_lp, out_ref)] + ([rel(w_lp, w_ref)] if weights else []) + \
            [rel(g, r) for g, r in zip(grads_lp, grads_ref)]
        for core in cores:
            said = torch.ops.hfnn.multi_head_attention_supports(q, k, v, heads, batch_first, causal, 0.0, core, kpm,
                                                                am, weights is not None)
            args = (q, k, v, heads, lp.in_proj_weight, lp.in_proj_bias, lp.out_proj.weight, lp.out_proj.bias,
                    batch_first, causal, 0.0, core, kpm, am)
            try:
                if weights:
                    out, w = torch.ops.hfnn.multi_head_attention_with_weights(*args, None, None, None,
                                                                              weights == "mean")
                else:
                    out, w = torch.ops.hfnn.multi_head_attention(*args), None
            except RuntimeError as e:
                if "does not take this input" not in str(e):
                    raise
                assert not said, f"{core or 'torch-choice'} said it takes case {i} but refused it: {e}"
                continue
            assert said, f"{core or 'torch-choice'} ran case {i} where supports() said no"
            ran[core] += 1
            leaves = list(dict.fromkeys([q, k, v])) + list(lp.parameters())
            grads = torch.autograd.grad(out, leaves, grad_out.to(dtype))
            errs = [rel(out, out_ref)] + ([rel(w, w_ref)] if weights else []) + \
                [rel(g, r) for g, r in zip(grads, grads_ref)]
            for j, (e, e_torch) in enumerate(zip(errs, errs_torch)):
                if e > max(TOLERANCE[dtype], 4 * e_torch):
                    failures.append(f"{core or 'torch-choice'} case {i} ({heads}x{head_dim} B={batch} L={q_len} "
                                    f"S={kv_len} {mode} bf={batch_first} pad={padding} mask={mask} causal={causal} "
                                    f"weights={weights}) output {j}: {e:.2e} (torch {e_torch:.2e})")
    return ran, failures


def gpu_shapes():
    """(heads, head_dim, batch, L, S, mode, batch_first): every L and S of LENGTHS, heads 1, 2, 4,
    batch 1-3 and head sizes the fused cores take and not (8, 64, 20) in turn."""
    out = []
    for i, (q_len, kv_len) in enumerate(itertools.product(LENGTHS, LENGTHS)):
        modes = ("self", "kv", "cross") if q_len == kv_len else ("kv", "cross")
        out.append(((1, 2, 4)[i % 3], (8, 64, 20)[(i // 3) % 3], (1, 2, 3)[(i // 2) % 3], q_len, kv_len,
                    modes[i % len(modes)], i % 2 == 0))
    return out


def test_the_gpu_sweep_runs_on_the_cpu():
    """masked_core_sweep's own logic, on the CPU in float32 (flash is torch's CPU kernel there, which
    takes masks): what the GPU tests below run, on a few shapes."""
    shapes = [(2, 4, 2, 5, 5, "self", True), (1, 8, 3, 3, 7, "cross", False), (4, 2, 1, 8, 2, "kv", True)]
    combos = [("bool", "float2d", False, None), (None, "bool3d", True, "mean"), ("float", None, False, "per_head"),
              (None, "float2d", True, None)]
    ran, failures = masked_core_sweep("cpu", torch.float32, shapes, combos)
    assert not failures, "\n".join(failures)
    assert ran[""] == ran["sdpa_math"] == len(shapes) * len(combos)
    assert ran["sdpa_flash"] == len(shapes) * 2  # the two combos without weights
    assert ran["sdpa_efficient"] == ran["sdpa_cudnn"] == 0


@requires_gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
def test_gpu_masks_every_core_against_float64(dtype):
    """Every (L, S) of LENGTHS with the mask combinations in turn (each combination over 5-6 shapes),
    every core: supports() exactly where the op runs, within tolerance of float64 where it does.
    Flash and cuDNN take no mask (supports() says no wherever one applies); efficient takes them."""
    shapes = gpu_shapes()
    ran = {core: 0 for core in CORES}
    failures = []
    for i, shape in enumerate(shapes):
        combos = [MASK_CASES[(i + j * len(shapes)) % len(MASK_CASES)] for j in range(2)]
        r, f = masked_core_sweep("cuda", dtype, [shape], combos)
        failures += f
        for core, n in r.items():
            ran[core] += n
    assert not failures, "\n".join(failures[:30])
    print(f"{dtype}: cores ran {ran} of {2 * len(shapes)} calls")
    assert ran[""] == ran["sdpa_math"] == 2 * len(shapes)
    assert ran["sdpa_efficient"] > 0


@requires_gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
def test_gpu_every_mask_combination_on_a_fused_core_shape(dtype):
    """Every mask combination (MASK_CASES) on shapes the efficient core takes, self- and cross-attention,
    batch_first both ways, lengths not a multiple of 16 (the padded mask the core reads)."""
    shapes = [(4, 64, 3, 17, 17, "self", True), (2, 32, 2, 8, 33, "cross", False), (2, 8, 1, 64, 7, "kv", True)]
    ran, failures = masked_core_sweep("cuda", dtype, shapes, MASK_CASES)
    assert not failures, "\n".join(failures[:30])
    print(f"{dtype}: cores ran {ran} of {len(shapes) * len(MASK_CASES)} calls")
    without_weights = sum(1 for c in MASK_CASES if c[3] is None)
    assert ran["sdpa_efficient"] >= without_weights, ran  # at least the head size 64 shape, every unweighted combo
    masked = sum(1 for c in MASK_CASES if c[3] is None and (c[0] is not None or (c[1] is not None and not c[2])))
    assert ran["sdpa_flash"] <= len(shapes) * (without_weights - masked)  # flash never with a mask
    assert ran["sdpa_cudnn"] <= len(shapes) * (without_weights - masked)


@requires_gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
def test_gpu_fully_masked_rows_give_torchs_zeros(dtype):
    """A sequence whose keys are all padding and query rows whose scores are all masked: every core
    the op runs itself gives zeros there (the output projection's bias after it) and finite
    gradients, as torch's math and efficient kernels do. (Torch's pick, "", runs whatever torch's
    SDPA picks for a masked call, cuDNN where torch prefers it: torch's behaviour, not checked here.)"""
    ref64, _ = pair(128, 2, True, dtype=torch.float64, device="cuda")
    lp = nn.MultiheadAttention(128, 2, batch_first=True, dtype=dtype, device="cuda")
    lp.load_state_dict(ref64.state_dict())
    q, k, v = inputs("cross", 3, 24, 40, 128, True, dtype=dtype, device="cuda")
    kpm = torch.zeros(3, 40, dtype=torch.bool, device="cuda")
    kpm[1] = True
    am = torch.zeros(24, 40, dtype=dtype, device="cuda")
    am[5] = float("-inf")
    out_ref = ref64(q.double(), k.double(), v.double(), key_padding_mask=kpm, attn_mask=am.double(),
                    need_weights=False)[0]
    assert torch.equal(out_ref[1], ref64.out_proj.bias.expand(24, 128))  # torch's math kernel: zeros
    ran = []
    for core in CORES[1:]:
        if not torch.ops.hfnn.multi_head_attention_supports(q, k, v, 2, True, False, 0.0, core, kpm, am):
            continue
        ran.append(core)
        out = torch.ops.hfnn.multi_head_attention(q, k, v, 2, lp.in_proj_weight, lp.in_proj_bias,
                                                  lp.out_proj.weight, lp.out_proj.bias, True, False, 0.0, core,
                                                  kpm, am)
        grads = torch.autograd.grad(out.float().sum(), [q, k, v, lp.in_proj_weight])
        assert torch.equal(out[1], lp.out_proj.bias.expand(24, 128)), core
        assert bool(out.isfinite().all()) and all(bool(g.isfinite().all()) for g in grads), core
        assert rel(out, out_ref) < TOLERANCE[dtype], core
    assert "sdpa_math" in ran and "sdpa_efficient" in ran, ran


@requires_gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_gpu_kdim_vdim_and_weights_against_float64(dtype):
    """kdim/vdim (the composite with each core's own autograd) and need_weights on the GPU."""
    for kdim, vdim, weights, padding, mask in [(48, 48, None, "bool", None), (32, 80, None, None, "float2d"),
                                               (64, 64, "mean", "bool", "bool3d"), (96, 16, "per_head", None, None)]:
        torch.manual_seed(0)
        ref64 = nn.MultiheadAttention(64, 4, batch_first=True, kdim=kdim, vdim=vdim, dtype=torch.float64, device="cuda")
        ours = hfnn.nn.MultiheadAttention(64, 4, batch_first=True, kdim=kdim, vdim=vdim, dtype=dtype, device="cuda")
        lp = nn.MultiheadAttention(64, 4, batch_first=True, kdim=kdim, vdim=vdim, dtype=dtype, device="cuda")
        ours.load_state_dict(ref64.state_dict())
        lp.load_state_dict(ref64.state_dict())
        q64, k64, v64 = inputs("kv" if kdim == vdim else "cross", 3, 20, 33, 64, True, device="cuda", kdim=kdim,
                               vdim=vdim)
        kpm, am = make_masks(padding, mask, 3, 4, 20, 33, dtype=dtype, device="cuda", density=0.2)
        if am is not None:
            am[..., 0] = False if am.dtype == torch.bool else 0.0
        if kpm is not None:
            kpm[..., 0] = False
        kw = dict(key_padding_mask=kpm, need_weights=weights is not None, average_attn_weights=weights == "mean")
        am64 = am if am is None or am.dtype == torch.bool else am.double()
        grad = torch.randn(3, 20, 64, dtype=torch.float64, device="cuda")
        want = forward_backward(ref64, q64, k64, v64, grad, None, attn_mask=am64, **kw)
        lows = {id(t): t.detach().to(dtype).requires_grad_() for t in (q64, k64, v64)}
        q, k, v = lows[id(q64)], lows[id(k64)], lows[id(v64)]
        before = hfnn.nn.attention_calls["hfnn"]
        got = forward_backward(ours, q, k, v, grad.to(dtype), None, attn_mask=am, **kw)
        assert hfnn.nn.attention_calls["hfnn"] == before + 1
        torch_lp = forward_backward(lp, q, k, v, grad.to(dtype), None, attn_mask=am, **kw)
        outs = [0, 1] if weights else [0]
        for a, b, t in [(got[j], want[j], torch_lp[j]) for j in outs] + list(zip(got[2], want[2], torch_lp[2])):
            assert rel(a, b) <= max(TOLERANCE[dtype], 4 * rel(t, b)), (kdim, vdim, weights, rel(a, b), rel(t, b))


@requires_gpu
def test_gpu_transformer_layers_under_autocast_with_masks():
    """A to_hfnn'd nn.Transformer (encoder and decoder layers, causal and padding masks) trained a step
    under bf16 autocast: every attention call runs hfnn's op; loss and gradients close to torch's."""
    import copy

    torch.manual_seed(0)
    model = nn.Transformer(128, 4, 2, 2, 256, dropout=0.0, batch_first=True, device="cuda")
    ours = hfnn.to_hfnn(copy.deepcopy(model))
    src = torch.randn(4, 37, 128, device="cuda")
    tgt = torch.randn(4, 29, 128, device="cuda")
    causal, pad, mem_pad = transformer_masks(4, 29, 37, "float", device="cuda", dtype=torch.float32)
    results = []
    for m in (model, ours):
        before = hfnn.nn.attention_calls["hfnn"]
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = m(src, tgt, tgt_mask=causal, src_key_padding_mask=mem_pad, tgt_key_padding_mask=pad,
                    memory_key_padding_mask=mem_pad, tgt_is_causal=True)
        loss = out.float().square().mean()
        grads = torch.autograd.grad(loss, list(m.parameters()))
        results.append((loss, grads, hfnn.nn.attention_calls["hfnn"] - before))
    (loss_ref, grads_ref, _), (loss, grads, calls) = results
    assert calls == 2 + 2 * 2  # encoder self-attention, decoder self- and cross-attention, per layer
    assert abs(loss.item() - loss_ref.item()) <= 2e-2 * abs(loss_ref.item())
    for g, g_ref in zip(grads, grads_ref):
        assert rel(g, g_ref) < 5e-2


@pytest.mark.parametrize("need_weights", [False, True])
@pytest.mark.parametrize("mask", ["padding", "bool", "float"])
def test_float64_module_under_autocast_computes_in_float64(mask, need_weights):
    """Autocast never casts float64: a float64 module under bf16 autocast runs, and matches torch's,
    in float64, masks included (the op cast its mask to bf16 and failed or rounded it)."""
    ref, ours = pair(8, 2, True)
    x = torch.randn(2, 5, 8, dtype=torch.float64)
    kw = {"padding": dict(key_padding_mask=torch.tensor([[False] * 4 + [True]] * 2)),
          "bool": dict(attn_mask=torch.ones(5, 5, dtype=torch.bool).triu(1)),
          "float": dict(attn_mask=torch.randn(5, 5, dtype=torch.float64) / 3)}[mask]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        want = ref(x, x, x, need_weights=need_weights, **kw)
        got = ours(x, x, x, need_weights=need_weights, **kw)
    assert got[0].dtype == want[0].dtype == torch.float64
    torch.testing.assert_close(got[0], want[0], rtol=1e-10, atol=1e-10)
    if need_weights:
        torch.testing.assert_close(got[1], want[1], rtol=1e-10, atol=1e-10)
