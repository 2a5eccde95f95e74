"""Reusable scratch buffers of one Sampler instance.

Fresh (batch, vocab) tensors cost page faults on every step (a 64 x 152064 float32
tensor is 39 MB); the sampler reuses its scratch buffers across calls instead. The
workspace belongs to one Sampler instance (no global state) and holds only values
that are overwritten before they are read, so reuse can never change a result. A
Sampler instance is therefore not meant to be shared by concurrent threads.
"""

from __future__ import annotations

import torch

#: cached views (one per name and shape) before the view cache starts over
MAX_VIEWS = 256


class Workspace:
    """Named scratch tensors, reallocated only when the requested shape grows."""

    def __init__(self) -> None:
        self._bufs: dict[tuple[str, torch.dtype, torch.device], torch.Tensor] = {}
        self._views: dict[tuple, torch.Tensor] = {}

    def get(self, name: str, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        """An uninitialised, contiguous tensor of ``shape`` (a view of a cached buffer;
        the same view object for the same request, so a decode loop pays no slicing)."""
        full = (name, shape, dtype, device)
        view = self._views.get(full)
        if view is not None:
            return view
        key = (name, dtype, torch.device(device))
        numel = 1
        for s in shape:
            numel *= s
        buf = self._bufs.get(key)
        if buf is None or buf.numel() < numel:
            buf = torch.empty(numel, dtype=dtype, device=device)
            self._bufs[key] = buf
            self._views = {
                k: v for k, v in self._views.items() if k[0] != name or k[2] != dtype or torch.device(k[3]) != key[2]
            }
        if len(self._views) >= MAX_VIEWS:  # batch sizes come and go: keep the cache small
            self._views.clear()
        view = self._views[full] = buf[:numel].view(shape)
        return view

    def clear(self) -> None:
        self._bufs.clear()
        self._views.clear()
