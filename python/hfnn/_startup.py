"""Start-up hook: imported (through hfnn_boot, once torch can be imported) by hfnn_startup.pth in every
Python process, but only when
HFNN_PROFILE_DIR (`hfnn profile`) or HFNN_DISPATCH_DB (training with tuned kernels, _dispatch.py)
is set: the .pth checks the variables before importing anything, so it does nothing at all otherwise.

With HFNN_DISPATCH_DB it loads the tuned table (hfnn._dispatch.install). With HFNN_PROFILE_DIR
it starts hfnn's in-process collector (profiles/collector.cpp), passes it what the database
records about the run, and makes sure the part is written however the script ends: normal exit,
an exception, Ctrl-C or SIGTERM (each step also rewrites it, so even a crash leaves the steps
finished before it). Its Python-side labels (the MultiheadAttention, hfnn.nn.LSTM and
synchronize scopes, and the one around torch's LSTM that lets the collector read its inputs) come
off at the first step after the recorded ones (after_step), so the plain steps the collector times
then, and every step after, run as without hfnn.
"""
from __future__ import annotations

import atexit
import json
import os
import signal
import socket
import sys


def _meta() -> dict:
    import torch

    from . import __version__

    meta = {
        "argv": sys.argv,
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "rank": int(os.environ.get("RANK", os.environ.get("LOCAL_RANK", "0"))),
        "world_size": int(os.environ.get("WORLD_SIZE", "1")),
        "torch": torch.__version__,
        "hfnn": __version__,
        "cuda": torch.version.cuda,
        "gpu": None,
    }
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        meta["gpu"] = {"name": props.name, "cc": f"{props.major}.{props.minor}", "sm_count": props.multi_processor_count}
    return meta


def _compute_dtype(torch, t):
    """The dtype an op computes `t` in: autocast's where autocast is on for its device and casts it
    (floating, not float64: autocast's own rule; hfnn's attention op casts once), else its own."""
    try:
        if t.is_floating_point() and t.dtype != torch.float64 and torch.is_autocast_enabled(t.device.type):
            return torch.get_autocast_dtype(t.device.type)
    except (AttributeError, TypeError, RuntimeError):  # a device type autocast does not know
        pass
    return t.dtype


# What undoes each Python-side label, run once the collector has stopped recording (after_step).
_labels = []


def after_step(*_args) -> None:
    """After a step boundary (torch.optim's global step post-hook, and hfnn.step()): once the
    collector no longer records, the labels come off. The hook itself stays registered (torch
    iterates its hooks while calling this one), as a call that returns at once."""
    if _labels:
        import torch

        if not torch.ops.hfnn.profiler_recording():
            while _labels:
                _labels.pop()()


def _record_attention_shapes(torch):
    """Wraps nn.MultiheadAttention.forward so each call is a record_function scope whose name
    carries what picks an attention kernel: `hfnn.shape|multihead_attention|<query shape>|<dtype>|
    <settings>` (the dtype the call computes in: autocast's under autocast; the settings are what
    kernels/multihead_attention's key_of reads: the masks' kinds, need_weights and average, kdim and
    vdim). The collector turns such scopes into shape records (with their CPU and CUDA time)
    and keeps them out of the op table. Only in profiled processes."""
    from torch import nn

    original = nn.MultiheadAttention.forward

    def mask_kind(mask, query, with_dims):
        """0, or the mask's kind as the key names it (bool2d, float3d, ...; bool, float without
        dims), or "other" for one hfnn's op does not take: another dtype than the query's, another
        device, a float mask that requires grad."""
        if mask is None:
            return "0"
        if mask.dtype == torch.bool:
            kind = "bool"
        elif (mask.dtype != query.dtype or mask.device != query.device
              or (mask.requires_grad and torch.is_grad_enabled())):
            return "other"
        else:
            kind = "float"
        return f"{kind}{mask.dim()}d" if with_dims else kind

    def forward(self, query, key, value, key_padding_mask=None, need_weights=True, attn_mask=None,
                average_attn_weights=True, is_causal=False):
        inputs = "self" if query is key and key is value else "kv" if key is value else "qkv"
        kdim = "0" if self._qkv_same_embed_dim else f"1,kdim_size={self.kdim},vdim_size={self.vdim}"
        settings = (f"embed={self.embed_dim},heads={self.num_heads},kv_len={key.shape[-2] if self.batch_first else key.shape[0]},"
                    f"batch_first={int(self.batch_first)},need_weights={int(bool(need_weights))},"
                    f"attn_mask={mask_kind(attn_mask, query, True)},"
                    f"key_padding_mask={mask_kind(key_padding_mask, query, False)},"
                    f"causal={int(bool(is_causal))},inputs={inputs},bias={int(self.in_proj_bias is not None)},"
                    f"kdim={kdim},bias_kv={int(self.bias_k is not None or self.add_zero_attn)},"
                    f"dropout={int(self.training and self.dropout > 0)},average={int(bool(average_attn_weights))}")
        shape = "[" + ",".join(str(d) for d in query.shape) + "]"
        dtype = str(_compute_dtype(torch, query)).replace("torch.", "")
        with torch.autograd.profiler.record_function(f"hfnn.shape|multihead_attention|{shape}|{dtype}|{settings}"):
            return original(self, query, key, value, key_padding_mask=key_padding_mask, need_weights=need_weights,
                            attn_mask=attn_mask, average_attn_weights=average_attn_weights, is_causal=is_causal)

    forward.__wrapped__ = original
    nn.MultiheadAttention.forward = forward
    return lambda: setattr(nn.MultiheadAttention, "forward", original)


def _box_lstm_inputs(torch):
    """Wraps torch._VF.lstm, which nn.LSTM.forward calls (and hfnn.nn.LSTM's fall-back to it), in a
    record_function scope named `hfnn.inputs|lstm`: the collector asks torch for the inputs of the
    ops inside such scopes only (boxing every op's inputs was a third of its cost per op), and
    aten::lstm's inputs are what its shape record reads. Only in profiled processes."""
    from torch import _VF

    original = _VF.lstm
    record_function = torch.autograd.profiler.record_function

    def lstm(*args, **kwargs):
        with record_function("hfnn.inputs|lstm"):
            return original(*args, **kwargs)

    _VF.lstm = lstm  # found before the module's __getattr__, which forwards to torch._C._VariableFunctions
    return lambda: _VF.__dict__.pop("lstm", None)


def _record_syncs(torch):
    """Wraps torch.cuda.synchronize, torch.cuda.Stream.synchronize and torch.cuda.Event.synchronize in
    record_function scopes of those names: the host waits for the GPU in each, and no torch op runs
    in them, so without the scope the profile would not see them (the advice's host_device_sync
    counts them). Only in profiled processes."""
    import functools

    undo = []
    for owner, attr, label in ((torch.cuda, "synchronize", "torch.cuda.synchronize"),
                               (torch.cuda.Stream, "synchronize", "torch.cuda.Stream.synchronize"),
                               (torch.cuda.Event, "synchronize", "torch.cuda.Event.synchronize")):
        original = getattr(owner, attr)

        @functools.wraps(original)
        def synchronize(*args, _original=original, _label=label, **kwargs):
            with torch.autograd.profiler.record_function(_label):
                return _original(*args, **kwargs)

        setattr(owner, attr, synchronize)
        undo.append((owner, attr, original))
    return lambda: [setattr(owner, attr, original) for owner, attr, original in undo]


def _install() -> None:
    directory = os.environ["HFNN_PROFILE_DIR"]
    import torch

    from . import _ops

    if not _ops.available:
        print(f"hfnn profile: {_ops.ops_error()}; this process is not profiled", file=sys.stderr)
        return
    config = {
        "dir": directory,
        "warmup": int(os.environ.get("HFNN_PROFILE_WARMUP", "0")),
        "steps": int(os.environ.get("HFNN_PROFILE_STEPS", "0")),
        "plain_steps": int(os.environ.get("HFNN_PROFILE_PLAIN_STEPS", "0")),
        "sample": int(os.environ.get("HFNN_PROFILE_SAMPLE", "1")),
        "meta": _meta(),
    }
    _labels.append(_record_attention_shapes(torch))
    _labels.append(_box_lstm_inputs(torch))
    _labels.append(_record_syncs(torch))
    from . import nn as hfnn_nn

    hfnn_nn._lstm_profiled = True  # hfnn.nn.LSTM's own path records its shapes (aten::lstm does not run)
    _labels.append(lambda: setattr(hfnn_nn, "_lstm_profiled", False))
    if config["steps"] > 0:  # recording ends before the script does
        from torch.optim.optimizer import register_optimizer_step_post_hook

        register_optimizer_step_post_hook(after_step)
    torch.ops.hfnn.profiler_start(json.dumps(config))
    atexit.register(torch.ops.hfnn.profiler_stop)

    # SIGTERM would end the process without atexit; turn it into SystemExit so the part is written.
    if signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None):
        signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))


if os.environ.get("HFNN_DISPATCH_DB"):
    from ._dispatch import install as _install_dispatch

    _install_dispatch(os.environ["HFNN_DISPATCH_DB"])
if os.environ.get("HFNN_PROFILE_DIR"):
    _install()
