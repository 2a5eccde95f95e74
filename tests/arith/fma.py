"""The fused multiply-add check of the numba kernels (tests/arith): the assembly of a
kernel compiled afresh with detsample's flags (cached code cannot be inspected)."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

#: x86 (vfmadd231pd, vfnmsub...) and aarch64 (fmla, fmls, fmadd, fnmsub...) fused ops
FMA = re.compile(r"\bv?fn?m(add|sub)[0-9]*[ps][sd]\b|\bfn?m(la|ls|add|sub)\b")


def cpu_has_fma() -> bool:
    """Whether this CPU has fused multiply-adds a compiler could emit."""
    info = Path("/proc/cpuinfo")
    return info.exists() and re.search(r"\b(fma|asimd)\b", info.read_text()) is not None


def loop_args(*extra) -> tuple:
    """Arguments of a loop kernel ``f(x, out, *extra)``: float32 arrays, then ``extra``."""
    z = np.zeros(4, np.float32)
    return (z, z.copy(), *extra)


def fresh_asm(kernel, args: tuple, fastmath: bool) -> str:
    """The assembly of numba dispatcher ``kernel``'s Python source compiled now for
    ``args`` with detsample's flags (or fast-math)."""
    import numba

    fresh = numba.njit(nogil=True, cache=False, fastmath=fastmath, error_model="numpy")(kernel.py_func)
    fresh(*args)
    return "\n".join(fresh.inspect_asm(sig) for sig in fresh.signatures)
