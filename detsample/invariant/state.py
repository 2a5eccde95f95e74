"""What the batch-invariant mode is doing now: its configuration, and what it learnt of this machine.

The mode's kernels are registered process-wide (torch's dispatcher is), so the state they
read is process-wide too, and lives here, in one object, :data:`STATE`:

* the configuration stack: each ``enable(portable=..., strict=...)`` pushes a
  :class:`ModeConfig`, the matching ``disable()`` pops it; the kernels follow the
  innermost one (:func:`config`);
* the plan registry (:class:`Plans`): for every (op, shape class, layout, dtype, thread
  count) the mode has met, which kernel it took and why, decided once by the on-machine
  verification (:mod:`detsample.invariant.verify`). It outlives ``disable()``: a property
  of the machine does not change when the mode is left. :func:`reset_plans` forgets it
  (tests; a process that changes ``MKL_*`` settings cannot, MKL reads them at load).

Nothing here touches torch's dispatcher; :mod:`detsample.invariant.mode` does.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class ModeConfig:
    """``portable``: the kernels whose bits are defined by detsample's own arithmetic
    (the same on every CPU, BLAS path and thread count); False: the verified fast kernels
    (invariant on this machine, checked on it). ``strict``: an op the mode does not cover
    raises at a model's first forward (False: a warning)."""

    portable: bool = False
    strict: bool = True

    def __post_init__(self) -> None:
        for name in ("portable", "strict"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name} must be a bool, got {getattr(self, name)!r}")

    @property
    def label(self) -> str:
        """``"portable"`` or ``"verified"``: the kernel family the configuration runs."""
        return "portable" if self.portable else "verified"


DEFAULT = ModeConfig()


@dataclass(frozen=True)
class Plan:
    """One decision of the mode for one key: ``kernel`` names what runs (for a matmul
    ``"mkl tiles 2..64, native layout"``, ``"portable correctly rounded product"``), ``rests_on`` what
    its invariance rests on (``"verified on this machine"`` / ``"detsample's arithmetic"``)
    and ``reason`` why it was chosen; ``data`` is the kernel's parameters."""

    kernel: str
    rests_on: str
    reason: str
    data: tuple = ()

    @property
    def portable(self) -> bool:
        return self.rests_on == ARITHMETIC


VERIFIED = "verified on this machine"
ARITHMETIC = "detsample's arithmetic"


@dataclass
class Plans:
    """Key -> :class:`Plan`, filled once per key by a decide function (thread-safe)."""

    lock: threading.RLock = field(default_factory=threading.RLock)
    table: dict[Hashable, Plan] = field(default_factory=dict)
    recorders: list[set] = field(default_factory=list)

    def get(self, key: Hashable, decide: Callable[[], Plan]) -> Plan:
        for used in self.recorders:
            used.add(key)
        plan = self.table.get(key)
        if plan is None:
            with self.lock:
                plan = self.table.get(key)
                if plan is None:
                    plan = decide()
                    self.table[key] = plan
        return plan

    def items(self) -> Iterator[tuple[Hashable, Plan]]:
        with self.lock:
            return iter(list(self.table.items()))

    @contextmanager
    def recording(self) -> Iterator[set]:
        """The set of keys used inside the block (decided now or before)."""
        used: set = set()
        with self.lock:
            self.recorders.append(used)
        try:
            yield used
        finally:
            with self.lock:
                self.recorders.remove(used)


class _State:
    """The installed library, the nesting depth and configuration stack (under ``lock``),
    and the plan registry."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.configs: list[ModeConfig] = []
        self.library = None
        self.plans = Plans()


STATE = _State()


def config() -> ModeConfig:
    """The innermost active configuration (the default one when the mode is off: the
    kernels are then only called directly, by tests and the attention)."""
    configs = STATE.configs
    return configs[-1] if configs else DEFAULT


def plans() -> Plans:
    return STATE.plans


def note_portable(key: Hashable, kernel: str) -> None:
    """Record that ``key`` ran a portable kernel (reports list it beside the verified
    ones; nothing is checked: its bits are detsample's arithmetic)."""
    STATE.plans.get(key, lambda: Plan(kernel, ARITHMETIC, "portable=True: defined by detsample's order"))


def reset_plans() -> None:
    """Forget every decision (the next use of each key verifies again)."""
    with STATE.plans.lock:
        STATE.plans.table.clear()
