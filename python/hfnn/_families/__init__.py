"""The kernel families on the Python side, one module each (the C++ side's list is
kernels/common/family.cpp): OP, the op name the profile records; measure(torch, hfnn, request,
l2_bytes, plant), the tune worker's answer to one key (a family without it is not tunable yet);
swaps(), the module classes to_hfnn swaps; install_dispatch(stats), where a family routes its
torch module through HFNN_DISPATCH_DB's table from Python (attention, LSTM); add_stats(stats), where
a family counts its calls in Python (LSTM) and adds them to hfnn.dispatch_stats()."""
from __future__ import annotations

from types import ModuleType

from . import layer_norm, lstm, multihead_attention

# The families, one line each.
ALL: tuple[ModuleType, ...] = (layer_norm, multihead_attention, lstm)


def find(op: str) -> ModuleType | None:
    """The family module of a recorded op; None where hfnn has no kernels for it."""
    return next((f for f in ALL if f.OP == op), None)
