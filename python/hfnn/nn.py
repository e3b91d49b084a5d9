"""Drop-in modules backed by hfnn's kernels."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from . import _ops


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
