"""The numba kernels' threads: torch's own OpenMP team, where torch runs on one.

Why: after each parallel region torch's OpenMP workers spin for milliseconds before they
sleep (libgomp's default wait policy: ~300,000 spins), and threads of another pool
started in that time share the cores with them (with ``OMP_WAIT_POLICY=PASSIVE`` the
penalty below went away: the cause, measured). A model's
forward is torch operations, so the sampler's kernels, and the batch-invariant mode's
between two torch operations, always start there: on 2 cores, 64 rows of 32,000
took 6.0 ms on a thread pool right after a torch ``log_softmax`` against 3.0 ms alone --
the second thread bought nothing. Run on torch's team instead, the spinning workers take
the work at once (3.0 ms in both cases, docs/performance.md "Threads").

How: ``GOMP_parallel`` of the OpenMP runtime torch loaded (libgomp; Intel's and LLVM's
runtimes export it too), called through ctypes (which releases the GIL) with a ctypes
callback; each team thread takes the GIL in the callback, runs the caller's Python
``work`` (which takes spans from a shared queue and calls a numba kernel that releases
the GIL again), and returns. The team is the calling thread's (the master is the caller,
as for torch's own regions). Nothing here decides a bit: which thread runs a span never
changes its result (every kernel's result is a function of its span alone).

Where it is not available -- torch built without OpenMP, more than one OpenMP runtime
loaded and none of them torch's, no ``/proc/self/maps`` (not Linux) -- :func:`runtime`
is None and :mod:`detsample.arith.cpu` keeps its thread pool.
"""

from __future__ import annotations

import ctypes
import functools
import itertools
import os
import threading
from collections.abc import Callable

import torch

#: file names of the OpenMP runtimes (GNU, Intel, LLVM)
RUNTIMES = ("libgomp", "libiomp5", "libomp")

_CALLBACK = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
_ENSURE = ctypes.pythonapi.PyGILState_Ensure
_ENSURE.restype = ctypes.c_int


def _loaded_runtimes() -> list[str]:
    """Paths of the OpenMP runtimes mapped into this process (Linux: /proc/self/maps)."""
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as f:
            paths = {line.split()[-1] for line in f if "/" in line}
    except OSError:
        return []
    return sorted(p for p in paths if os.path.basename(p).startswith(RUNTIMES) and ".so" in p)


def _torch_runtime() -> str | None:
    """The OpenMP runtime torch runs its parallel regions on: torch's backend is OpenMP,
    and of the loaded runtimes the one in torch's own library folder, else the only
    one."""
    if "parallel backend: OpenMP" not in torch.__config__.parallel_info():
        return None
    found = _loaded_runtimes()
    lib = os.path.realpath(os.path.join(os.path.dirname(torch.__file__), "lib"))
    own = [p for p in found if os.path.realpath(os.path.dirname(p)) == lib]
    if len(own) == 1:
        return own[0]
    return found[0] if len(found) == 1 else None


class _Runtime:
    """``GOMP_parallel`` of one runtime, with the pending works by key."""

    def __init__(self, path: str):
        lib = ctypes.CDLL(path)  # already mapped: the same handle, the same team
        self.path = path
        self._parallel = lib.GOMP_parallel
        self._parallel.restype = None
        self._parallel.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint, ctypes.c_uint]
        self._works: dict[int, tuple[Callable[[], None], list[BaseException]]] = {}
        self._keys = itertools.count(1)  # next() on it is atomic under the GIL
        self._local = threading.local()  # per Python thread state
        enter = self._enter
        # (a plain function, not the bound method: with the bound method as the
        # callback the same spans took 17 ms against 14.5, measured, cause unknown)
        self._callback = _CALLBACK(lambda key: enter(key))  # alive as long as the runtime
        self._address = ctypes.cast(self._callback, ctypes.c_void_p).value

    def _enter(self, key: int) -> None:
        """One team thread (GIL taken by ctypes): the work of ``key``; an exception is
        kept for the caller (a ctypes callback would only print it). A team thread's
        Python state is kept from its first entry on (one ``PyGILState_Ensure`` never
        released): ctypes would otherwise make and drop one per entry (2 greedy rows
        of 32,000: 0.20 ms against 0.18, measured)."""
        if not getattr(self._local, "kept", False):
            _ENSURE()
            self._local.kept = True
        work, errors = self._works[key]
        try:
            work()
        except BaseException as e:  # noqa: BLE001 - re-raised by run()
            errors.append(e)

    def run(self, work: Callable[[], None], threads: int) -> None:
        """``work()`` on ``threads`` threads of the calling thread's team (the caller
        one of them), returning when all have returned; the first exception raised in
        any of them is raised here."""
        key = next(self._keys)
        errors: list[BaseException] = []
        self._works[key] = (work, errors)
        try:
            self._parallel(self._address, key, threads, 0)
        finally:
            del self._works[key]
        if errors:
            raise errors[0]


@functools.cache
def runtime() -> _Runtime | None:
    """torch's OpenMP runtime as a team to run on, or None (see the module docstring)."""
    path = _torch_runtime()
    if path is None:
        return None
    try:
        return _Runtime(path)
    except (OSError, AttributeError):  # not loadable, or no GOMP_parallel
        return None
