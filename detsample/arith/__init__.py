"""detsample's own arithmetic: ``exp``, ``log``, exact sums and ``log_softmax`` whose bits
are defined by detsample (:mod:`detsample.arith.spec`), not by a platform library.

Every float the sampler outputs or decides on (logprobs in every mode, the kept set's
mass, the draw's CDF, the min-p test) comes from here, so for the same logits the
sampler's outputs are one set of bits on every CPU (x86 of any ISA and MKL path,
aarch64), thread count and torch build. Two implementations, equal bit for bit
(tests/arith): the numba kernels on CPU tensors (:mod:`detsample.arith.cpu`), and the
torch composition on any device (:mod:`detsample.arith.reference`), also the CPU's form
where numba is missing (with a warning: the same bits, several times slower).

Functions take ``impl``: ``"auto"`` (numba on CPU tensors when importable, else the
torch composition), ``"numba"`` or ``"torch"``.
"""

from __future__ import annotations

import warnings

import torch

from detsample.arith import reference, spec
from detsample.arith.spec import frac_bits

__all__ = [
    "exp",
    "exp64",
    "log64",
    "normalisers",
    "log_softmax",
    "log_softmax_at",
    "picked",
    "row_max",
    "frac_bits",
    "check_environment",
    "IMPLS",
    "spec",
]

IMPLS = ("auto", "numba", "torch")


def uses_numba(t: torch.Tensor, impl: str) -> bool:
    """Whether a call on ``t`` with ``impl`` runs the numba kernels (else the torch
    composition; ValueError for an unknown ``impl``, a numba ``impl`` off the CPU)."""
    if impl not in IMPLS:
        raise ValueError(f"impl must be one of {IMPLS}, got {impl!r}")
    if impl == "torch" or t.device.type != "cpu":
        if impl == "numba":
            raise ValueError(f"impl='numba' runs on CPU tensors, got {t.device}")
        return False
    from detsample.arith import cpu

    if cpu.available():
        return True
    if impl == "numba":
        raise ImportError("impl='numba' needs numba (pip install numba)")
    warnings.warn(
        "numba is not installed: detsample computes its exp/log on CPU tensors "
        "with the torch composition (the same bits, several times slower; "
        "pip install numba)",
        RuntimeWarning,
        stacklevel=3,
    )
    return False


def exp(z: torch.Tensor, out: torch.Tensor | None = None, *, impl: str = "auto") -> torch.Tensor:
    """exp of a float32 tensor, float32 (into ``out``, shaped like ``z``; it may be
    ``z``). Bits: the definition (correctly rounded but for ~1 input in 10^8)."""
    if z.dtype != torch.float32:
        raise TypeError(f"arith.exp takes float32, got {z.dtype}")
    if out is not None and (out.shape != z.shape or out.dtype != torch.float32):
        raise ValueError("out must be a float32 tensor shaped like z")
    if out is not None and not out.is_contiguous():
        return out.copy_(exp(z, impl=impl))
    if uses_numba(z, impl):
        from detsample.arith import cpu

        return cpu.exp32(z, out)
    e = reference.exp32(z)
    return e if out is None else out.copy_(e)


def exp64(x: torch.Tensor, *, impl: str = "auto") -> torch.Tensor:
    """exp of a float64 tensor, rounded to float32 (the definition's core)."""
    if x.dtype != torch.float64:
        raise TypeError(f"arith.exp64 takes float64, got {x.dtype}")
    if uses_numba(x, impl):
        from detsample.arith import cpu

        return cpu.exp64(x)
    return reference.exp64(x)


def log64(x: torch.Tensor, *, impl: str = "auto") -> torch.Tensor:
    """Natural log of a float64 tensor, float64 (within a few ulps)."""
    if x.dtype != torch.float64:
        raise TypeError(f"arith.log64 takes float64, got {x.dtype}")
    if uses_numba(x, impl):
        from detsample.arith import cpu

        return cpu.log64(x)
    return reference.log64(x)


def normalisers(
    x: torch.Tensor, m: torch.Tensor | None = None, *, impl: str = "auto"
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(m, G)`` over the last dim of a float32 tensor (..., n): row maxima (float32;
    ``m``, when the caller has ``torch.amax(x, -1)`` already: exact, NaN-propagating)
    and log-normalisers ``G = log(sum exp(x - m))`` by the definition (float64; NaN for a
    row whose log_softmax is all NaN). With :func:`picked`, a row's log_softmax at a few
    entries costs one pass, not a (rows, n) output."""
    if x.dtype != torch.float32:
        raise TypeError(f"arith.normalisers take float32, got {x.dtype}")
    if x.shape[-1] == 0:
        raise ValueError("normalisers of rows of length 0")
    if uses_numba(x, impl):
        from detsample.arith import cpu

        return cpu.normalisers(x, m)
    return reference.normalisers(x)


def log_softmax_at(x: torch.Tensor, ids: torch.Tensor, *, impl: str = "auto") -> torch.Tensor:
    """:func:`log_softmax` of a (rows, n) float32 tensor at one column per row, ``ids``
    (rows,) int64 in range: (rows,) float32, the same bits, one pass per row and no
    (rows, n) output (on CPU tensors one numba call: a single row costs no torch ops)."""
    if x.dtype != torch.float32 or x.dim() != 2:
        raise TypeError(f"arith.log_softmax_at takes a (rows, n) float32 tensor, got {x.dtype} {tuple(x.shape)}")
    if x.shape[1] > 0 and uses_numba(x, impl):
        from detsample.arith import cpu

        return cpu.log_softmax_at(x, ids)
    m, G = normalisers(x, impl=impl)
    return picked(x.gather(1, ids.view(-1, 1)).view(-1), m, G)


def greedy(x: torch.Tensor, *, impl: str = "auto") -> tuple[torch.Tensor, torch.Tensor] | None:
    """Each row's argmax of a (rows, n) float32 CPU tensor (the first index of its
    maximum, of its first NaN where it holds one: ``torch.argmax``'s token) and
    :func:`log_softmax_at` there, from one maximum pass in one numba call: ((rows,)
    int64, (rows,) float32), the bits of the two apart. None where the numba kernels do
    not run on ``x`` (the caller takes argmax and :func:`log_softmax_at`)."""
    if x.dtype != torch.float32 or x.dim() != 2 or x.shape[1] == 0 or not uses_numba(x, impl):
        return None
    from detsample.arith import cpu

    return cpu.greedy(x)


def row_max(x: torch.Tensor, *, impl: str = "auto") -> torch.Tensor:
    """``torch.amax(x, -1)`` of a float32 tensor (NaN where a row holds a NaN): exact (a
    selection). On CPU tensors by the numba threads, so that no torch parallel region
    (whose OpenMP workers then spin for milliseconds) precedes the kernels after it."""
    if x.dtype == torch.float32 and x.dim() >= 1 and x.shape[-1] > 0 and uses_numba(x, impl):
        from detsample.arith import cpu

        return cpu.row_max(x)
    return torch.amax(x, dim=-1)


def picked(x: torch.Tensor, m: torch.Tensor, G: torch.Tensor) -> torch.Tensor:
    """The log_softmax values of entries ``x`` (float32) of rows with :func:`normalisers`
    ``m``, ``G`` (broadcast): ``float32((float64(x) - float64(m)) - G)``, NaN32 where
    ``G`` is NaN. The same bits as :func:`log_softmax` at those entries."""
    return reference.picked(x, m, G)


def log_softmax(x: torch.Tensor, out: torch.Tensor | None = None, *, impl: str = "auto") -> torch.Tensor:
    """log_softmax over the last dim of a float32 tensor (..., n), float32 (into ``out``,
    contiguous, shaped like ``x``, not ``x`` itself). Bits: the definition: within 1 ulp
    of the float64 log_softmax; a row with a NaN, a +inf or no finite value is NaN32."""
    if x.dtype != torch.float32:
        raise TypeError(f"arith.log_softmax takes float32, got {x.dtype}")
    if out is not None and (
        not out.is_contiguous() or out.shape != x.shape or out.dtype != torch.float32 or out.data_ptr() == x.data_ptr()
    ):
        raise ValueError("out must be a contiguous float32 tensor shaped like x, not x")
    if uses_numba(x, impl) and x.shape[-1] > 0:
        from detsample.arith import cpu

        return cpu.log_softmax(x, out)
    y = reference.log_softmax(x)
    return y if out is None else out.copy_(y)


def check_environment() -> None:
    """Raise RuntimeError when this thread would not round as the definition assumes:
    subnormals flushed to zero (``torch.set_flush_denormal(True)``)."""
    tiny = torch.tensor([2.0**-140], dtype=torch.float32)
    if float(tiny * 0.5) == 0.0:
        raise RuntimeError(
            "subnormal floats are flushed to zero in this process "
            "(torch.set_flush_denormal(True)?): detsample's exp would not "
            "give its defined bits; call torch.set_flush_denormal(False)"
        )
