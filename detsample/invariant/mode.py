"""The batch-invariant mode switch: scoped ``torch.library`` overrides of aten kernels.

``with batch_invariant(): ...`` registers every kernel of the override table
(:mod:`detsample.invariant.overrides`) for its dispatch key in one ``torch.library.Library``
and destroys that library on exit, also on an exception, which restores torch's own
kernels. Entering registers the ``"detsample"`` attention with transformers (idempotent:
the name stays registered, and the function is invariant with or without the mode).

``batch_invariant(portable=True)`` runs the same overrides with the portable kernels
(bits defined by detsample's arithmetic; docs/batch-invariant.md); ``strict=False`` makes
an op the mode does not cover a warning instead of an error at a model's first forward
(:mod:`detsample.invariant.guard`); an inner block that does not say inherits it.

Nesting is counted: only the outermost ``enable()`` installs and only the matching
outermost ``disable()`` uninstalls; while blocks nest, the kernels follow the innermost
block's configuration. The overrides are process-wide while installed (torch's
dispatcher is), so they apply to every thread.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from contextlib import AbstractContextManager as ContextManager
from contextlib import contextmanager

import torch

from detsample.invariant.attention import register_attention
from detsample.invariant.guard import GUARD
from detsample.invariant.overrides import kernels_by_key
from detsample.invariant.state import STATE, ModeConfig


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


def enable(portable: bool = False, strict: bool | None = None) -> None:
    """Install the overrides (or deepen the nesting when they already are); the kernels
    follow this configuration until the matching :func:`disable`. ``strict`` None: as the
    enclosing block has it (True outermost), so a ``strict=False`` block holds for the
    blocks a model adapter opens inside it."""
    with STATE.lock:
        if strict is None:
            strict = STATE.configs[-1].strict if STATE.configs else True
        cfg = ModeConfig(portable=portable, strict=strict)
        if not STATE.configs:
            register_attention()
            STATE.library = _install()
            GUARD.install()
        STATE.configs.append(cfg)


def disable() -> None:
    """Undo one :func:`enable`; the outermost restores torch's kernels."""
    with STATE.lock:
        if not STATE.configs:
            raise RuntimeError(
                "detsample.disable() without a matching enable(): the batch-invariant mode is not enabled"
            )
        STATE.configs.pop()
        if not STATE.configs:
            lib, STATE.library = STATE.library, None
            GUARD.uninstall()
            if lib is not None:
                lib._destroy()


def is_enabled() -> bool:
    """Whether the overrides are installed now."""
    return bool(STATE.configs)


@contextmanager
def _scope(portable: bool, strict: bool | None) -> Iterator[None]:
    enable(portable=portable, strict=strict)
    try:
        yield
    finally:
        disable()


class _BatchInvariant:
    """``batch_invariant(portable=False, strict=True)``: a context manager running its
    block with the batch-invariant kernels (torch's own are back on exit, also on an
    exception; blocks nest). ``batch_invariant.enable()`` / ``.disable()`` /
    ``.is_enabled()`` are the same switch without a block."""

    enable = staticmethod(enable)
    disable = staticmethod(disable)
    is_enabled = staticmethod(is_enabled)

    def __call__(self, portable: bool = False, strict: bool | None = None) -> ContextManager[None]:
        ModeConfig(portable=portable, strict=True if strict is None else strict)  # validate
        return _scope(portable, strict)

    def __repr__(self) -> str:
        return "detsample.batch_invariant"


batch_invariant = _BatchInvariant()
