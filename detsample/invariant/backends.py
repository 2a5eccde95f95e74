"""Where the mode's non-CPU kernels come from: the Triton kernels module, when present.

``detsample.kernels.invariant_ops`` exposes ``CUDA_IMPLS`` (aten op name -> CUDA kernel,
aten signatures) and ``ATTENTION`` (a transformers ``AttentionInterface`` function). It
imports Triton, which CPU-only installs may lack, so it is imported only when a CUDA
device exists.
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType

import torch


def cuda_module() -> ModuleType | None:
    """The Triton kernels module, or None without CUDA or without Triton."""
    if not torch.cuda.is_available():
        return None
    try:
        from detsample.kernels import invariant_ops
    except ImportError:  # no Triton in this install
        return None
    return invariant_ops


def cuda_kernels() -> dict[str, Callable]:
    """Its ``CUDA_IMPLS`` ({} when absent)."""
    mod = cuda_module()
    return dict(getattr(mod, "CUDA_IMPLS", {})) if mod is not None else {}


def cuda_attention() -> Callable | None:
    """Its ``ATTENTION`` function (None when absent)."""
    mod = cuda_module()
    return getattr(mod, "ATTENTION", None) if mod is not None else None
