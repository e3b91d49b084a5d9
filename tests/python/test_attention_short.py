"""hfnn's own attention core for short sequences (`hfnn_short`, kernels/multihead_attention/
short_attention.h) through the hfnn::multi_head_attention op, against float64.

GPU only (the core is a CUDA kernel; on the CPU the op says it does not take any input, which
tests/python/test_attention.py checks). Swept densely: every query length from 1 to 128, key
lengths shorter, equal and longer, every head size it claims (16 to 128 in steps of 16), causal
or not, batch_first both ways, self-, encoder-decoder and cross-attention, fp16 and bf16; then batch
and head counts from 1 to 40,000 blocks, the limits supports() states and the inputs it refuses,
run-to-run bit equality, and CUDA graph capture.
"""
import itertools

import pytest
import torch
from torch import nn

from conftest import requires_gpu
from test_attention import (assert_bit_identical_and_under_graph_replay, assert_refuses_three_projections_and_masks,
                            core_failures)

CORE = "hfnn_short"
HEAD_DIMS = [16, 32, 48, 64, 80, 96, 112, 128]


def supported(q, k, v, heads, batch_first, causal, dropout=0.0, **kw):
    return torch.ops.hfnn.multi_head_attention_supports(q, k, v, heads, batch_first, causal, dropout, CORE, **kw)


def must_fit(length, kv_length, head_dim):
    """Where the core must say yes on an H100 or H200 (227 KB of shared memory a block): its
    backward block holds Q, K, V and dO, then P and dS in 16-bit: every shape up to 128 x 128 x 128
    (about 205 KB)."""
    lp, sp, ld = -(-length // 16) * 16, -(-kv_length // 16) * 16, head_dim + 8
    return (2 * lp + 2 * sp) * ld * 2 + 2 * lp * (sp + 8) * 2 + lp * 4 + 7 * 128 <= 227 * 1024


def check(embed, heads, batch, length, kv_length, mode, batch_first, causal, dtype):
    """Errors of the core's output and every gradient that exceed the tolerance (or 4x torch's own
    module's error in the same dtype); asserts that the core takes every case that fits a block,
    and skips those it refuses that do not."""
    took, failures = core_failures(CORE, embed, heads, batch, length, kv_length, mode, batch_first, causal, dtype)
    if not took:
        assert not must_fit(length, kv_length, embed // heads), (embed, heads, batch, length, kv_length, mode)
    return failures


@requires_gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_gpu_every_length_to_128_and_every_head_size(dtype):
    # Head sizes cycle with the length, so every head size meets short and long sequences.
    failures = []
    for length in range(1, 129):
        head_dim = HEAD_DIMS[length % len(HEAD_DIMS)]
        heads = 1 + length % 3
        mode = ("self", "cross", "kv")[length % 3]
        # keys equal, shorter and longer in turn, within the core's 128
        kv_length = length if mode == "self" else (length * 7 + 3) % 128 + 1
        causal = mode == "self" and length % 2 == 0  # torch's module takes a causal mask of [L, L] only
        failures += check(heads * head_dim, heads, 1 + length % 4, length, kv_length, mode, length % 5 != 0, causal,
                          dtype)
    assert not failures, "\n".join(failures[:30])


@requires_gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_gpu_head_sizes_by_lengths_grid(dtype):
    # Every head size at the lengths that matter: one token, a tile and its neighbours, the limit.
    failures = []
    for head_dim, length in itertools.product(HEAD_DIMS, [1, 2, 15, 16, 17, 31, 33, 63, 64, 65, 100, 127, 128]):
        for mode, causal in [("self", False), ("self", True), ("cross", False)]:
            kv_length = length if mode == "self" else 129 - length
            failures += check(2 * head_dim, 2, 3, length, kv_length, mode, True, causal, dtype)
    assert not failures, "\n".join(failures[:30])


@requires_gpu
@pytest.mark.parametrize("batch,heads,head_dim,length", [(1, 1, 16, 1), (5000, 8, 64, 64), (1, 40, 32, 128),
                                                         (257, 12, 64, 33), (3, 16, 128, 128), (64, 1, 96, 77)])
def test_gpu_batch_and_head_counts(batch, heads, head_dim, length):
    failures = check(heads * head_dim, heads, batch, length, length, "self", True, False, torch.bfloat16)
    assert not failures, "\n".join(failures)


@requires_gpu
def test_gpu_supports_is_exactly_its_limits():
    def ok(length=64, kv_length=None, head_dim=64, heads=2, dtype=torch.bfloat16, dropout=0.0, **kw):
        q = torch.randn(2, length, heads * head_dim, device="cuda", dtype=dtype)
        kv = q if kv_length is None else torch.randn(2, kv_length, heads * head_dim, device="cuda", dtype=dtype)
        return supported(q, kv, kv, heads, True, False, dropout, **kw)

    assert ok() and ok(length=1) and ok(length=128) and ok(length=128, kv_length=1) and ok(head_dim=16)
    assert ok(head_dim=128) and ok(dtype=torch.float16) and ok(length=128, head_dim=96)
    assert not ok(length=129) and not ok(length=64, kv_length=129)  # longer than a block keeps
    assert not ok(head_dim=8) and not ok(head_dim=24) and not ok(head_dim=144)  # multiples of 16 to 128
    assert not ok(dtype=torch.float32)  # tensor-core products in 16-bit only
    assert not ok(dropout=0.1)
    assert_refuses_three_projections_and_masks(CORE, 64)
    # 128 x 128 with heads of 128, the largest block (about 210 KB backward): it runs where the device
    # has the shared memory (H100, H200) and is refused, not crashed, where it has not.
    big = torch.randn(2, 128, 256, device="cuda", dtype=torch.bfloat16)
    said = supported(big, big, big, 2, True, False)
    if torch.cuda.get_device_capability() == (9, 0):  # H100, H200: 227 KB a block
        assert said
    m = nn.MultiheadAttention(256, 2, batch_first=True, device="cuda", dtype=torch.bfloat16)
    if said:
        out = torch.ops.hfnn.multi_head_attention(big.requires_grad_(), big, big, 2, m.in_proj_weight,
                                                  m.in_proj_bias, m.out_proj.weight, m.out_proj.bias, True, False,
                                                  0.0, CORE)
        out.float().sum().backward()
        torch.cuda.synchronize()
    else:
        with pytest.raises(RuntimeError, match="does not take"):
            torch.ops.hfnn.multi_head_attention(big, big, big, 2, m.in_proj_weight, m.in_proj_bias,
                                                m.out_proj.weight, m.out_proj.bias, True, False, 0.0, CORE)


@requires_gpu
def test_gpu_bit_identical_run_to_run_and_under_graph_replay():
    assert_bit_identical_and_under_graph_replay(CORE, 64, 64)


@requires_gpu
def test_gpu_causal_rows_see_only_their_past():
    # The first query sees only the first key: its output is the first value's projection, whatever
    # the later keys hold.
    torch.manual_seed(1)
    m = nn.MultiheadAttention(64, 2, batch_first=True, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(2, 40, 64, device="cuda", dtype=torch.bfloat16)
    y = x.clone()
    y[:, 1:] = torch.randn_like(y[:, 1:]) * 100

    def call(t):
        return torch.ops.hfnn.multi_head_attention(t, t, t, 2, m.in_proj_weight, m.in_proj_bias, m.out_proj.weight,
                                                   m.out_proj.bias, True, True, 0.0, CORE)

    assert torch.equal(call(x)[:, 0], call(y)[:, 0])
