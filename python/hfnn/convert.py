"""to_hfnn / to_torch: the reversible module swap.

The swap changes each module's class in place (torch.nn.LayerNorm <-> hfnn.nn.LayerNorm,
torch.nn.MultiheadAttention <-> hfnn.nn.MultiheadAttention, torch.nn.LSTM <-> hfnn.nn.LSTM: every
family's hfnn/_families/<op>.py says which), nothing else: the module object, its parameters (the
same tensors), buffers, hooks, training flag, dtype and device all stay. Only modules whose class is exactly torch's are swapped: a user's subclass may
override forward, and taking it over would change what the model computes.
"""
from __future__ import annotations

from torch import nn

from . import _families

# torch class -> hfnn class, every family's (hfnn/_families/).
_SWAPS: dict[type, type] = {k: v for f in _families.ALL for k, v in f.swaps().items()}
_BACK: dict[type, type] = {v: k for k, v in _SWAPS.items()}


def _swap(model: nn.Module, table: dict[type, type]) -> nn.Module:
    if not isinstance(model, nn.Module):
        raise TypeError(f"hfnn: expected a torch.nn.Module, got {type(model).__name__}")
    for module in model.modules():
        target = table.get(type(module))
        if target is not None:
            module.__class__ = target
    return model


def to_hfnn(model: nn.Module) -> nn.Module:
    """Swap every torch.nn.LayerNorm, nn.MultiheadAttention and nn.LSTM in `model` (recursively, in
    place) for hfnn.nn's; returns `model`."""
    return _swap(model, _SWAPS)


def to_torch(model: nn.Module) -> nn.Module:
    """Undo to_hfnn: every hfnn module in `model` becomes its torch class again, in place; returns `model`."""
    return _swap(model, _BACK)
