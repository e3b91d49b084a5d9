"""hfnn: profiling-driven kernel tuning for PyTorch training.

    model = hfnn.to_hfnn(model)   # every nn.LayerNorm, nn.MultiheadAttention, nn.LSTM runs hfnn's kernels
    model = hfnn.to_torch(model)  # and back, exactly

    HFNN_DISPATCH_DB=shapes.db python train.py   # every LayerNorm runs what `hfnn tune` picked
"""
from __future__ import annotations

import sys as _sys
from importlib import metadata as _metadata

from . import nn
from ._dispatch import dispatch_stats
from ._ops import build_info, ops_error
from .convert import to_hfnn, to_torch

try:
    __version__ = _metadata.version("hfnn")
except _metadata.PackageNotFoundError:  # imported from a source tree
    __version__ = "0+unknown"


def step() -> None:
    """Marks the end of a training step for `hfnn profile`, in loops without a torch optimizer
    (optimizer.step() is detected by itself). Does nothing when not profiling."""
    from . import _ops

    if _ops.available:
        import torch

        torch.ops.hfnn.profiler_step()
        startup = _sys.modules.get("hfnn._startup")  # under `hfnn profile`: its labels end with the recording
        if startup is not None:
            startup.after_step()


def layer_norm_variants() -> dict:
    """The LayerNorm kernel variants in this build: {"fwd": [...], "bwd": [...]}."""
    return build_info().get("variants", {}).get("layer_norm", {"fwd": [], "bwd": []})


__all__ = ["nn", "to_hfnn", "to_torch", "step", "dispatch_stats", "build_info", "ops_error", "layer_norm_variants", "__version__"]
