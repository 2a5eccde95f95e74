"""Ctrl-C (SIGINT) as an input: one scoped switch of what it does.

The ``detsample`` command makes Ctrl-C raise :class:`~detsample.errors.Interrupted` while
it runs (one line, exit 130); worker and rank processes are started with Ctrl-C ignored
(a process started with SIGINT ignored keeps it ignored, even through ``exec``), so that
the parent alone handles it and no child prints a traceback of its own.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable, Iterator
from typing import Any


@contextlib.contextmanager
def sigint_handler(handler: Callable[[int, Any], Any] | int) -> Iterator[None]:
    """SIGINT handled by ``handler`` (a function, or ``signal.SIG_IGN``) inside the block,
    the previous handler restored after it. Only in the main thread (where Python
    handles signals; elsewhere the block runs unchanged)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def children_ignore_ctrl_c() -> contextlib.AbstractContextManager[None]:
    """The block that starts worker processes: they start with Ctrl-C ignored."""
    return sigint_handler(signal.SIG_IGN)
