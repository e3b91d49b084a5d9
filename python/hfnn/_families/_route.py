"""What the families that route a torch module through HFNN_DISPATCH_DB's table from Python
(attention, LSTM) share: whether the table has the family's keys, and replacing the module class's
forward with one that tries hfnn's route first."""
from __future__ import annotations

from typing import Callable


def table_has_keys(stats: dict, op: str) -> bool:
    """Whether hfnn.dispatch_stats()-style `stats` count keys of `op` in the loaded table."""
    return bool(stats.get("ops", {}).get(op, {}).get("keys"))


def replace_forward(cls, make: Callable[[Callable], Callable]) -> Callable:
    """Sets cls.forward to make(original) (its __wrapped__ the original, as functools.wraps would)
    and returns the original, which the family keeps for hfnn.nn's modules and its fall-backs."""
    original = cls.forward
    forward = make(original)
    forward.__wrapped__ = original
    cls.forward = forward
    return original
