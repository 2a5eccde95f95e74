"""Thread-count switch for code that must hold at 1 and at N threads.

torch's intra-op thread count is process-global; :func:`torch_threads` scopes a change to
one block and restores the old count on exit, also on an exception.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch


@contextmanager
def torch_threads(n: int) -> Iterator[None]:
    """Run the block with ``torch.set_num_threads(n)``; the old count is restored."""
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n!r}")
    old = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(old)
