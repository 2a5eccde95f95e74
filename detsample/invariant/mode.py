"""The batch-invariant mode switch: scoped ``torch.library`` overrides of aten kernels.

``with batch_invariant(): ...`` registers every kernel of the override table
(:mod:`detsample.invariant.table`) for its dispatch key in one ``torch.library.Library``
and destroys that library on exit, also on an exception, which restores torch's own
kernels. Entering registers the ``"detsample"`` attention with transformers (idempotent:
the name stays registered, and the function is invariant with or without the mode).

Nesting is counted: only the outermost ``enable()`` installs and only the matching
outermost ``disable()`` uninstalls. The overrides are process-wide while installed (torch's
dispatcher is), so they apply to every thread.
"""

from __future__ import annotations

import threading
import warnings
from contextlib import contextmanager
from typing import ContextManager, Iterator

import torch

from detsample.invariant.attention import register_attention
from detsample.invariant.table import kernels_by_key


class _Installed:
    """The one installed library and the nesting depth (guarded by ``lock``)."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.depth = 0
        self.library: torch.library.Library | None = None


_INSTALLED = _Installed()


def _install() -> torch.library.Library:
    lib = torch.library.Library("aten", "IMPL")
    try:
        with warnings.catch_warnings():  # torch warns once that it overrides a kernel
            warnings.filterwarnings("ignore", message=".*[Oo]verrid.*")
            for op, by_key in kernels_by_key().items():
                for key, fn in by_key.items():
                    lib.impl(op, fn, key)
    except Exception:
        lib._destroy()
        raise
    return lib


def enable() -> None:
    """Install the overrides (or deepen the nesting when they already are)."""
    with _INSTALLED.lock:
        if _INSTALLED.depth == 0:
            register_attention()
            _INSTALLED.library = _install()
        _INSTALLED.depth += 1


def disable() -> None:
    """Undo one :func:`enable`; the outermost restores torch's kernels."""
    with _INSTALLED.lock:
        if _INSTALLED.depth == 0:
            raise RuntimeError("detsample.disable() without a matching enable(): the "
                               "batch-invariant mode is not enabled")
        _INSTALLED.depth -= 1
        if _INSTALLED.depth == 0:
            lib, _INSTALLED.library = _INSTALLED.library, None
            if lib is not None:
                lib._destroy()


def is_enabled() -> bool:
    """Whether the overrides are installed now."""
    return _INSTALLED.depth > 0


@contextmanager
def _scope() -> Iterator[None]:
    enable()
    try:
        yield
    finally:
        disable()


class _BatchInvariant:
    """``batch_invariant()``: a context manager running its block with the batch-invariant
    kernels (torch's own are back on exit, also on an exception; blocks nest).
    ``batch_invariant.enable()`` / ``.disable()`` / ``.is_enabled()`` are the same switch
    without a block."""

    enable = staticmethod(enable)
    disable = staticmethod(disable)
    is_enabled = staticmethod(is_enabled)

    def __call__(self) -> ContextManager[None]:
        return _scope()

    def __repr__(self) -> str:
        return "detsample.batch_invariant"


batch_invariant = _BatchInvariant()
