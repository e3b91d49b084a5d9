"""Drop-in modules backed by hfnn's kernels."""
from __future__ import annotations

import collections

import torch
import torch.nn.functional as F
from torch import nn

from . import _dispatch, _ops
from ._families import multihead_attention as _mha_family


def layer_norm(input: torch.Tensor, normalized_shape, weight=None, bias=None, eps: float = 1e-5) -> torch.Tensor:
    """torch.nn.functional.layer_norm through hfnn's kernels for CUDA tensors, torch's otherwise.

    Every width runs hfnn's built-in choice (measured per GPU: one of hfnn's kernels, or torch's
    where torch is faster); inputs no hfnn variant takes (float64, weight in another dtype) run
    torch's kernel inside the op, so this is always safe to call.
    """
    if isinstance(normalized_shape, int):
        normalized_shape = (normalized_shape,)
    if _ops.available and input.is_cuda:
        return torch.ops.hfnn.layer_norm(input, list(normalized_shape), weight, bias, eps)
    return F.layer_norm(input, normalized_shape, weight, bias, eps)


class LayerNorm(nn.LayerNorm):
    """torch.nn.LayerNorm with hfnn's kernels: the same constructor, parameters and state_dict keys.

    It is a subclass, so `isinstance(m, nn.LayerNorm)` still holds and checkpoints move freely between
    the two. hfnn.to_hfnn / hfnn.to_torch switch a module between the classes in place.
    """

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return layer_norm(input, self.normalized_shape, self.weight, self.bias, self.eps)


# What MultiheadAttention calls ran: hfnn's op ("hfnn"), or torch's module path, counted per reason.
# Under HFNN_DISPATCH_DB hfnn.dispatch_stats() also counts the calls hfnn's op takes, per core.
attention_calls: "collections.Counter[str]" = collections.Counter()
attention_fallbacks: "collections.Counter[str]" = collections.Counter()


def _attention_fallback_reason(m: nn.MultiheadAttention, query, key, value, key_padding_mask, need_weights,
                               attn_mask, is_causal) -> str | None:
    """None where hfnn's op computes what torch's module would; else why not, in a few words."""
    if not _ops.available:
        return "op library not loaded"
    if need_weights:
        return "need_weights=True"
    if key_padding_mask is not None:
        return "key_padding_mask"
    # Torch's module drops attn_mask for the is_causal hint when there is no padding mask and no
    # weights are returned (F.multi_head_attention_forward); anything else is a mask hfnn does not take.
    if attn_mask is not None and not is_causal:
        return "attn_mask"
    if m.bias_k is not None or m.add_zero_attn:
        return "add_bias_kv/add_zero_attn"
    if not m._qkv_same_embed_dim:
        return "kdim/vdim"
    if query.dim() != 3 or key.dim() != 3 or value.dim() != 3:
        return "unbatched input"
    if query.is_nested or key.is_nested or value.is_nested:
        return "nested tensor"
    return None


class MultiheadAttention(nn.MultiheadAttention):
    """torch.nn.MultiheadAttention through one hfnn op a call: the same constructor, parameters and
    state_dict keys (a subclass: checkpoints move freely, to_hfnn / to_torch switch classes in place).

    What the op takes (batched self- or cross-attention, need_weights=False, no masks but the causal
    hint, no add_bias_kv / add_zero_attn, no kdim / vdim) runs hfnn.multi_head_attention: the input
    projection read in place as Q, K and V, torch's SDPA core, no Python in between. Anything else
    runs torch's module path, counted with its reason in hfnn.nn.attention_fallbacks.
    """

    def forward(self, query, key, value, key_padding_mask=None, need_weights=True, attn_mask=None,
                average_attn_weights=True, is_causal=False):
        why = _attention_fallback_reason(self, query, key, value, key_padding_mask, need_weights, attn_mask, is_causal)
        if _dispatch.active and _ops.available and not torch.compiler.is_compiling():
            # Every call asks the table, as plain modules' do under HFNN_DISPATCH_DB, so
            # hfnn.dispatch_stats() counts each call and each fall-back's reason once: the winner
            # for the call's key; a key without one runs torch's pick of core in the op, as without
            # a table; None: torch's module (a call the op does not take, or torch won the tuning).
            out = torch.ops.hfnn.multi_head_attention_dispatch(
                query, key, value, self.num_heads, self.in_proj_weight, self.in_proj_bias, self.out_proj.weight,
                self.out_proj.bias, self.batch_first, bool(is_causal), self.dropout if self.training else 0.0,
                bool(need_weights), key_padding_mask, attn_mask, self.bias_k is not None or self.add_zero_attn, True)
            if out is not None:
                attention_calls["hfnn"] += 1
                return out, None
            why = why or "HFNN_DISPATCH_DB: torch's module"
        elif why is None:
            attention_calls["hfnn"] += 1
            out = torch.ops.hfnn.multi_head_attention(
                query, key, value, self.num_heads, self.in_proj_weight, self.in_proj_bias, self.out_proj.weight,
                self.out_proj.bias, self.batch_first, bool(is_causal), self.dropout if self.training else 0.0, "")
            return out, None
        attention_fallbacks[why] += 1
        # torch's own forward (not HFNN_DISPATCH_DB's wrapper of it, which would route the call again).
        torch_forward = _mha_family.torch_forward or super().forward.__func__
        return torch_forward(self, query, key, value, key_padding_mask=key_padding_mask, need_weights=need_weights,
                             attn_mask=attn_mask, average_attn_weights=average_attn_weights, is_causal=is_causal)
