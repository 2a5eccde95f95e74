"""Bitwise comparison of tensors and the distance between two results in ULPs.

Every verdict of the probe is a bit comparison (:func:`bits_equal`); the distances
(:func:`diff`) only describe HOW far two results are once they differ.

The ULP distance of two floats of one dtype is the number of representable values between
them: the bit patterns are mapped to integers that are ordered like the floats
(``-0.0`` and ``+0.0`` both to 0), and subtracted. For integer tensors (indices) a ULP is
1, so the distance is the plain difference.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

_BITS = {
    torch.float64: torch.int64,
    torch.float32: torch.int32,
    torch.bfloat16: torch.int16,
    torch.float16: torch.int16,
}


def _ordered(x: torch.Tensor) -> torch.Tensor:
    """int64 keys ordered like the floats of ``x`` (float dtypes of ``_BITS``)."""
    itype = _BITS[x.dtype]
    i = x.contiguous().view(itype).to(torch.int64)
    lowest = torch.iinfo(itype).min
    return torch.where(i < 0, lowest - i, i)


def bits_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """True when ``a`` and ``b`` have the same shape, dtype and bit pattern (NaNs of one
    pattern are equal, ``-0.0`` and ``0.0`` are not)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.dtype in _BITS:
        itype = _BITS[a.dtype]
        return torch.equal(a.contiguous().view(itype), b.contiguous().view(itype))
    return torch.equal(a, b)


@dataclass(frozen=True)
class Diff:
    """How two same-shape tensors differ: ``equal`` (bitwise), ``count`` of differing
    elements, ``max_abs`` (float; 0.0 for equal tensors) and ``max_ulp`` (int)."""

    equal: bool
    count: int
    max_abs: float
    max_ulp: int


def diff(a: torch.Tensor, b: torch.Tensor) -> Diff:
    """Compare same-shape, same-dtype tensors ``a`` and ``b`` (any float or integer dtype).

    Raises ValueError on a shape or dtype mismatch (naming both)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        raise ValueError(f"cannot compare {a.dtype}{list(a.shape)} with {b.dtype}{list(b.shape)}")
    if bits_equal(a, b):
        return Diff(True, 0, 0.0, 0)
    a, b = a.detach().cpu(), b.detach().cpu()
    if a.dtype in _BITS:
        itype = _BITS[a.dtype]
        count = int((a.contiguous().view(itype) != b.contiguous().view(itype)).sum())
        ulp = (_ordered(a) - _ordered(b)).abs()
        d = (a.to(torch.float64) - b.to(torch.float64)).abs()
        d = torch.where(torch.isnan(d), torch.full_like(d, float("inf")), d)
    else:
        count = int((a != b).sum())
        ulp = (a.to(torch.int64) - b.to(torch.int64)).abs()
        d = ulp.to(torch.float64)
    return Diff(False, count, float(d.max()), int(ulp.max()))
