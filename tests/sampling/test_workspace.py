"""detsample/workspace.py: reused scratch buffers (views cached per name and shape)."""

from __future__ import annotations

import torch

from detsample.sampling import workspace
from detsample.sampling.workspace import Workspace

CPU = torch.device("cpu")


def test_same_request_same_view_and_shapes_share_memory():
    ws = Workspace()
    a = ws.get("z", (2, 8), torch.float32, CPU)
    assert ws.get("z", (2, 8), torch.float32, CPU) is a
    b = ws.get("z", (1, 8), torch.float32, CPU)
    assert b.data_ptr() == a.data_ptr() and b.shape == (1, 8) and b.is_contiguous()
    assert ws.get("q", (2, 8), torch.int64, CPU).dtype == torch.int64


def test_growth_replaces_the_buffer_and_drops_stale_views():
    """A larger request reallocates; a later smaller request must view the NEW buffer,
    never a cached view of the freed one."""
    ws = Workspace()
    small = ws.get("z", (1, 8), torch.float32, CPU)
    big = ws.get("z", (4, 8), torch.float32, CPU)
    again = ws.get("z", (1, 8), torch.float32, CPU)
    assert again is not small and again.data_ptr() == big.data_ptr()


def test_view_cache_is_bounded(monkeypatch):
    monkeypatch.setattr(workspace, "MAX_VIEWS", 3)
    ws = Workspace()
    for n in range(1, 10):
        ws.get("z", (n, 4), torch.float32, CPU)
    assert len(ws._views) <= 3
