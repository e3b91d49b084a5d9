"""HFNN_DISPATCH_DB: train with the winners `hfnn tune` stored, no code change.

    HFNN_DISPATCH_DB=shapes.db python train.py      (or the same under torchrun)

The start-up hook (hfnn_startup.pth -> hfnn_boot -> hfnn._startup) calls install() in every Python process when
the variable is set. The op library reads the table once into memory and registers its kernels
over torch's aten::native_layer_norm and its backward, so every LayerNorm (nn.LayerNorm,
F.layer_norm, custom modules calling them) runs the winner for its shape on this GPU, under
torch's own autograd, autocast and CUDA graphs. A key without a winner runs torch's kernel
(HFNN_DISPATCH_POLICY=torch, the default) or hfnn's built-in choice (=heuristic).

nn.MultiheadAttention (and nn.Transformer*Layer, which call it): where the table has attention
keys, its forward is wrapped (hfnn/_families/multihead_attention.py) so every call asks one C++ op,
which checks what hfnn's op takes, looks the call's packed key up (masks' kinds, need_weights and
kdim/vdim included) and counts; a key's winning core runs as hfnn's op, everything else (untuned
keys, keys torch won, add_bias_kv, masks the op does not take) runs torch's own forward as before. nn.LSTM likewise, where the table has LSTM keys
(hfnn/_families/lstm.py): each call asks hfnn::lstm_choose for its key's winner; its calls are
counted in Python.

Nothing here stops training: a missing, corrupt or foreign database, one tuned on another GPU or
torch, or an input no kernel takes means torch's kernel and one warning on stderr. HFNN_STRICT=1
makes each of those an error instead (start-up problems end the process with exit code 1).
HFNN_VERBOSE=1 prints what ran at exit (hfnn.dispatch_stats() returns the same).

torch.compile: Inductor decomposes LayerNorm into its own generated kernels, so compiled regions
trace through and run Inductor's code, not the table's; eager regions keep the table.
"""
from __future__ import annotations

import atexit
import json
import os
import sys


# Whether install() loaded a table (or tried to) in this process: hfnn's own modules then ask it too.
active = False
# What a key without a winner runs for torch's modules routed from Python (nn.LSTM): "torch" or
# "heuristic" (hfnn's built-in choice), HFNN_DISPATCH_POLICY as install() read it.
policy = "torch"


def _fail_or_warn(message: str, strict: bool) -> None:
    if strict:
        print(f"hfnn: HFNN_STRICT=1: {message}", file=sys.stderr, flush=True)
        os._exit(1)  # at start-up, before the script: one line, no traceback
    print(f"hfnn: {message}", file=sys.stderr, flush=True)


def install(path: str) -> dict:
    """Loads the table at `path` and routes every family through it (LayerNorm's torch op in C++,
    nn.MultiheadAttention.forward where the table has attention keys); returns the load status."""
    import torch

    from . import __version__, _ops

    strict = os.environ.get("HFNN_STRICT") == "1"
    policy_ = os.environ.get("HFNN_DISPATCH_POLICY", "torch")
    if policy_ not in ("torch", "heuristic"):
        _fail_or_warn(f"HFNN_DISPATCH_POLICY={policy_}: expected torch or heuristic; using torch", strict)
        policy_ = "torch"
    if not _ops.available:
        _fail_or_warn(f"HFNN_DISPATCH_DB is set but {_ops.ops_error()}; every call runs torch's kernels", strict)
        return {"ok": False, "problem": _ops.ops_error()}
    status = json.loads(torch.ops.hfnn.dispatch_load(path, torch.__version__, torch.version.cuda or "", __version__,
                                                     policy_, strict))
    if not status["ok"]:
        _fail_or_warn(f"{status['problem']}; every call runs torch's kernels", strict)
    for note in status["notes"]:
        _fail_or_warn(note, strict)
    global active, policy
    active = True
    policy = policy_
    # Families whose op is reached through a Python module rather than a torch op the library
    # registers over (attention: nn.MultiheadAttention.forward) install their routing here.
    from . import _families

    stats = dispatch_stats()
    for family in _families.ALL:
        if hasattr(family, "install_dispatch"):
            family.install_dispatch(stats)
    if os.environ.get("HFNN_VERBOSE") == "1":
        if status["ok"]:
            print(f"hfnn: dispatch from {path}: {status['keys']} tuned key(s) for {', '.join(status['gpus'])}"
                  f"; untuned shapes run {'torch' if policy_ == 'torch' else 'the built-in choice'}", file=sys.stderr)
        atexit.register(_print_summary)
    return status


def _print_summary() -> None:
    stats = dispatch_stats()
    if _any_calls(stats):  # a launcher (torchrun) runs no op hfnn dispatches: stay quiet
        print(summary(stats), file=sys.stderr)


def _any_calls(stats: dict) -> bool:
    return any(calls for op in stats["ops"].values() for calls in op["calls"].values())


def dispatch_stats() -> dict:
    """What the calls of each kernel family ran under HFNN_DISPATCH_DB: {"active", "db", "policy",
    "strict", "gpus", "keys", "ops": {op: {"title", "keys", "calls": {pass: {kernel: n}},
    "fallbacks": {pass: {reason: n}}}}}, every family of the build and every pass of each ("fwd",
    "bwd" for LayerNorm: stats["ops"]["layer_norm"]["calls"]["fwd"]). "torch" in calls counts every
    call torch's kernel ran, and fallbacks says why. Families counted in Python (LSTM: hfnn.nn.LSTM's
    calls, and nn.LSTM's under the variable) add theirs, with or without the op library."""
    from . import _families, _ops

    if _ops.available:
        import torch

        stats = json.loads(torch.ops.hfnn.dispatch_stats())
    else:
        stats = {"active": False, "db": "", "keys": 0, "ops": {}}
    for family in _families.ALL:
        if hasattr(family, "add_stats"):
            family.add_stats(stats)
    return stats


_PASS_TITLES = {"fwd": "forward", "bwd": "backward", "train": "forward + backward"}


def summary(stats: dict) -> str:
    """One screen: per family and pass, the calls per kernel and the fall-backs with their reasons."""
    if not stats.get("active"):
        return "hfnn: dispatch is off (HFNN_DISPATCH_DB not set)"
    lines = [f"hfnn: dispatch from {stats['db']} ({stats['keys']} tuned key(s); policy {stats['policy']})"]
    for op in stats["ops"].values():
        for pass_, calls in op["calls"].items():
            total = sum(calls.values())
            if not total:
                continue
            ran = ", ".join(f"{name} {n} ({100 * n / total:.0f}%)" for name, n in sorted(calls.items(), key=lambda kv: -kv[1]))
            lines.append(f"  {op['title']} {_PASS_TITLES.get(pass_, pass_)}: {total} calls: {ran}")
            for reason, n in sorted(op["fallbacks"][pass_].items(), key=lambda kv: -kv[1]):
                lines.append(f"    torch because {reason}: {n}")
    if len(lines) == 1:
        lines.append("  no calls")
    return "\n".join(lines)
