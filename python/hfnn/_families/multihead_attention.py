"""Multi-head attention's Python side: the module swap (hfnn.nn.MultiheadAttention, one C++ op a
call). Not tunable yet: the C++ family description and measure() come with the core variants' key
schema (issue 11), so `hfnn tune` still leaves these calls to torch."""
from __future__ import annotations

OP = "multihead_attention"


def swaps() -> dict:
    """torch module class -> hfnn module class, for to_hfnn and to_torch."""
    from torch import nn

    from .. import nn as hfnn_nn

    return {nn.MultiheadAttention: hfnn_nn.MultiheadAttention}
