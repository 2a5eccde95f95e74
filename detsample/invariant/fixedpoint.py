"""Portable products: a matmul whose bits are defined by detsample's arithmetic, not by a BLAS.

The definition (``oracles/invariant.py`` spells the same in numpy, per element):

* ``A (M, K)`` and ``B (K, N)`` as float32 values (bfloat16 / float16 upcast exactly).
* Row scale of A: ``e_m`` with ``max_k |A[m, k]| = f * 2**e_m``, ``f in [0.5, 1)`` (``frexp``;
  0 for a zero row). ``a[m, k] = round_half_even(A[m, k] * 2**(A_BITS - e_m))``: an integer
  with ``|a| <= 2**A_BITS``. Column scale of B likewise over ``B[:, n]``:
  ``b[k, n] = round_half_even(B[k, n] * 2**(B_BITS - f_n))``, ``|b| <= 2**B_BITS``.
* ``S[m, n] = sum_k a[m, k] * b[k, n]``, **exactly** (an integer).
* ``C[m, n] = float32(float64(S[m, n]) * 2**(e_m - A_BITS) * 2**(f_n - B_BITS))``: one
  rounding of S to float64 (none while ``|S| <= 2**53``), two exact power-of-two scalings,
  one rounding to float32.

Nothing in C depends on the order in which S was summed, so no BLAS kernel choice, no
thread count, no CPU and no split of K (across calls, chunks or tensor-parallel ranks)
can change a bit. How S is computed exactly: float64 products of integers, for which
every partial sum is an integer below ``2**53`` and hence exact whatever the order. That
holds for any K-chunk of ``K_CHUNK = 2**(53 - A_BITS - B_BITS)`` terms (each term is at
most ``2**(A_BITS + B_BITS)``); chunk sums are added in int64. When the Cauchy-Schwarz
bound ``||a_m|| ||b_n|| <= 2**52`` holds for every row and column (typical activations
and weights up to K of a few thousand) a single float64 product over all of K is exact
too and is used instead: the route changes the speed, never S.

Precision: A to 21 bits and B to 24 bits below their row's / column's largest magnitude
(an element of B in the binade of its column's maximum keeps its whole float32
mantissa); the result is within a few float32 ulps of the float64 product of the float32
inputs (tests/invariant/test_fixedpoint.py measures it against float32 BLAS).

Non-finite inputs: every output element whose row of A or column of B holds a NaN or an
infinity is NaN (the rest of the row / column is unaffected).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

aten = torch.ops.aten

A_BITS = 21
B_BITS = 24
K_CHUNK = 2 ** (53 - A_BITS - B_BITS)   # 256: any sum of this many terms is exact in float64
_EXACT_BOUND = 2.0 ** 52                 # Cauchy-Schwarz bound under which one product is exact
_REDUCED = (torch.bfloat16, torch.float16)


def _matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a @ b`` (2-D or 3-D) by the ``.out`` overloads, which the mode never overrides
    (this module runs inside the mode's kernels)."""
    if a.dim() == 2:
        return aten.mm.out(a, b, out=a.new_empty((a.shape[0], b.shape[1])))
    return aten.bmm.out(a, b, out=a.new_empty((a.shape[0], a.shape[1], b.shape[2])))


def _sq_norm(x: torch.Tensor, dim: int) -> torch.Tensor:
    """Euclidean norms along ``dim`` (kept), by non-overridden ops."""
    sq = x * x
    shape = list(sq.shape)
    shape[dim] = 1
    return aten.sum.IntList_out(sq, [dim], True, out=sq.new_empty(shape)).sqrt_()


def pow2(e: torch.Tensor) -> torch.Tensor:
    """``2.0 ** e`` in float64, exactly, for integer ``e`` in [-1022, 1023] (the bits)."""
    return ((e.to(torch.int64) + 1023) << 52).view(torch.float64)


def _as_f32(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.float32) if x.dtype in _REDUCED else x


@dataclass
class Fixed:
    """One operand in fixed point: ``ints`` (float64 holding integers) with ``exps`` the
    power-of-two exponent of each row (A) / column (B) (``dim`` the axis reduced), ``bad``
    where a row / column held a non-finite value (or None); :attr:`norms`, the Euclidean
    norm of each row / column of ``ints`` (the exactness bound), is computed when first
    asked for (only products over more than K_CHUNK terms need it)."""

    ints: torch.Tensor
    exps: torch.Tensor
    bad: torch.Tensor | None
    dim: int
    _norms: torch.Tensor | None = None

    @property
    def norms(self) -> torch.Tensor:
        if self._norms is None:
            self._norms = _sq_norm(self.ints, self.dim)
        return self._norms


def scan(x: torch.Tensor, dim: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """The first half of :func:`to_fixed`: ``x`` in float64 with non-finite values set to
    0, each slice's maximum magnitude ``top`` along ``dim`` (kept) and ``bad`` (slices that
    held a non-finite value, or None). A slice split across tensor-parallel ranks takes
    the MAX of ``top`` and of ``bad`` over them (exact) before :func:`quantize`."""
    xd = _as_f32(x).to(torch.float64)
    if xd.shape[dim] == 0:                            # an empty slice scales like a zero one
        shape = list(xd.shape)
        shape[dim] = 1
        return xd, xd.new_zeros(shape), None
    top = xd.abs().amax(dim=dim, keepdim=True)        # NaN / inf show in the maxima
    bad = None
    if not bool(torch.isfinite(top).all()):
        finite = torch.isfinite(xd)
        bad = ~finite.all(dim=dim, keepdim=True)
        xd = torch.where(finite, xd, 0.0)
        top = xd.abs().amax(dim=dim, keepdim=True)
    return xd, top, bad


def quantize(xd: torch.Tensor, top: torch.Tensor, bad: torch.Tensor | None, dim: int, bits: int,
             owned: bool = False) -> Fixed:
    """The second half of :func:`to_fixed`: the integers of ``xd`` (float64, finite) at
    ``bits`` bits below the exponent of ``top`` (each slice's maximum magnitude; broadcast
    along ``dim``). ``owned``: ``xd`` may be scaled in place."""
    e = torch.frexp(top)[1]
    ints = torch.round(xd.mul_(pow2(bits - e)) if owned else xd * pow2(bits - e))
    return Fixed(ints, e, bad, dim)


def to_fixed(x: torch.Tensor, dim: int, bits: int) -> Fixed:
    """``x`` (float32 / bf16 / f16, any leading batch dims) in fixed point along ``dim``
    (-1: per row of A; -2: per column of B), ``bits`` bits below each slice's maximum."""
    xd, top, bad = scan(x, dim)
    return quantize(xd, top, bad, dim, bits, owned=xd is not x)


def _bound(a: Fixed, b: Fixed) -> float:
    """Cauchy-Schwarz: no partial sum of any row-column product exceeds this."""
    if not a.norms.numel() or not b.norms.numel():
        return 0.0
    return float(a.norms.max()) * float(b.norms.max())


def exact_dot(a: Fixed, b: Fixed) -> torch.Tensor:
    """``S = a.ints @ b.ints`` exactly: float64 (integers) when one product is provably
    exact, else int64 from K_CHUNK-term chunks. Batched when the operands are."""
    k = a.ints.shape[-1]
    if k <= K_CHUNK or _bound(a, b) <= _EXACT_BOUND:
        return _matmul(a.ints, b.ints)
    s = None
    for k0 in range(0, k, K_CHUNK):
        part = _matmul(a.ints[..., k0: k0 + K_CHUNK], b.ints[..., k0: k0 + K_CHUNK, :])
        part = part.to(torch.int64)
        s = part if s is None else s.add_(part)
    return s


def exact_int(a: Fixed, b: Fixed) -> torch.Tensor:
    """:func:`exact_dot` as int64 (a float64 sum holds an integer below ``2**53``: exact).
    Partial sums over disjoint K-ranges of one product add in int64 to its ``S``, in any
    order and grouping, bitwise (the tensor-parallel combine)."""
    s = exact_dot(a, b)
    return s if s.dtype == torch.int64 else s.to(torch.int64)


def combine(s: torch.Tensor, a: Fixed, b: Fixed, dtype: torch.dtype) -> torch.Tensor:
    """``C`` from the exact sums ``s`` (float64 or int64, (..., M, N)), rounded once to
    float32, then to ``dtype`` when that is a reduced precision."""
    c = s.to(torch.float64).mul_(pow2(a.exps - A_BITS)).mul_(pow2(b.exps - B_BITS)).to(torch.float32)
    if a.bad is not None or b.bad is not None:
        bad = (a.bad if a.bad is not None else torch.zeros_like(a.exps, dtype=torch.bool)) | \
              (b.bad if b.bad is not None else torch.zeros_like(b.exps, dtype=torch.bool))
        c = c.masked_fill_(bad, float("nan"))
    return c if dtype == torch.float32 or not dtype.is_floating_point else c.to(dtype)


def fixed_b(b: torch.Tensor) -> Fixed:
    """The B operand (``(..., K, N)``) in fixed point: per column."""
    return to_fixed(b, -2, B_BITS)


def matmul(a: torch.Tensor, b: torch.Tensor, fb: Fixed | None = None) -> torch.Tensor:
    """The portable product ``a (..., M, K) @ b (..., K, N)`` (2-D, or batched with equal
    batch dims), in ``a``'s dtype; ``fb``: ``b`` already in fixed point (a cached weight).
    Guarantee: bitwise the definition above, on any CPU, BLAS and thread count."""
    fa = to_fixed(a, -1, A_BITS)
    fb = fixed_b(b) if fb is None else fb
    return combine(exact_dot(fa, fb), fa, fb, a.dtype)



def weighted_sum(p: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """The portable ``p @ v`` for weights ``p (..., M, K)`` over the rows ("keys") of
    ``v (..., K, N)``, each row of ``v`` scaled on its own: key ``k``'s exponent ``g_k``
    (of ``max_n |v[k, n]|``) is folded into ``p``'s column ``k``
    (``p'[m, k] = p[m, k] * 2**g_k``, exact), ``b[k, n] = round(v[k, n] * 2**(B_BITS - g_k))``,
    and ``C = float32(S * 2**(e_m - A_BITS) * 2**-B_BITS)`` with ``e_m`` the exponent of
    row ``m`` of ``p'``. Unlike :func:`matmul`, no scale couples two keys, so a key with
    weight 0 in row ``m`` changes nothing in row ``m`` (the attention's future and padded
    keys). A non-finite value of ``v``: NaN in every row that weighs its key."""
    p, v = _as_f32(p), _as_f32(v)
    vf = to_fixed(v, -1, B_BITS)                                   # exps: (..., K, 1)
    fa = to_fixed(p.to(torch.float64) * pow2(vf.exps.transpose(-1, -2)), -1, A_BITS)
    zero = vf.exps.new_zeros(vf.exps.shape[:-2] + (1, v.shape[-1]))
    fb = Fixed(vf.ints, zero, None, -2)
    c = combine(exact_dot(fa, fb), fa, fb, torch.float32)
    if vf.bad is not None:
        touched = ((p != 0) & vf.bad.transpose(-1, -2)).any(dim=-1, keepdim=True)
        c = c.masked_fill_(touched, float("nan"))
    return c
