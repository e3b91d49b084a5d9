"""hfnn.nn.MultiheadAttention and the hfnn::multi_head_attention op against torch's module.

On the CPU (CI): in float64 through torch's math core, outputs and every gradient equal torch's
module to rounding for self-, encoder-decoder (key is value) and cross-attention, batch_first both
ways, with and without bias, the causal hint; every case the op does not take runs torch's path and
counts its reason. Masks, need_weights=True, kdim/vdim and the Transformer layers:
tests/python/test_attention_masks.py. On the GPU: every core (torch's pick, flash, efficient, cuDNN, math) that says it
takes an input, over head sizes, lengths and batch shapes, fp32/bf16/fp16, against float64.
"""
import itertools

import pytest
import torch
from torch import nn

import hfnn
from conftest import requires_gpu

CORES = ["", "sdpa_flash", "sdpa_efficient", "sdpa_cudnn", "sdpa_math", "hfnn_short", "hfnn_mid"]


def pair(embed, heads, batch_first, bias=True, dtype=torch.float64, device="cpu", dropout=0.0):
    torch.manual_seed(embed * 31 + heads)
    ref = nn.MultiheadAttention(embed, heads, batch_first=batch_first, bias=bias, dtype=dtype, device=device,
                                dropout=dropout)
    ours = hfnn.nn.MultiheadAttention(embed, heads, batch_first=batch_first, bias=bias, dtype=dtype, device=device,
                                      dropout=dropout)
    ours.load_state_dict(ref.state_dict())
    return ref, ours


def inputs(mode, batch, length, kv_length, embed, batch_first, dtype=torch.float64, device="cpu"):
    def t(n):
        shape = (batch, n, embed) if batch_first else (n, batch, embed)
        return torch.randn(shape, dtype=dtype, device=device, requires_grad=True)

    q = t(length)
    if mode == "self":
        return q, q, q
    if mode == "kv":  # encoder-decoder: key is value
        kv = t(kv_length)
        return q, kv, kv
    return q, t(kv_length), t(kv_length)


def run(module, q, k, v, grad, **kw):
    out, weights = module(q, k, v, **kw)
    leaves = list(dict.fromkeys([q, k, v])) + list(module.parameters())
    grads = torch.autograd.grad(out, leaves, grad)
    return out, weights, grads


def rel(a, b):
    """max|a - b| / max|b|, against at least 1e-3: a gradient that is exactly zero in float64 (a key
    that is the only one a query sees) comes out as rounding noise (6e-8 in fp16), not an error."""
    return ((a.double() - b.double()).abs().max() / b.double().abs().max().clamp_min(1e-3)).item()


@pytest.mark.parametrize("mode,batch_first,bias,causal", list(itertools.product(
    ["self", "kv", "cross"], [True, False], [True, False], [False, True])))
def test_cpu_float64_matches_torch_module(mode, batch_first, bias, causal):
    embed, heads, batch, length = 24, 3, 2, 5
    kv_length = length if causal else 7
    ref, ours = pair(embed, heads, batch_first, bias)
    q, k, v = inputs(mode, batch, length, kv_length, embed, batch_first)
    mask = nn.Transformer.generate_square_subsequent_mask(length, dtype=torch.float64) if causal else None
    kw = dict(attn_mask=mask, is_causal=causal, need_weights=False)
    grad = torch.randn_like(ref(q, k, v, **kw)[0])
    out_ref, w_ref, grads_ref = run(ref, q, k, v, grad, **kw)
    before = hfnn.nn.attention_calls["hfnn"]
    out, w, grads = run(ours, q, k, v, grad, **kw)
    assert hfnn.nn.attention_calls["hfnn"] == before + 1, "the call did not run hfnn's op"
    assert w is None and w_ref is None
    torch.testing.assert_close(out, out_ref, rtol=1e-12, atol=1e-12)
    assert len(grads) == len(grads_ref)
    for g, g_ref in zip(grads, grads_ref):
        torch.testing.assert_close(g, g_ref, rtol=1e-11, atol=1e-11)


@pytest.mark.parametrize("embed,heads,batch,length", [(1, 1, 1, 1), (8, 8, 1, 1), (6, 2, 4, 1), (16, 4, 1, 33), (40, 5, 3, 17)])
def test_cpu_float64_shapes(embed, heads, batch, length):
    ref, ours = pair(embed, heads, True)
    q, k, v = inputs("self", batch, length, length, embed, True)
    grad = torch.randn(batch, length, embed, dtype=torch.float64)
    out_ref, _, grads_ref = run(ref, q, k, v, grad, need_weights=False)
    out, _, grads = run(ours, q, k, v, grad, need_weights=False)
    torch.testing.assert_close(out, out_ref, rtol=1e-12, atol=1e-12)
    for g, g_ref in zip(grads, grads_ref):
        torch.testing.assert_close(g, g_ref, rtol=1e-11, atol=1e-11)


def test_the_op_with_the_math_core_equals_torchs_choice_on_cpu():
    ref, _ = pair(16, 2, True)
    q = torch.randn(2, 9, 16, dtype=torch.float64)
    args = (q, q, q, 2, ref.in_proj_weight, ref.in_proj_bias, ref.out_proj.weight, ref.out_proj.bias, True, False, 0.0)
    torch.testing.assert_close(torch.ops.hfnn.multi_head_attention(*args, "sdpa_math"),
                               torch.ops.hfnn.multi_head_attention(*args, ""), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("mode,batch_first,bias,kv_length", list(itertools.product(
    ["self", "kv", "cross", "qk"], [True, False], [True, False], [4, 9])))
@pytest.mark.parametrize("core", ["sdpa_flash", "sdpa_math"])
def test_cpu_float64_each_core_and_its_autograd(core, mode, batch_first, bias, kv_length):
    """sdpa_flash (torch's CPU flash kernel) runs the op's own autograd node, one for the whole call;
    sdpa_math the composite of ATen ops. Both equal torch's module, gradients included, for key and
    value shorter and longer than the query ("qk": query is key, value another tensor)."""
    embed, heads, batch, length = 24, 3, 3, 6
    if mode == "self" and kv_length != length:
        kv_length = length
    ref, _ = pair(embed, heads, batch_first, bias)
    if mode == "qk":
        q, _, v = inputs("cross", batch, length, length, embed, batch_first)
        k = q
    else:
        q, k, v = inputs(mode, batch, length, kv_length, embed, batch_first)
    grad = torch.randn_like(ref(q, k, v, need_weights=False)[0])
    out_ref, _, grads_ref = run(ref, q, k, v, grad, need_weights=False)
    out = torch.ops.hfnn.multi_head_attention(q, k, v, heads, ref.in_proj_weight, ref.in_proj_bias,
                                              ref.out_proj.weight, ref.out_proj.bias, batch_first, False, 0.0, core)
    assert ("MhaFunction" in out.grad_fn.name()) == (core == "sdpa_flash"), out.grad_fn.name()
    leaves = list(dict.fromkeys([q, k, v])) + list(ref.parameters())
    grads = torch.autograd.grad(out, leaves, grad)
    torch.testing.assert_close(out, out_ref, rtol=1e-12, atol=1e-12)
    for g, g_ref in zip(grads, grads_ref):
        torch.testing.assert_close(g, g_ref, rtol=1e-11, atol=1e-11)


@pytest.mark.parametrize("frozen", ["weights", "in_proj", "out_proj", "input", "biases"])
def test_cpu_node_computes_only_the_gradients_asked_for(frozen):
    ref, ours = pair(16, 4, True)
    x = torch.randn(2, 7, 16, dtype=torch.float64, requires_grad=frozen != "input")
    for name, p in ours.named_parameters():
        p.requires_grad_(not ((frozen == "weights" and "weight" in name) or (frozen == "biases" and "bias" in name)
                              or (frozen == "in_proj" and name.startswith("in_proj"))
                              or (frozen == "out_proj" and name.startswith("out_proj"))))
    grad = torch.randn(2, 7, 16, dtype=torch.float64)
    out = ours(x, x, x, need_weights=False)[0]
    assert "MhaFunction" in out.grad_fn.name()
    out.backward(grad)
    x_ref = x.detach().clone().requires_grad_(x.requires_grad)
    ref(x_ref, x_ref, x_ref, need_weights=False)[0].backward(grad)
    for (name, p), p_ref in zip(ours.named_parameters(), ref.parameters()):
        assert (p.grad is None) == (not p.requires_grad), name
        if p.grad is not None:
            torch.testing.assert_close(p.grad, p_ref.grad, rtol=1e-11, atol=1e-11)
    if x.requires_grad:
        torch.testing.assert_close(x.grad, x_ref.grad, rtol=1e-11, atol=1e-11)


def test_cpu_autocast_bfloat16_computes_as_torchs_module_does():
    ref, ours = pair(32, 4, True, dtype=torch.float32)
    x = torch.randn(2, 9, 32, requires_grad=True)
    grad = torch.randn(2, 9, 32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = ours(x, x, x, need_weights=False)[0]
        out_ref = ref(x, x, x, need_weights=False)[0]
    assert out.dtype == out_ref.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), out_ref.float(), rtol=2e-2, atol=2e-2)
    grads = torch.autograd.grad(out, [x] + list(ours.parameters()), grad.bfloat16())
    grads_ref = torch.autograd.grad(out_ref, [x] + list(ref.parameters()), grad.bfloat16())
    for g, g_ref in zip(grads, grads_ref):
        assert g.dtype == torch.float32
        torch.testing.assert_close(g, g_ref, rtol=3e-2, atol=3e-2)


def test_cpu_output_takes_in_place_ops_as_torchs_does():
    _, ours = pair(16, 2, True)
    x = torch.randn(2, 5, 16, dtype=torch.float64, requires_grad=True)
    out = ours(x, x, x, need_weights=False)[0]
    assert "MhaFunction" in out.grad_fn.name()
    out.mul_(2)  # torch's module's output allows it; a view returned by a custom Function would not
    out.sum().backward()
    assert x.grad is not None and torch.isfinite(x.grad).all()


def test_cpu_double_backward_is_a_clear_error():
    _, ours = pair(16, 2, True)
    x = torch.randn(2, 5, 16, dtype=torch.float64, requires_grad=True)
    out = ours(x, x, x, need_weights=False)[0]
    with pytest.raises(RuntimeError, match="double backward"):
        torch.autograd.grad(out.sum(), x, create_graph=True)


def test_meta_tensors_give_torchs_shapes():
    ref, ours = pair(16, 2, True)
    ours, ref = ours.to("meta"), ref.to("meta")
    x = torch.empty(2, 5, 16, dtype=torch.float64, device="meta")
    assert ours(x, x, x, need_weights=False)[0].shape == ref(x, x, x, need_weights=False)[0].shape == x.shape


def test_cpu_no_grad_builds_no_graph():
    _, ours = pair(16, 2, True)
    x = torch.randn(2, 5, 16, dtype=torch.float64)
    with torch.no_grad():
        assert ours(x, x, x, need_weights=False)[0].grad_fn is None
    with torch.inference_mode():
        assert ours(x, x, x, need_weights=False)[0].grad_fn is None


@pytest.mark.parametrize("case,why", [
    ("add_bias_kv", "module settings the op does not take"),
    ("add_zero_attn", "module settings the op does not take"),
    ("unbatched", "unbatched input"),
    ("mask_grad", "mask requires grad"),
    ("mask_dtype", "mask the op does not take"),
    ("padding_dtype", "mask the op does not take"),
])
def test_what_the_op_does_not_take_runs_torch_with_its_reason(case, why):
    """(Masks, need_weights and kdim/vdim run hfnn's op: tests/python/test_attention_masks.py.)"""
    embed, heads = 8, 2
    kwargs = {"add_bias_kv": True} if case == "add_bias_kv" else {"add_zero_attn": True} if case == "add_zero_attn" else {}
    torch.manual_seed(0)
    ref = nn.MultiheadAttention(embed, heads, batch_first=True, dtype=torch.float64, **kwargs)
    ours = hfnn.nn.MultiheadAttention(embed, heads, batch_first=True, dtype=torch.float64, **kwargs)
    ours.load_state_dict(ref.state_dict())
    q = torch.randn(2, 5, embed, dtype=torch.float64) if case != "unbatched" else torch.randn(5, embed, dtype=torch.float64)
    call = {"need_weights": False}
    if case == "mask_grad":
        call["attn_mask"] = torch.zeros(5, 5, dtype=torch.float64, requires_grad=True)
    if case == "mask_dtype":
        call["attn_mask"] = torch.zeros(5, 5, dtype=torch.float32)  # torch's SDPA takes a float32 mask here
    if case == "padding_dtype":
        call["key_padding_mask"] = torch.zeros(2, 5, dtype=torch.float32)
    before_calls, before = hfnn.nn.attention_calls["hfnn"], hfnn.nn.attention_fallbacks[why]
    out, weights = ours(q, q, q, **call)
    out_ref, weights_ref = ref(q, q, q, **call)
    assert hfnn.nn.attention_fallbacks[why] == before + 1
    assert hfnn.nn.attention_calls["hfnn"] == before_calls
    torch.testing.assert_close(out, out_ref)
    assert weights is None and weights_ref is None


def test_to_hfnn_swaps_attention_and_back():
    layer = nn.TransformerEncoderLayer(16, 4, dim_feedforward=32, dropout=0.0, batch_first=True, dtype=torch.float64)
    keys = list(layer.state_dict())
    x = torch.randn(2, 6, 16, dtype=torch.float64)
    expected = layer(x)
    hfnn.to_hfnn(layer)
    assert type(layer.self_attn) is hfnn.nn.MultiheadAttention
    before = hfnn.nn.attention_calls["hfnn"]
    torch.testing.assert_close(layer(x), expected, rtol=1e-12, atol=1e-12)
    assert hfnn.nn.attention_calls["hfnn"] == before + 1, "TransformerEncoderLayer's attention did not run hfnn's op"
    assert list(layer.state_dict()) == keys
    hfnn.to_torch(layer)
    assert type(layer.self_attn) is nn.MultiheadAttention


def test_unknown_core_is_a_one_line_error():
    q = torch.randn(1, 2, 4, dtype=torch.float64)
    w, wo = torch.randn(12, 4, dtype=torch.float64), torch.randn(4, 4, dtype=torch.float64)
    with pytest.raises(RuntimeError, match=r"unknown core 'sdpa_fast' \(sdpa_flash, sdpa_efficient"):
        torch.ops.hfnn.multi_head_attention(q, q, q, 2, w, None, wo, None, True, False, 0.0, "sdpa_fast")
    with pytest.raises(RuntimeError, match="embed_dim 4 is not divisible by num_heads 3"):
        torch.ops.hfnn.multi_head_attention(q, q, q, 3, w, None, wo, None, True, False, 0.0, "")


def test_supports_on_cpu_says_the_cpu_cores():
    q = torch.randn(2, 8, 16)
    said = {core: torch.ops.hfnn.multi_head_attention_supports(q, q, q, 2, True, False, 0.0, core) for core in CORES}
    # flash is torch's CPU flash kernel there (no dropout); efficient and cuDNN are GPU kernels.
    assert said == {"": True, "sdpa_flash": True, "sdpa_efficient": False, "sdpa_cudnn": False, "sdpa_math": True,
                    "hfnn_short": False, "hfnn_mid": False}
    assert not torch.ops.hfnn.multi_head_attention_supports(q, q, q, 2, True, False, 0.1, "sdpa_flash")
    assert not torch.ops.hfnn.multi_head_attention_supports(q, q, q, 3, True, False, 0.0, "")  # 16 % 3
    assert not torch.ops.hfnn.multi_head_attention_supports(q, q, q, 2, True, False, 0.0, "nope")


# ---- GPU: every core, dtype and a dense set of shapes against float64 --------------------------------

# Largest error against float64 (max|out - ref| / max|ref|) per dtype, for outputs and gradients;
# and never worse than 4x torch's own module in the same dtype on the same inputs.
TOLERANCE = {torch.float32: 2e-4, torch.bfloat16: 4e-2, torch.float16: 8e-3}

HEAD_DIMS = [1, 4, 8, 16, 24, 32, 40, 64, 72, 80, 96, 128, 160, 256]
LENGTHS = [1, 2, 3, 4, 5, 6, 7, 8, 31, 64, 127, 128, 129, 255, 256, 257, 512]


def gpu_case(embed, heads, batch, length, kv_length, mode, batch_first, causal, dtype):
    ref64, ours = pair(embed, heads, batch_first, dtype=torch.float64, device="cuda")
    ours = ours.to(dtype)
    torch_lp = nn.MultiheadAttention(embed, heads, batch_first=batch_first, dtype=dtype, device="cuda")
    torch_lp.load_state_dict(ours.state_dict())
    q64, k64, v64 = inputs(mode, batch, length, kv_length, embed, batch_first, device="cuda")
    grad64 = torch.randn(*q64.shape, dtype=torch.float64, device="cuda")
    mask = nn.Transformer.generate_square_subsequent_mask(length, device="cuda", dtype=torch.float64) if causal else None
    kw = dict(attn_mask=mask, is_causal=causal, need_weights=False)
    out_ref, _, grads_ref = run(ref64, q64, k64, v64, grad64, **kw)

    def low(t):
        return t.detach().to(dtype).requires_grad_()

    lows = {id(t): low(t) for t in (q64, k64, v64)}
    q, k, v = lows[id(q64)], lows[id(k64)], lows[id(v64)]
    kw_lp = dict(kw, attn_mask=mask.to(dtype) if causal else None)
    out_torch, _, grads_torch = run(torch_lp, q, k, v, grad64.to(dtype), **kw_lp)
    errs_torch = [rel(out_torch, out_ref)] + [rel(g, r) for g, r in zip(grads_torch, grads_ref)]
    return ours, (q, k, v), grad64.to(dtype), (out_ref, grads_ref), errs_torch, kw_lp


def core_failures(core, embed, heads, batch, length, kv_length, mode, batch_first, causal, dtype):
    """(took, failures) for one case through a named core: whether the core said it takes the case
    (supports()), and the errors of its output and every gradient against float64 that exceed the
    tolerance (or 4x torch's own module's error in the same dtype); the call must be one autograd
    node."""
    ours, (q, k, v), grad, (out_ref, grads_ref), errs_torch, _ = gpu_case(
        embed, heads, batch, length, kv_length, mode, batch_first, causal, dtype)
    if not torch.ops.hfnn.multi_head_attention_supports(q, k, v, heads, batch_first, causal, 0.0, core):
        return False, []
    out = torch.ops.hfnn.multi_head_attention(q, k, v, heads, ours.in_proj_weight, ours.in_proj_bias,
                                              ours.out_proj.weight, ours.out_proj.bias, batch_first, causal, 0.0, core)
    assert "MhaFunction" in out.grad_fn.name(), out.grad_fn.name()
    leaves = list(dict.fromkeys([q, k, v])) + list(ours.parameters())
    grads = torch.autograd.grad(out, leaves, grad)
    errs = [rel(out, out_ref)] + [rel(g, r) for g, r in zip(grads, grads_ref)]
    names = ["out"] + [f"grad{i}" for i in range(len(grads))]
    where = f"E={embed} H={heads} B={batch} L={length} S={kv_length} {mode} bf={batch_first} causal={causal}"
    return True, [f"{where} {n}: {e:.2e} (torch {et:.2e})" for n, e, et in zip(names, errs, errs_torch)
                  if e > max(TOLERANCE[dtype], 4 * et)]


def assert_refuses_three_projections_and_masks(core, length):
    """hfnn's own cores (GPU) say no to a bf16 call with kdim/vdim (three projections: the op runs
    such calls as a composite that autograd differentiates op by op, which their forwards are not),
    with an attn_mask and with a key_padding_mask, at `length` tokens."""
    supports = torch.ops.hfnn.multi_head_attention_supports
    q = torch.randn(2, 64, 128, device="cuda", dtype=torch.bfloat16)
    kv = torch.randn(2, 64, 96, device="cuda", dtype=torch.bfloat16)
    assert not supports(q, kv, kv, 2, True, False, 0.0, core, separate_proj=True)
    q = torch.randn(2, length, 128, device="cuda", dtype=torch.bfloat16)
    assert not supports(q, q, q, 2, True, False, 0.0, core,
                        attn_mask=torch.zeros(length, length, device="cuda", dtype=torch.bfloat16))
    assert not supports(q, q, q, 2, True, False, 0.0, core,
                        key_padding_mask=torch.zeros(2, length, device="cuda", dtype=torch.bool))


def assert_bit_identical_and_under_graph_replay(core, batch, length, embed=512, heads=8):
    """A bf16 self-attention training call through `core`, twice and then captured in a CUDA graph
    and replayed: the output and every gradient equal bit for bit each time (the core's sums in a
    fixed order, nothing left from the call before)."""
    torch.manual_seed(0)
    m = nn.MultiheadAttention(embed, heads, batch_first=True, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(batch, length, embed, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    g = torch.randn_like(x)
    params = [x] + list(m.parameters())

    def call():
        out = torch.ops.hfnn.multi_head_attention(x, x, x, heads, m.in_proj_weight, m.in_proj_bias,
                                                  m.out_proj.weight, m.out_proj.bias, True, False, 0.0, core)
        out.backward(g)
        return out

    def step():
        for t in params:
            t.grad = None
        out = call()
        return [out.detach().clone()] + [t.grad.clone() for t in params]

    first, second = step(), step()
    for a, b in zip(first, second):
        assert torch.equal(a, b)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            step()
    torch.cuda.current_stream().wait_stream(side)
    for t in params:
        t.grad = None
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = call()
    graph.replay()
    torch.cuda.synchronize()
    for a, b in zip([out.detach()] + [t.grad for t in params], first):
        assert torch.equal(a, b)


@requires_gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
def test_gpu_every_core_over_head_sizes_and_lengths(dtype):
    ran = {core: 0 for core in CORES}
    failures = []
    for head_dim, length in itertools.product(HEAD_DIMS, LENGTHS):
        heads = 2
        embed = heads * head_dim
        # self (causal at even lengths), cross and encoder-decoder (key is value) in turn; key and
        # value longer than the query at half the head sizes, shorter at the others.
        mode = ("self", "cross", "kv")[length % 3]
        causal = mode == "self" and length % 2 == 0
        kv_length = length if mode == "self" else 2 * length + 1 if head_dim % 16 == 0 else max(1, length // 2 + 1)
        ours, (q, k, v), grad, (out_ref, grads_ref), errs_torch, kw = gpu_case(
            embed, heads, 2, length, kv_length, mode, length % 4 != 1, causal, dtype)
        for core in CORES:
            if not torch.ops.hfnn.multi_head_attention_supports(q, k, v, heads, ours.batch_first, causal, 0.0, core):
                continue
            ran[core] += 1
            out = torch.ops.hfnn.multi_head_attention(q, k, v, heads, ours.in_proj_weight, ours.in_proj_bias,
                                                      ours.out_proj.weight, ours.out_proj.bias, ours.batch_first,
                                                      causal, 0.0, core)
            leaves = list(dict.fromkeys([q, k, v])) + list(ours.parameters())
            grads = torch.autograd.grad(out, leaves, grad)
            errs = [rel(out, out_ref)] + [rel(g, r) for g, r in zip(grads, grads_ref)]
            for name, e, e_torch in zip(["out"] + [f"grad{i}" for i in range(len(grads))], errs, errs_torch):
                if e > max(TOLERANCE[dtype], 4 * e_torch):
                    failures.append(f"{core or 'torch-choice'} head_dim={head_dim} L={length} {name}: {e:.2e} "
                                    f"(torch {e_torch:.2e})")
    assert not failures, "\n".join(failures[:30])
    print(f"{dtype}: cores ran on {ran} of {len(HEAD_DIMS) * len(LENGTHS)} shapes")
    assert ran[""] == ran["sdpa_math"] == len(HEAD_DIMS) * len(LENGTHS)
    if dtype != torch.float32:
        assert ran["sdpa_flash"] > 0 and ran["sdpa_efficient"] > 0


@requires_gpu
@pytest.mark.parametrize("batch,heads,head_dim,length", [(1, 1, 64, 1), (5000, 8, 64, 4), (3, 16, 64, 1024),
                                                         (257, 12, 64, 33), (7, 3, 32, 200)])
def test_gpu_batch_shapes_every_core_bf16(batch, heads, head_dim, length):
    embed = heads * head_dim
    ours, (q, k, v), grad, (out_ref, grads_ref), errs_torch, kw = gpu_case(
        embed, heads, batch, length, length, "self", True, False, torch.bfloat16)
    for core in CORES:
        if not torch.ops.hfnn.multi_head_attention_supports(q, k, v, heads, True, False, 0.0, core):
            continue
        out = torch.ops.hfnn.multi_head_attention(q, k, v, heads, ours.in_proj_weight, ours.in_proj_bias,
                                                  ours.out_proj.weight, ours.out_proj.bias, True, False, 0.0, core)
        grads = torch.autograd.grad(out, [q] + list(ours.parameters()), grad)
        errs = [rel(out, out_ref)] + [rel(g, r) for g, r in zip(grads, grads_ref)]
        assert max(errs) <= max(TOLERANCE[torch.bfloat16], 4 * max(errs_torch)), (core, errs, errs_torch)


@requires_gpu
@pytest.mark.parametrize("core,masked", [("sdpa_flash", False), ("sdpa_efficient", False), ("sdpa_efficient", True)])
def test_gpu_dropout_backward_uses_the_forwards_mask(core, masked):
    """With the same seed, the op's core draws the same dropout mask as torch's module running the
    same SDPA kernel: outputs and every gradient agree, so the backward used the forward's mask.
    `masked`: with a padding mask and a float attention mask, of a length that is no multiple of 16
    (the efficient core reads the mask padded, as torch's SDPA hands it over), likewise."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    backend = {"sdpa_flash": SDPBackend.FLASH_ATTENTION, "sdpa_efficient": SDPBackend.EFFICIENT_ATTENTION}[core]
    ref, ours = pair(128, 2, True, dtype=torch.bfloat16, device="cuda", dropout=0.3)
    length = 50 if masked else 96
    x = torch.randn(4, length, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    masks = {}
    if masked:
        masks["key_padding_mask"] = torch.arange(length, device="cuda") >= torch.tensor([[50], [41], [7], [33]],
                                                                                          device="cuda")
        masks["attn_mask"] = 0.5 * torch.randn(length, length, device="cuda", dtype=torch.bfloat16)
    grad = torch.randn_like(x)
    torch.manual_seed(7)
    with sdpa_kernel(backend):
        out_ref, _, grads_ref = run(ref, x, x, x, grad, need_weights=False, **masks)
    torch.manual_seed(7)
    out = torch.ops.hfnn.multi_head_attention(x, x, x, 2, ours.in_proj_weight, ours.in_proj_bias, ours.out_proj.weight,
                                              ours.out_proj.bias, True, False, 0.3, core,
                                              masks.get("key_padding_mask"), masks.get("attn_mask"))
    grads = torch.autograd.grad(out, [x] + list(ours.parameters()), grad)
    assert rel(out, out_ref) < 2e-2
    for g, g_ref in zip(grads, grads_ref):
        assert rel(g, g_ref) < 2e-2


@requires_gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_gpu_odd_output_gradients_and_frozen_weights(dtype):
    """A gradient of strides cuBLASLt cannot take (out.sum()'s expanded ones) and frozen weights
    (no dW GEMMs, db alone) give torch's gradients."""
    ref, ours = pair(96, 3, True, dtype=dtype, device="cuda")
    for frozen in (False, True):
        for m in (ref, ours):
            m.in_proj_weight.requires_grad_(not frozen)
            m.out_proj.weight.requires_grad_(not frozen)
            m.zero_grad(set_to_none=True)
        x = torch.randn(3, 40, 96, device="cuda", dtype=dtype)
        xr, xo = x.clone().requires_grad_(), x.clone().requires_grad_()
        ref(xr, xr, xr, need_weights=False)[0].sum().backward()
        ours(xo, xo, xo, need_weights=False)[0].sum().backward()
        tol = 1e-2 if dtype == torch.bfloat16 else 1e-4
        assert rel(xo.grad, xr.grad) < tol
        for (name, p), p_ref in zip(ours.named_parameters(), ref.parameters()):
            assert (p.grad is None) == (p_ref.grad is None), name
            if p.grad is not None:
                assert rel(p.grad, p_ref.grad) < tol, (name, frozen)


@requires_gpu
def test_gpu_dropout_is_random_in_training_and_off_in_eval():
    ours = hfnn.nn.MultiheadAttention(64, 4, batch_first=True, dropout=0.5, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(8, 128, 64, device="cuda", dtype=torch.bfloat16)
    ours.train()
    a = ours(x, x, x, need_weights=False)[0]
    b = ours(x, x, x, need_weights=False)[0]
    assert not torch.equal(a, b), "dropout in training gave the same output twice"
    ours.eval()
    torch.testing.assert_close(ours(x, x, x, need_weights=False)[0], ours(x, x, x, need_weights=False)[0])


@requires_gpu
@pytest.mark.parametrize("core", ["sdpa_flash", "sdpa_efficient", "sdpa_cudnn"])
def test_gpu_repeated_calls_ask_cublaslt_nothing_new(core):
    """A call with shapes seen before makes no cuBLASLt heuristic query and no descriptors
    (kernels/common/gemm.cpp caches both: the per-call CPU cost issue 11 measures), forward on this
    thread and backward on autograd's, and its results equal the first call's."""
    ref, ours = pair(192, 3, True, dtype=torch.bfloat16, device="cuda")
    x = torch.randn(4, 64, 192, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    grad = torch.randn_like(x)
    if not torch.ops.hfnn.multi_head_attention_supports(x, x, x, 3, True, False, 0.0, core):
        pytest.skip(f"{core} does not take this input on this GPU")

    def call():
        out = torch.ops.hfnn.multi_head_attention(x, x, x, 3, ours.in_proj_weight, ours.in_proj_bias,
                                                  ours.out_proj.weight, ours.out_proj.bias, True, False, 0.0, core)
        return [out.detach()] + list(torch.autograd.grad(out, [x] + list(ours.parameters()), grad))

    first = call()
    before = torch.ops.hfnn._gemm_cache_stats()
    for _ in range(3):
        again = call()
    assert torch.ops.hfnn._gemm_cache_stats() == before
    assert before[0] > 0 and before[1] >= before[0]
    for a, b in zip(first, again):
        assert rel(a, b) < 1e-2  # (some cores' backward sums in a nondeterministic order)


@requires_gpu
def test_gpu_cuda_graph_replay_and_a_side_stream_match_eager():
    """Captured in a CUDA graph (the Lt workspace and the bias gradients' ones are the call's own
    there, not the cached ones) and run on a side stream (ones cached per stream), the op's output
    and gradients are eager's."""
    _, ours = pair(128, 2, True, dtype=torch.bfloat16, device="cuda")
    x = torch.randn(4, 48, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    grad = torch.randn_like(x)
    params = [x] + list(ours.parameters())

    def step():
        for p in params:
            p.grad = None
        out = ours(x, x, x, need_weights=False)[0]
        out.backward(grad)
        return [out.detach().clone()] + [p.grad.clone() for p in params]

    eager = step()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            on_side = step()
    torch.cuda.current_stream().wait_stream(side)
    for p in params:
        p.grad = None
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = ours(x, x, x, need_weights=False)[0]
        out.backward(grad)
    g.replay()
    torch.cuda.synchronize()
    replayed = [out.detach()] + [p.grad for p in params]
    for a, b, c in zip(eager, on_side, replayed):
        assert rel(b, a) < 1e-2 and rel(c, a) < 1e-2


@requires_gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_gpu_tensors_on_a_device_other_than_the_current_one():
    """The op's GEMMs run on its tensors' device (handle, stream and workspace of that device) when
    the current device is another one."""
    ref, ours = pair(128, 2, True, dtype=torch.bfloat16, device="cuda:1")
    x = torch.randn(2, 32, 128, device="cuda:1", dtype=torch.bfloat16, requires_grad=True)
    grad = torch.randn_like(x)
    with torch.cuda.device(0):
        out, _, grads = run(ours, x, x, x, grad, need_weights=False)
        out_ref, _, grads_ref = run(ref, x, x, x, grad, need_weights=False)
    assert rel(out, out_ref) < 1e-2
    for g, g_ref in zip(grads, grads_ref):
        assert rel(g, g_ref) < 1e-2
