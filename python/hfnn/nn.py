"""Drop-in modules backed by hfnn's kernels."""
from __future__ import annotations

import collections
import functools
import math

import torch
import torch.nn.functional as F
from torch import nn

from torch.autograd.function import once_differentiable
from torch.nn.utils.rnn import PackedSequence

from . import _dispatch, _ops
from ._families import lstm as _lstm_family
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


class MultiheadAttention(nn.MultiheadAttention):
    """torch.nn.MultiheadAttention through one hfnn op a call: the same constructor, parameters and
    state_dict keys (a subclass: checkpoints move freely, to_hfnn / to_torch switch classes in place).

    A batched call (self- or cross-attention, kdim/vdim, batch_first either way, with or without
    bias, dropout in training) runs hfnn.multi_head_attention: the input projection read in place as
    Q, K and V, torch's SDPA core, no Python in between. Masks are applied as torch's module applies
    them (key_padding_mask and attn_mask, bool or float, 2-D or 3-D, merged with each other and with
    the is_causal hint as F.multi_head_attention_forward does, with its checks, messages and
    warnings); need_weights=True returns the weights (averaged over the heads or not) from the
    composite torch's module computes them with. Anything else runs torch's module path, counted
    with its reason in hfnn.nn.attention_fallbacks: add_bias_kv / add_zero_attn, unbatched input,
    nested tensors, a float mask that requires grad or is of another dtype than the query, and
    calls under torch.compile (which traces torch's module).
    """

    def forward(self, query, key, value, key_padding_mask=None, need_weights=True, attn_mask=None,
                average_attn_weights=True, is_causal=False):
        if not _ops.available:
            why = "op library not loaded"
        elif torch.compiler.is_compiling():  # Dynamo traces torch's module; hfnn's op has no fake kernel
            why = "torch.compile"
        else:
            # One C++ call checks the call, runs it (the table's winner for its key under
            # HFNN_DISPATCH_DB, where hfnn.dispatch_stats() counts it; else torch's pick of core) or
            # says why torch's module runs it instead.
            out, weights, why = torch.ops.hfnn.multi_head_attention_dispatch(
                query, key, value, self.num_heads, self.in_proj_weight, self.in_proj_bias, self.out_proj.weight,
                self.out_proj.bias, self.batch_first, bool(is_causal), self.dropout if self.training else 0.0,
                bool(need_weights), key_padding_mask, attn_mask, self.bias_k is not None or self.add_zero_attn, True,
                bool(average_attn_weights), self.q_proj_weight, self.k_proj_weight, self.v_proj_weight,
                _dispatch.active)
            if out is not None:
                attention_calls["hfnn"] += 1
                _mha_family.warn_mismatched_masks(query, key_padding_mask, attn_mask)
                return out, weights
        attention_fallbacks[why] += 1
        # torch's own forward (not HFNN_DISPATCH_DB's wrapper of it, which would route the call again).
        torch_forward = _mha_family.torch_forward or super().forward.__func__
        return torch_forward(self, query, key, value, key_padding_mask=key_padding_mask, need_weights=need_weights,
                             attn_mask=attn_mask, average_attn_weights=average_attn_weights, is_causal=is_causal)


# ---- LSTM -----------------------------------------------------------------------------------------

# What LSTM calls ran, per call: a variant's name (the first layer's), or "torch" for torch's module
# path, and the reason of each of those. Counted for hfnn.nn.LSTM always, and for plain nn.LSTM
# under HFNN_DISPATCH_DB; hfnn.dispatch_stats() reports them as the "lstm" family's "train" pass.
lstm_calls: "collections.Counter[str]" = collections.Counter()
lstm_fallbacks: "collections.Counter[str]" = collections.Counter()

# The dtypes hfnn's LSTM kernels compute in (16-bit with float32 accumulation and cell state).
_LSTM_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
# The built-in choice where no table names a winner: the variants to try in order (the first whose
# lstm_supports() takes a layer runs it), () for cuDNN. Measured data, not rules: the crossover grid
# (bench/lstm.py --grid: hidden 128..4,096 and 127..4,095 x batch 1..256, 100 steps, fwd+bwd against
# cuDNN) keeps per point the variants at least 1.1x faster than cuDNN (python/hfnn/_lstm_builtin.py,
# generated by bench/lstm.py --builtin-out; bench/README.md, "nn.LSTM kernels"). A shape takes its
# nearest grid point of its own class (hidden a multiple of 4 or not) in log2 of hidden and of
# batch; one beyond the grid by more than half a grid step (hidden under 91, or under 90 not a
# multiple of 4, or over 5,792; batch over 362) keeps cuDNN, as does a dtype the grid did not time.
# float16 has a map of its own: hfnn's kernels are bf16's, but torch runs cuDNN's persistent kernel
# in float16 at some shapes (one layer, one direction, hidden up to 1,024, hidden and input multiples
# of 128, batch a multiple of 8 up to 128), where it beats hfnn's at batch 64 and 128
# (bench/README.md, "cuDNN's persistent kernel as a variant"): bf16's map ran hfnn's kernels there,
# slower than torch. The grid is one layer, one direction, input = hidden: where torch would run its
# standard kernel instead (stacked or bidirectional modules, other inputs) the map keeps cuDNN at
# points hfnn may win, never the other way round.
# `hfnn tune` measures every key it stores in any case.
# Cached: it runs on every call of a module without a tuned key.
@functools.lru_cache(maxsize=256)
def _lstm_builtin_order(batch: int, hidden: int, dtype: torch.dtype) -> tuple:
    from . import _lstm_builtin

    timed = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}.get(dtype)
    orders = _lstm_builtin.ORDERS.get(timed) if timed else None
    if not orders or batch < 1 or hidden < 1:
        return ()

    def nearest(value: int, grid) -> "int | None":
        grid = sorted(grid)
        if value < grid[0] / 2 ** 0.5 or value > grid[-1] * 2 ** 0.5:
            return None
        return min(grid, key=lambda g: (abs(math.log2(value / g)), g))

    # Hidden sizes not a multiple of 4 run on rows that are not whole 16-byte groups (the float32
    # history padded and kept twice, the step GEMMs' and weight GEMMs' rows unaligned), and were
    # measured slower or faster against cuDNN than their neighbours, so a grid point answers for its
    # own class only: the grid measures both (bench/results/lstm_grid-h100.json,
    # lstm_grid_rows_not_x4-h100.json).
    same_class = [h for h in orders if (h % 4 == 0) == (hidden % 4 == 0)]
    h = nearest(hidden, same_class) if same_class else None
    b = None if h is None else nearest(batch, orders[h])
    return () if h is None or b is None else tuple(orders[h][b])


# Tests only (tests/python/test_lstm.py, with stand-in ops): take hfnn's path for CPU tensors too.
_lstm_takes_cpu = False
# Set by `hfnn profile`'s start-up hook (hfnn._startup): hfnn's path records each call's shape in a
# profiler scope, as the profiler records aten::lstm for torch's path (which then does not run).
_lstm_profiled = False


def _lstm_shape_scope(m: nn.LSTM, input: torch.Tensor) -> str:
    """`hfnn.shape|lstm|<input shape>|<dtype>|<settings>`: the record kernels/lstm's key_of reads,
    with the settings the profiler writes for aten::lstm, in the dtype the call computes in."""
    dropout = int(m.dropout > 0 and m.training)
    settings = (f"input={m.input_size},hidden={m.hidden_size},layers={m.num_layers},"
                f"bidirectional={int(m.bidirectional)},batch_first={int(m.batch_first)},bias={int(m.bias)},proj=0,"
                f"dropout={dropout}")
    dtype = str(_lstm_compute_dtype(input)).replace("torch.", "")
    return f"hfnn.shape|lstm|[{','.join(str(d) for d in input.shape)}]|{dtype}|{settings}"


def _lstm_compute_dtype(input: torch.Tensor) -> torch.dtype:
    """The dtype a call computes in, which torch's module returns its outputs in: the input's own
    without autocast; under autocast on CUDA, float16 where cuDNN runs it, whatever the autocast
    dtype (torch's autocast wrapper of _cudnn_rnn casts input, states and weights to half: under
    bfloat16 autocast nn.LSTM returns float16), else the autocast dtype."""
    device = input.device.type
    if input.dtype != torch.float64 and torch.is_autocast_enabled(device):
        if device == "cuda" and torch.backends.cudnn.enabled and torch.backends.cudnn.is_available():
            return torch.float16
        return torch.get_autocast_dtype(device)
    return input.dtype


def _lstm_fallback_reason(m: nn.LSTM, input) -> str | None:
    """None where hfnn's ops compute what torch's module would; else why not, in a few words."""
    if not hasattr(torch.ops.hfnn, "lstm_layer_fwd"):
        return "op library has no LSTM kernels"
    if isinstance(input, PackedSequence):
        return "PackedSequence"
    if m.proj_size > 0:
        return "proj_size"
    if input.dim() != 3:
        return "unbatched input"
    if not input.is_cuda and not (_lstm_takes_cpu and input.device.type == "cpu"):
        return "CPU tensor" if input.device.type == "cpu" else f"{input.device.type} tensor"
    if _lstm_compute_dtype(input) not in _LSTM_DTYPES:
        return "dtype not float32/bfloat16/float16"
    if torch.compiler.is_compiling():  # Dynamo traces torch's module; hfnn's ops have no fake kernels yet
        return "torch.compile"
    return None


def _lstm_table_choice(m: nn.LSTM, input: torch.Tensor, plain: bool) -> tuple[str | None, str | None]:
    """(variant, None) to run: the table's winner for the call's key, or "" for the built-in choice;
    (None, reason) for torch's path. Asks the table only under HFNN_DISPATCH_DB."""
    if _dispatch.active and hasattr(torch.ops.hfnn, "lstm_choose"):
        batch, steps = (input.shape[0], input.shape[1]) if m.batch_first else (input.shape[1], input.shape[0])
        dropout = bool(m.dropout > 0 and m.training and m.num_layers > 1)  # the key's dropout (lstm_family.cpp)
        key = (m.input_size, m.hidden_size, m.num_layers, batch, steps,
               _lstm_compute_dtype(input), m.bidirectional, m.batch_first, m.bias, dropout)
        device = input.get_device()
        if device >= 0 and device != torch.cuda.current_device():  # lstm_choose reads the current GPU's winners
            with torch.cuda.device(device):
                choice = torch.ops.hfnn.lstm_choose(*key)
        else:
            choice = torch.ops.hfnn.lstm_choose(*key)
        if choice == "torch":
            return None, "torch won the tuning"
        if choice:
            return choice, None
        if plain and _dispatch.policy == "torch":
            return None, "shape not tuned"
    batch = input.shape[0] if m.batch_first else input.shape[1]
    if not _lstm_builtin_order(batch, m.hidden_size, _lstm_compute_dtype(input)):
        return None, "built-in choice: cuDNN"
    return "", None


def _lstm_layer_variant(wanted: str, x: torch.Tensor, w_hh: torch.Tensor) -> str | None:
    """The variant that runs one layer: `wanted` where it takes the layer's input, for the built-in
    choice ("") the first of _lstm_builtin_order's that does; None when none does."""
    if wanted:
        return wanted if torch.ops.hfnn.lstm_supports(x, w_hh, wanted) else None
    have = torch.ops.hfnn.lstm_variants()
    order = _lstm_builtin_order(x.shape[1], w_hh.shape[1], x.dtype)
    return next((v for v in order if v in have and torch.ops.hfnn.lstm_supports(x, w_hh, v)), None)


class _LSTMLayer(torch.autograd.Function):
    """One layer in one direction: hfnn::lstm_layer_fwd, and hfnn::lstm_layer_bwd reading the
    forward's workspace. x [T, B, I] time-major; outputs y [T, B, H], h_n and c_n [B, H]."""

    @staticmethod
    def forward(ctx, x, w_ih, w_hh, b_ih, b_hh, h0, c0, reverse: bool, variant: str):
        y, h_n, c_n, workspace = torch.ops.hfnn.lstm_layer_fwd(x, w_ih, w_hh, b_ih, b_hh, h0, c0, reverse, variant)
        ctx.save_for_backward(x, w_ih, w_hh, h0, c0, workspace)
        ctx.reverse, ctx.variant, ctx.has_bias = reverse, variant, b_ih is not None
        ctx.set_materialize_grads(False)  # an unused h_n or c_n gives the op None, not zeros
        return y, h_n, c_n

    @staticmethod
    @once_differentiable
    def backward(ctx, dy, dh_n, dc_n):
        x, w_ih, w_hh, h0, c0, workspace = ctx.saved_tensors
        if dy is None:  # only h_n or c_n reached the loss
            dy = x.new_zeros(x.shape[0], x.shape[1], w_hh.shape[1])
        dx, dw_ih, dw_hh, db, dh0, dc0 = torch.ops.hfnn.lstm_layer_bwd(
            dy.contiguous(), None if dh_n is None else dh_n.contiguous(), None if dc_n is None else dc_n.contiguous(),
            x, w_ih, w_hh, h0, c0, workspace, ctx.reverse, ctx.variant)
        db = db if ctx.has_bias else None
        return dx, dw_ih, dw_hh, db, db, dh0 if h0 is not None else None, dc0 if c0 is not None else None, None, None


def _lstm_check(m: nn.LSTM, input: torch.Tensor, hx) -> None:
    """torch's own argument checks of a batched call, with torch's messages (nn.LSTM.forward)."""
    if hx is not None and (hx[0].dim() != 3 or hx[1].dim() != 3):
        raise RuntimeError(f"For batched 3-D input, hx and cx should also be 3-D but got ({hx[0].dim()}-D, "
                           f"{hx[1].dim()}-D) tensors")
    if hx is None:
        m.check_input(input, None)
    else:
        m.check_forward_args(input, hx, None)


class _LSTMRefused(Exception):
    """A layer's input that no variant takes (its message: the reason): torch's path runs the call."""


def _lstm_run(m: nn.LSTM, input: torch.Tensor, hx, variant: str, flip_direction: bool = False):
    """The module's forward through hfnn's ops, every layer and direction with `variant` ("": the
    built-in choice per layer): (output, (h_n, c_n)) in torch's layout, and the variant the first
    layer ran. Raises _LSTMRefused where no variant takes a layer's input (checked per layer: a
    layer's input size is the previous one's hidden size times the directions).
    flip_direction runs each direction over the other time order: the tuner's planted wrong candidate."""
    _lstm_check(m, input, hx)
    dtype = _lstm_compute_dtype(input)
    x = (input.transpose(0, 1) if m.batch_first else input).to(dtype).contiguous()
    dirs = 2 if m.bidirectional else 1
    h0 = c0 = None
    if hx is not None:
        h0, c0 = hx[0].to(dtype), hx[1].to(dtype)
    hs, cs = [], []
    first = None
    for layer in range(m.num_layers):
        outs = []
        for d in range(dirs):
            suffix = f"_l{layer}" + ("_reverse" if d else "")
            w_ih = getattr(m, "weight_ih" + suffix).to(dtype)
            w_hh = getattr(m, "weight_hh" + suffix).to(dtype)
            b_ih = getattr(m, "bias_ih" + suffix).to(dtype) if m.bias else None
            b_hh = getattr(m, "bias_hh" + suffix).to(dtype) if m.bias else None
            chosen = _lstm_layer_variant(variant, x, w_hh)
            if chosen is None:
                raise _LSTMRefused("winner refused the input" if variant else "input no variant takes")
            first = first or chosen
            i = layer * dirs + d
            y, h_n, c_n = _LSTMLayer.apply(x, w_ih.contiguous(), w_hh.contiguous(), b_ih, b_hh,
                                           None if h0 is None else h0[i].contiguous(),
                                           None if c0 is None else c0[i].contiguous(),
                                           (d == 1) != flip_direction, chosen)
            outs.append(y)
            hs.append(h_n)
            cs.append(c_n)
        x = outs[0] if dirs == 1 else torch.cat(outs, dim=2)
        if m.dropout > 0 and m.training and layer < m.num_layers - 1:  # between layers, as torch does
            x = F.dropout(x, m.dropout, training=True)
    output = x.transpose(0, 1) if m.batch_first else x
    return output, (torch.stack(hs), torch.stack(cs)), first


def _lstm_route(m: nn.LSTM, input, hx, plain: bool):
    """(output, (h_n, c_n)) through hfnn's ops, or None: torch's path runs the call. Counts what ran
    (lstm_calls) and why torch's path did (lstm_fallbacks). plain: a torch nn.LSTM under
    HFNN_DISPATCH_DB, whose untuned keys stay torch's (HFNN_DISPATCH_POLICY=torch)."""
    why = _lstm_fallback_reason(m, input)
    if why is None:
        variant, why = _lstm_table_choice(m, input, plain)
        if why is None:
            try:
                if _lstm_profiled:
                    with torch.autograd.profiler.record_function(_lstm_shape_scope(m, input)):
                        output, state, ran = _lstm_run(m, input, hx, variant)
                else:
                    output, state, ran = _lstm_run(m, input, hx, variant)
                lstm_calls[ran] += 1
                return output, state
            except _LSTMRefused as refused:
                why = str(refused)
    lstm_calls["torch"] += 1
    lstm_fallbacks[why] += 1
    return None


class LSTM(nn.LSTM):
    """torch.nn.LSTM through hfnn's LSTM kernels: the same constructor, parameters, state_dict keys
    and flatten_parameters (a subclass: checkpoints move freely, to_hfnn / to_torch switch classes
    in place).

    A batched call on CUDA in float32, bfloat16 or float16 runs each layer and direction as one
    hfnn op pair (hfnn::lstm_layer_fwd, and lstm_layer_bwd in the backward reading the forward's
    workspace): layers stacked, the directions' outputs concatenated on the feature dim, dropout
    between layers in training as torch applies it, h0/c0 given or zero, (output, (h_n, c_n)) in
    torch's layout. Under autocast it computes in the dtype cuDNN's LSTM does, float16 whatever the
    autocast dtype (input, states and weights cast once; outputs in that dtype).

    Which variant: under HFNN_DISPATCH_DB the key's tuned winner (torch's module where torch won);
    otherwise hfnn's built-in choice from the measurements so far (_lstm_builtin_order): the
    persistent kernel at hidden >= 512 where batch <= 4 or batch x hidden <= 16,384, the step loop
    in 16-bit at batch >= 16, cuDNN elsewhere (until bench/lstm.py --grid measures the crossover).

    Anything else runs torch's nn.LSTM.forward, counted with its reason in hfnn.nn.lstm_fallbacks:
    an op library without LSTM kernels, CPU tensors, PackedSequence, proj_size > 0, unbatched input,
    other dtypes, an input no variant takes, torch winning the tuning, torch.compile tracing.
    """

    def forward(self, input, hx=None):
        out = _lstm_route(self, input, hx, plain=False)
        if out is not None:
            return out
        # torch's own forward (not HFNN_DISPATCH_DB's wrapper of it, which would route the call again).
        torch_forward = _lstm_family.torch_forward or nn.LSTM.forward
        return torch_forward(self, input, hx)
