"""Host -> device tensors: the one place that moves per-row host values to a device.

Row state (temperatures, seeds, COO index lists, ...) is built on the host from Python
values, then copied to the batch's device ONCE, when the batch composition changes, and
cached there: nothing is copied again on every sampling step.
"""

from __future__ import annotations

from typing import Any

import torch


def to_device(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A host tensor on ``device``: ``t`` itself on the CPU; through pinned memory with a
    non-blocking copy on CUDA (the host copy is never written again, so the copy is safe
    to overlap); a plain copy elsewhere."""
    device = torch.device(device)
    if device.type == "cpu":
        return t
    if device.type == "cuda":
        return t.pin_memory().to(device, non_blocking=True)
    return t.to(device)


def host_tensor(values: Any, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """``torch.tensor(values, dtype=dtype)`` built on the host, then on ``device``."""
    return to_device(torch.tensor(values, dtype=dtype), device)
