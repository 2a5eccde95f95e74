"""Where the mode's non-CPU kernels come from: the Triton kernels module, when present.

``detsample.kernels.invariant_ops`` exposes ``CUDA_IMPLS`` (aten op name -> CUDA kernel,
aten signatures) and ``ATTENTION`` (a transformers ``AttentionInterface`` function). It is
a lower layer that CPU-only installs may lack, so it is looked up by name, only when a
CUDA device exists.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Callable

import torch

CUDA_MODULE = "detsample.kernels.invariant_ops"


def cuda_module() -> ModuleType | None:
    """The Triton kernels module, or None without CUDA or without that module."""
    if not torch.cuda.is_available():
        return None
    try:
        return importlib.import_module(CUDA_MODULE)
    except ImportError:
        return None


def cuda_kernels() -> dict[str, Callable]:
    """Its ``CUDA_IMPLS`` ({} when absent)."""
    mod = cuda_module()
    return dict(getattr(mod, "CUDA_IMPLS", {})) if mod is not None else {}


def cuda_attention() -> Callable | None:
    """Its ``ATTENTION`` function (None when absent)."""
    mod = cuda_module()
    return getattr(mod, "ATTENTION", None) if mod is not None else None
