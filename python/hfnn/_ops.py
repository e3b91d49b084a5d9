"""Loads the op library (libhfnn_ops.so) that `pip install .` puts next to this file.

The library is a plain shared library with ops registered through TORCH_LIBRARY, loaded with
torch.ops.load_library, so one build serves every Python version. If it is missing or fails to
load (a torch other than the one it was built against, say), hfnn still imports: every module
then runs torch's own kernels, and `hfnn.ops_error()` says why.
"""
from __future__ import annotations

import json
import os
import warnings
from functools import lru_cache
from pathlib import Path
from typing import Optional

import torch

_LIBRARY_NAME = "libhfnn_ops.so"
_error: Optional[str] = None


def _candidates() -> list[Path]:
    here = Path(__file__).resolve().parent
    paths = [here / _LIBRARY_NAME]
    override = os.environ.get("HFNN_OPS_LIBRARY")  # a build tree's library, for developers
    if override:
        paths.insert(0, Path(override))
    return paths


def _load() -> bool:
    global _error
    for path in _candidates():
        if path.is_file():
            try:
                torch.ops.load_library(str(path))
                return True
            except OSError as e:  # built against another torch, or a missing CUDA runtime
                _error = f"hfnn: could not load {path}: {e}"
                break
    else:
        _error = f"hfnn: {_LIBRARY_NAME} was not found next to {__file__}: reinstall with `pip install --no-build-isolation .`"
    warnings.warn(f"{_error}; every hfnn op falls back to torch", RuntimeWarning, stacklevel=3)
    return False


available: bool = _load()


def ops_error() -> Optional[str]:
    """Why the op library did not load, or None when it did."""
    return _error


@lru_cache(maxsize=1)
def build_info() -> dict:
    """What the loaded op library holds: version, CUDA architectures, kernel variants."""
    if not available:
        return {"version": None, "cuda_kernels": False, "cuda_architectures": "", "variants": {}}
    return json.loads(torch.ops.hfnn.build_info())
