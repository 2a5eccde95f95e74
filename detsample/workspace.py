"""Reusable scratch buffers of one Sampler instance.

Fresh (batch, vocab) tensors cost page faults on every step (a 64 x 152064 float32
tensor is 39 MB); the sampler reuses its scratch buffers across calls instead. The
workspace belongs to one Sampler instance (no global state) and holds only values
that are overwritten before they are read, so reuse can never change a result. A
Sampler instance is therefore not meant to be shared by concurrent threads.
"""

from __future__ import annotations

import torch


class Workspace:
    """Named scratch tensors, reallocated only when the requested shape grows."""

    def __init__(self) -> None:
        self._bufs: dict[tuple[str, torch.dtype, torch.device], torch.Tensor] = {}

    def get(self, name: str, shape: tuple[int, ...], dtype: torch.dtype,
            device: torch.device) -> torch.Tensor:
        """An uninitialised, contiguous tensor of ``shape`` (a view of a cached buffer)."""
        key = (name, dtype, torch.device(device))
        numel = 1
        for s in shape:
            numel *= s
        buf = self._bufs.get(key)
        if buf is None or buf.numel() < numel:
            buf = torch.empty(numel, dtype=dtype, device=device)
            self._bufs[key] = buf
        return buf[:numel].view(shape)

    def clear(self) -> None:
        self._bufs.clear()
