"""`hfnn_mid` (torch's cuDNN forward, then hfnn's one-block-a-head backward of kernels/
multihead_attention/mid_attention.h for sequences of up to 256 tokens) through the
hfnn::multi_head_attention op, against float64.

GPU only. Swept densely: every query length from 1 to 256 with key lengths equal, shorter and
longer, every head size it claims (16, 32, 48, 64), causal or not, batch_first both ways, self-,
encoder-decoder and cross-attention, fp16 and bf16; then batch and head counts up to the issue's
[200, 256, 1024, 16] (3,200 blocks), the limits supports() states, run-to-run bit equality, CUDA
graph capture, and which backward kernel each kind of shape launches (Hopper's wgmma one where due). Where cuDNN's forward does not take a shape, supports() says no and the case is
skipped (counted: the sweep asserts that most cases ran).
"""
import itertools

import pytest
import torch
from torch import nn

from conftest import requires_gpu
from test_attention import (TOLERANCE, assert_bit_identical_and_under_graph_replay,
                            assert_refuses_three_projections_and_masks, core_failures, gpu_case, rel)

CORE = "hfnn_mid"
HEAD_DIMS = [16, 32, 48, 64]


def supported(q, k, v, heads, batch_first, causal, dropout=0.0, **kw):
    return torch.ops.hfnn.multi_head_attention_supports(q, k, v, heads, batch_first, causal, dropout, CORE, **kw)


def check(embed, heads, batch, length, kv_length, mode, batch_first, causal, dtype):
    """(ran, failures): whether the core took the case, and its errors past the tolerance."""
    return core_failures(CORE, embed, heads, batch, length, kv_length, mode, batch_first, causal, dtype)


@requires_gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_gpu_every_length_to_256_and_every_head_size(dtype):
    # Head sizes cycle with the length, so every head size meets short and long sequences; keys
    # equal, shorter and longer in turn, within 256.
    failures, ran = [], 0
    for length in range(1, 257):
        head_dim = HEAD_DIMS[length % len(HEAD_DIMS)]
        heads = 1 + length % 3
        mode = ("self", "cross", "kv")[length % 3]
        kv_length = length if mode == "self" else (length * 7 + 3) % 256 + 1
        causal = mode == "self" and length % 2 == 0  # torch's module takes a causal mask of [L, L] only
        took, f = check(heads * head_dim, heads, 1 + length % 4, length, kv_length, mode, length % 5 != 0, causal,
                        dtype)
        ran += took
        failures += f
    assert not failures, "\n".join(failures[:30])
    print(f"{dtype}: ran {ran} of 256 lengths")
    assert ran >= 128, ran  # cuDNN's forward takes most of them


@requires_gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_gpu_head_sizes_by_lengths_grid(dtype):
    # Every head size at the lengths that matter: one token, a tile, a step of 64 keys and their
    # neighbours, the limit.
    failures, ran = [], 0
    lengths = [1, 2, 15, 16, 17, 63, 64, 65, 127, 128, 129, 191, 192, 193, 200, 255, 256]
    for head_dim, length in itertools.product(HEAD_DIMS, lengths):
        for mode, causal in [("self", False), ("self", True), ("cross", False)]:
            kv_length = length if mode == "self" else 257 - length
            took, f = check(2 * head_dim, 2, 3, length, kv_length, mode, True, causal, dtype)
            ran += took
            failures += f
    assert not failures, "\n".join(failures[:30])
    print(f"{dtype}: ran {ran} of {len(HEAD_DIMS) * len(lengths) * 3}")
    assert ran >= len(HEAD_DIMS) * len(lengths), ran


@requires_gpu
@pytest.mark.parametrize("batch,heads,head_dim,length", [(1, 1, 64, 256), (200, 16, 64, 256), (1, 40, 32, 256),
                                                         (257, 12, 64, 200), (3, 16, 64, 129), (64, 1, 48, 77)])
def test_gpu_batch_and_head_counts(batch, heads, head_dim, length):
    took, failures = check(heads * head_dim, heads, batch, length, length, "self", True, False, torch.bfloat16)
    assert not failures, "\n".join(failures)
    if head_dim == 64 and length == 256:
        assert took  # the config 0 shape: cuDNN's forward and this backward both take it


def causal_reference(q, kv, w_in, b_in, w_out, b_out, heads):
    """Causal attention with a top-left mask of [L, S] (query i sees keys 0 to i, as SDPA's
    is_causal) through these projections, batch first, in the tensors' own dtype (float64 here)."""
    e = q.shape[-1]
    qp, kp, vp = q @ w_in[:e].T + b_in[:e], kv @ w_in[e:2 * e].T + b_in[e:2 * e], kv @ w_in[2 * e:].T + b_in[2 * e:]
    qh, kh, vh = (t.unflatten(-1, (heads, e // heads)).transpose(1, 2) for t in (qp, kp, vp))
    scores = qh @ kh.transpose(-1, -2) / (e // heads) ** 0.5
    sees = torch.ones(q.shape[1], kv.shape[1], dtype=torch.bool, device=q.device).tril()
    o = scores.masked_fill(~sees, float("-inf")).softmax(-1) @ vh
    return o.transpose(1, 2).flatten(2) @ w_out.T + b_out


def test_causal_reference_is_torchs_at_equal_lengths():
    """The reference above against torch's module with its square causal mask (CPU, float64)."""
    torch.manual_seed(0)
    m = nn.MultiheadAttention(64, 4, batch_first=True, dtype=torch.float64)
    x = torch.randn(2, 9, 64, dtype=torch.float64)
    mask = nn.Transformer.generate_square_subsequent_mask(9, dtype=torch.float64)
    want = m(x, x, x, attn_mask=mask, need_weights=False)[0]
    got = causal_reference(x, x, m.in_proj_weight, m.in_proj_bias, m.out_proj.weight, m.out_proj.bias, 4)
    assert torch.allclose(got, want, atol=1e-12, rtol=1e-10)
    # and a key the queries may not see changes nothing
    x2 = torch.cat([x, torch.randn(2, 3, 64, dtype=torch.float64)], 1)
    got2 = causal_reference(x, x2, m.in_proj_weight, m.in_proj_bias, m.out_proj.weight, m.out_proj.bias, 4)
    assert torch.allclose(got2, want, atol=1e-12, rtol=1e-10)


# Causal with fewer queries than keys: the six shapes first run on an H200 (thirty-first session),
# then every key count the swizzled kernel takes (64 to 256 in steps of 64) and two it does not,
# each with query counts at every boundary a 16-row tile or a 64-key step has below it.
FEWER_QUERIES = sorted({(1, 256), (64, 128), (64, 256), (65, 192), (128, 256), (192, 256)} | {
    (q, kv) for kv in (64, 100, 128, 192, 200, 256)
    for q in (1, 2, 3, 7, 8, 9, 15, 16, 17, 31, 32, 33, 47, 48, 49, 63, 64, 65, 127, 128, 129, 191, 192, 193, 255)
    if q < kv})


@requires_gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_gpu_causal_with_fewer_queries_than_keys(dtype):
    """Causal with fewer queries than keys, which the other tests (causal self-attention) never
    make: in Hopper's swizzled kernel a step whose keys all come after every query row takes no
    product (its keys' dK and dV are zero). Output and every gradient against float64, at every
    shape of FEWER_QUERIES the core takes (supports() says which: cuDNN's forward may refuse)."""
    heads, embed = 2, 128
    failures, ran = [], 0
    for length, kv_length in FEWER_QUERIES:
        torch.manual_seed(length * 1000 + kv_length)
        m = nn.MultiheadAttention(embed, heads, batch_first=True, device="cuda", dtype=dtype)
        q = torch.randn(3, length, embed, device="cuda", dtype=dtype, requires_grad=True)
        kv = torch.randn(3, kv_length, embed, device="cuda", dtype=dtype, requires_grad=True)
        if not supported(q, kv, kv, heads, True, True):
            continue
        ran += 1
        out = torch.ops.hfnn.multi_head_attention(q, kv, kv, heads, m.in_proj_weight, m.in_proj_bias,
                                                  m.out_proj.weight, m.out_proj.bias, True, True, 0.0, CORE)
        grad = torch.randn_like(out)
        leaves = [q, kv, m.in_proj_weight, m.in_proj_bias, m.out_proj.weight, m.out_proj.bias]
        grads = torch.autograd.grad(out, leaves, grad)
        ref_leaves = [t.detach().double().requires_grad_() for t in leaves]
        ref = causal_reference(*ref_leaves, heads)
        ref_grads = torch.autograd.grad(ref, ref_leaves, grad.double())
        errs = [rel(out, ref)] + [rel(g, r) for g, r in zip(grads, ref_grads)]
        if max(errs) >= TOLERANCE[dtype]:
            failures.append(f"{dtype} causal {length} x {kv_length}: errors {', '.join(f'{e:.1e}' for e in errs)}")
    assert not failures, "\n".join(failures[:30])
    print(f"{dtype}: ran {ran} of {len(FEWER_QUERIES)} shapes")
    assert ran >= 6, ran  # the six of the first run took the core on the H200


def test_fewer_queries_shapes_cover_the_first_run_and_every_step():
    """The GPU test's shapes: the first six, queries fewer than keys everywhere, every key count of
    64 to 256 in steps of 64 with query counts on both sides of 16 and 64, and key counts the
    swizzled kernel does not take (100, 200)."""
    assert {(1, 256), (64, 128), (64, 256), (65, 192), (128, 256), (192, 256)} <= set(FEWER_QUERIES)
    assert all(q < kv for q, kv in FEWER_QUERIES)
    for kv in (64, 128, 192, 256):
        qs = {q for q, k in FEWER_QUERIES if k == kv}
        assert {1, 15, 16, 17, 63} <= qs and max(qs) == kv - 1, (kv, sorted(qs))
    assert {k for _, k in FEWER_QUERIES} == {64, 100, 128, 192, 200, 256}


@requires_gpu
def test_gpu_supports_is_exactly_its_limits():
    def ok(length=256, kv_length=None, head_dim=64, heads=2, dtype=torch.bfloat16, dropout=0.0, **kw):
        q = torch.randn(2, length, heads * head_dim, device="cuda", dtype=dtype)
        kv = q if kv_length is None else torch.randn(2, kv_length, heads * head_dim, device="cuda", dtype=dtype)
        return supported(q, kv, kv, heads, True, False, dropout, **kw)

    assert ok() and ok(dtype=torch.float16)
    assert not ok(length=257) and not ok(length=64, kv_length=257)  # longer than a block keeps
    assert not ok(head_dim=80) and not ok(head_dim=128) and not ok(head_dim=24)  # 16, 32, 48 or 64
    assert not ok(dtype=torch.float32)  # tensor-core products in 16-bit only
    assert not ok(dropout=0.1)
    assert_refuses_three_projections_and_masks(CORE, 256)
    m = nn.MultiheadAttention(256, 2, batch_first=True, device="cuda", dtype=torch.bfloat16)
    big = torch.randn(2, 257, 256, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(RuntimeError, match="does not take"):
        torch.ops.hfnn.multi_head_attention(big, big, big, 2, m.in_proj_weight, m.in_proj_bias,
                                            m.out_proj.weight, m.out_proj.bias, True, False, 0.0, CORE)


@requires_gpu
def test_gpu_bit_identical_run_to_run_and_under_graph_replay():
    assert_bit_identical_and_under_graph_replay(CORE, 16, 256)


@requires_gpu
def test_gpu_matches_cudnns_own_backward():
    # The same forward (cuDNN's), two backwards: hfnn's and cuDNN's agree within bf16 rounding on
    # the head shape, and hfnn's is closer to float64 or as close.
    failures = []
    for length, causal in [(256, False), (256, True), (100, False)]:
        ours, (q, k, v), grad, (out_ref, grads_ref), errs_torch, _ = gpu_case(
            1024, 16, 4, length, length, "self", True, causal, torch.bfloat16)
        leaves = [q] + list(ours.parameters())
        errs = {}
        for core in ("sdpa_cudnn", CORE):
            if not supported(q, k, v, 16, True, causal) or not torch.ops.hfnn.multi_head_attention_supports(
                    q, k, v, 16, True, causal, 0.0, "sdpa_cudnn"):
                break
            out = torch.ops.hfnn.multi_head_attention(q, k, v, 16, ours.in_proj_weight, ours.in_proj_bias,
                                                      ours.out_proj.weight, ours.out_proj.bias, True, causal, 0.0,
                                                      core)
            grads = torch.autograd.grad(out, leaves, grad)
            errs[core] = max(rel(g, r) for g, r in zip(grads, grads_ref))
        if len(errs) == 2 and errs[CORE] > 1.5 * errs["sdpa_cudnn"] + 1e-3:
            failures.append(f"L={length} causal={causal}: {errs}")
    assert not failures, "\n".join(failures)


@requires_gpu
def test_gpu_runs_the_kernel_its_shape_calls_for():
    # Which backward kernel a call launches (template arguments <T, head size, exact, causal,
    # swizzled>, read from the profiler's kernel names): on Hopper the calls of head size 64 with
    # keys in whole steps take the swizzled kernels (wgmma), causal at any query length, not causal
    # at 128 query rows or more; the others, and every call elsewhere, the padded ones. A call that
    # silently fell to a slower kernel would pass every accuracy test.
    hopper = torch.cuda.get_device_capability()[0] == 9
    cases = [  # (length, kv_length, head size, causal) -> (exact, causal, swizzled)
        ((256, 256, 64, False), ("true", "false", "true" if hopper else "false")),
        ((129, 128, 64, False), ("true", "false", "true" if hopper else "false")),
        ((100, 128, 64, False), ("false", "false", "false")),  # under 128 rows: the general kernel
        ((256, 200, 64, False), ("false", "false", "false")),  # keys not in whole steps
        ((256, 256, 64, True), ("true", "true", "true" if hopper else "false")),
        ((100, 128, 64, True), ("true", "true", "true" if hopper else "false")),  # causal: any rows
        ((256, 200, 64, True), ("false", "true", "false")),
        ((256, 256, 32, False), ("true", "false", "false")),
    ]
    failures, ran = [], 0
    for (length, kv_length, head_dim, causal), want in cases:
        heads = 2
        m = nn.MultiheadAttention(heads * head_dim, heads, batch_first=True, device="cuda", dtype=torch.bfloat16)
        q = torch.randn(3, length, heads * head_dim, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        kv = q if kv_length == length else torch.randn(3, kv_length, heads * head_dim, device="cuda",
                                                       dtype=torch.bfloat16, requires_grad=True)
        if not supported(q, kv, kv, heads, True, causal):  # cuDNN's forward refused the shape
            continue
        ran += 1
        out = torch.ops.hfnn.multi_head_attention(q, kv, kv, heads, m.in_proj_weight, m.in_proj_bias,
                                                  m.out_proj.weight, m.out_proj.bias, True, causal, 0.0, CORE)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            out.backward(torch.randn_like(out))
            torch.cuda.synchronize()
        names = [e.name for e in prof.events() if "mid_bwd_kernel" in e.name]
        expected = f"{head_dim}, {want[0]}, {want[1]}, {want[2]}>"  # head sizes 32 and 64: their own kD
        if len(names) != 1 or expected not in names[0]:
            failures.append(f"{(length, kv_length, head_dim, causal)}: want ...{expected}, ran {names}")
    assert not failures, "\n".join(failures)
    assert ran >= 4, f"cuDNN's forward took only {ran} of {len(cases)} cases"
