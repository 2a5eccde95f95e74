"""Every constant and formula of the sampling semantics, defined once.

The torch ops (:mod:`detsample.ops`), the host-array form of the uniforms
(:mod:`detsample.rng`) and the Triton kernels (:mod:`detsample.kernels`) import what is
here; none writes a rule again. Each formula below takes a torch tensor, a numpy array
or a Python scalar and applies the SAME IEEE operations to each (the spellings differ,
the arithmetic does not), so a route may pick the cheapest container without changing
a bit. A Triton kernel cannot call Python, so the few formulas it needs are spelled once
more as ``@triton.jit`` helpers in :mod:`detsample.kernels.common`, built from the
constants here; one test table (tests/rules_cases.py) drives both spellings
(tests/test_rules.py, tests/kernels/test_rules.py).

The rules (docs/sampling.md, step 8 and 9):

* exp: detsample's own (:mod:`detsample.arith`: a fixed sequence of float64 IEEE
  operations rounded once to float32, the same bits on every platform), never a
  platform library's;
* mass: ``q = trunc(exp(z) * 2**F)`` (int64) with ``F = frac_bits(V)``, scaled logits
  ``z <= 0``; ``exp`` may be fed ``max(z, EXP_FLOOR)`` (no mass changes);
* top-p: a value is kept when the mass strictly above it passes
  ``float64(above) < top_p * float64(Z)`` (``Z`` = the top-k survivors' mass; top_p >= 1:
  every value passes);
* min-p: kept when ``exp(z) >= float32(min_p)``: the one element-wise filter, an entry of
  :data:`ELEMENT_FILTERS` (the registry every strategy and the Triton kernel read: a
  new element-wise filter is its parameter field, its entry here, its Triton spelling);
* draw: ``t = min(floor(u * float64(Q)), Q - 1)`` over the kept mass ``Q``, and the token
  is the first one, in token-id order, whose running mass exceeds ``t``;
* uniform: ``u = (n + 0.5) * 2**-52`` of 52 random bits ``n`` (open interval (0, 1)).

Guarantee: these are exact integer operations or single correctly rounded IEEE
operations, so every container gives the same bits (tests/test_rules.py).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from detsample import arith
from detsample.arith.spec import MASS_BITS, MAX_FRAC, frac_bits  # noqa: F401 (the rule)

# -- constants ----------------------------------------------------------------------------

#: exp(-87) = 1.6e-38 is the smallest normal float32 result ``exp`` is let produce: below
#: it ``exp`` is subnormal (a slow path on x86) and the mass is 0 anyway
#: (``exp(EXP_FLOOR) * 2**52 < 1``), so clamping there first changes no ``q``
EXP_FLOOR = -87.0
#: the id padding a CDF table or a candidate buffer: larger than any token id
PAD_ID = (1 << 63) - 1
#: random bits of a uniform, and the scale of ``u = (n + 0.5) * U_SCALE``
U_BITS = 52
U_SCALE = 2.0**-U_BITS

#: step 2: a NaN logit becomes this finite floor (the lowest float32: "never chosen unless
#: the whole row is NaN", then the row is uniform over its NaN tokens), a +inf logit the
#: largest finite float32 (ties among them, ids ascending)
NAN_FLOOR = float(np.finfo(np.float32).min)
POSINF_CEIL = float(np.finfo(np.float32).max)

#: per-row status bit flags (``SampleOutput.status``)
STATUS_OK = 0
STATUS_HAD_NAN = 1  # a NaN logit was replaced by the finite floor
STATUS_HAD_POSINF = 2  # a +inf logit was replaced by the float32 maximum
STATUS_NO_VALID_TOKEN = 4  # nothing admissible: token -1, logprob -inf
STATUS_GRAMMAR_ERROR = 8  # the row's grammar matcher failed (with NO_VALID_TOKEN)


# -- mass -----------------------------------------------------------------------------


def mass_scale(frac: int) -> float:
    """``2**frac``: the scaling of a mass (a power of two: exact in float32 and float64)."""
    return 2.0**frac


def mass(e: Any, frac: int) -> Any:
    """``q = trunc(e * 2**frac)`` of ``e = exp(z)`` in [0, 1]: an int64 tensor for a float
    tensor, an int64 array for a float array (float32 stays float32: the scaling is exact),
    a Python int for a Python float."""
    s = mass_scale(frac)
    if isinstance(e, torch.Tensor):
        return (e * s).to(torch.int64)
    if isinstance(e, np.ndarray):
        return (e * e.dtype.type(s)).astype(np.int64)
    return int(e * s)


def floored_exp(
    z: torch.Tensor, out: torch.Tensor | None = None, keep_from: torch.Tensor | None = None
) -> torch.Tensor:
    """``exp(max(z, EXP_FLOOR))`` of a float32 tensor (into ``out`` when given), the exp
    of :mod:`detsample.arith`: the ``exp`` a full-vocabulary mass pass feeds :func:`mass`
    (the same ``q`` as ``exp(z)``).

    keep_from: optional (rows,) float32 thresholds of a (rows, V) ``z``: an entry below
    its row's threshold gets ``exp(EXP_FLOOR)`` instead, whose mass is 0, so :func:`mass`
    of the result is the kept set's masses (0 elsewhere). The entries are dropped before
    the ``exp``, by comparing values, never masses (``exp`` may map a value below the
    threshold onto the threshold's own ``exp``; :func:`keep_at_least`)."""
    w = torch.clamp(z, min=EXP_FLOOR, out=out) if out is not None else z.clamp(min=EXP_FLOOR)
    if keep_from is not None:
        keep_at_least(w, keep_from, EXP_FLOOR)
    return arith.exp(w, out=w)


#: from this many entries a row, one ``threshold_`` call per row (a few microseconds of
#: dispatch) costs less than a ``masked_fill_`` of the row (~2 ns an entry on a CPU)
ROW_THRESHOLD_MIN = 4096


def keep_at_least(w: torch.Tensor, least: torch.Tensor, fill: float) -> None:
    """Set, in place, ``w[r, i] = fill`` where ``w[r, i] < least[r]``: each row keeps its
    entries ``>= least[r]``. w: (rows, V) float32; least: (rows,) float32, ``-inf`` for a
    row that keeps everything. On a CPU the cut is ``threshold_`` (vectorised; a boolean
    mask and ``masked_fill_`` run a scalar loop there, ~10x as long per entry), which
    keeps ``x > t`` with ``t`` the float32 just below ``least`` (the same set: no float32
    lies between them): one call for the whole tensor when the rows share ``least``, else
    one per row from ``ROW_THRESHOLD_MIN`` entries a row; otherwise one ``masked_fill_``."""
    rows, V = w.shape
    if w.device.type == "cpu":
        with np.errstate(over="ignore"):  # below the lowest float32: -inf, as meant
            below = np.nextafter(least.cpu().numpy().astype(np.float32), np.float32(-np.inf))
        ts = below.tolist()
        if len(set(ts)) == 1:
            if ts and ts[0] != -math.inf:
                torch.nn.functional.threshold_(w, ts[0], fill)
            return
        if V >= ROW_THRESHOLD_MIN:
            for r, t in enumerate(ts):
                if t != -math.inf:
                    torch.nn.functional.threshold_(w[r], t, fill)
            return
    w.masked_fill_(w < least.unsqueeze(1), fill)


def mass_in_place(w: torch.Tensor, frac: int, q_out: torch.Tensor | None = None) -> torch.Tensor:
    """:func:`mass` of a float32 tensor ``w = exp(z)`` that may be overwritten: ``w`` is
    scaled in place, then truncated into ``q_out`` (an int64 buffer) when given (the same
    bits as ``mass(w, frac)``; a reused buffer spares the page faults of a fresh one)."""
    w.mul_(mass_scale(frac))
    return q_out.copy_(w) if q_out is not None else w.to(torch.int64)


def cut_masses(
    z: torch.Tensor,
    frac: int,
    *,
    tau: torch.Tensor | None = None,
    least: torch.Tensor | None = None,
    block: int | None = None,
    want_q: bool = True,
    out: torch.Tensor | None = None,
    q_out: torch.Tensor | None = None,
) -> tuple[torch.Tensor | None, torch.Tensor]:
    """The kept tokens' masses (:func:`mass` of :func:`floored_exp`, 0 off the kept set)
    and their exact sums by blocks of columns: THE full-row mass pass of step 8.

    z: (rows, V) float32 scaled logits; tau: (rows,) float32 value thresholds (kept: ``z
    >= tau``; None or ``-inf``: none); least: (rows,) float32 the smallest kept exp of
    the element-wise filters (kept: ``exp(z) >= least``; None: none); block: columns per
    sum (None: the whole row); want_q: whether the (rows, V) int64 masses are returned
    (else None: only the sums are needed); out / q_out: optional (rows, V) float32 /
    int64 scratch. Returns ``(q, sums)``, sums (rows, ceil(V / block)) int64.

    On CPU tensors one fused pass of detsample.arith's numba kernels (no (rows, V)
    intermediate; ``q`` written only when wanted); elsewhere, or without numba, the torch
    composition :func:`floored_exp` -> :func:`keep_at_least` -> :func:`mass_in_place`.
    The same bits (exact integers of the same exps; tests/test_rules.py)."""
    rows, V = z.shape
    block = block or max(V, 1)
    if fused_masses(z):
        from detsample.arith import cpu

        q = (q_out if q_out is not None else torch.empty(z.shape, dtype=torch.int64)) if want_q else None
        inf = torch.full((rows,), -math.inf)
        sums = cpu.cut_masses(
            z, inf if tau is None else tau, inf if least is None else least, EXP_FLOOR, frac, block, q
        )
        return q, sums
    w = floored_exp(z, out=out, keep_from=tau)
    if least is not None:
        keep_at_least(w, least, 0.0)
    q = mass_in_place(w, frac, q_out)
    return (q if want_q else None), block_sums(q, block)


def block_sums(q: torch.Tensor, block: int | None) -> torch.Tensor:
    """(rows, ceil(V / block)) int64 exact sums of masses ``q`` (rows, V) by blocks of
    ``block`` columns (None: the whole row; the last block may be shorter)."""
    rows, V = q.shape
    block = block or max(V, 1)
    nb = V // block
    sums = q[:, : nb * block].view(rows, nb, block).sum(-1)
    if nb * block < V:
        sums = torch.cat([sums, q[:, nb * block :].sum(-1, keepdim=True)], dim=1)
    return sums


def fused_masses(z: torch.Tensor) -> bool:
    """Whether :func:`cut_masses` of ``z`` is one fused pass (a float32 CPU tensor where
    detsample.arith's numba kernels run; else the torch composition)."""
    if z.device.type != "cpu" or z.dtype != torch.float32:
        return False
    from detsample.arith import cpu

    return cpu.available()


# -- top-p and min-p ----------------------------------------------------------------------


def _f64(x: Any) -> Any:
    if isinstance(x, torch.Tensor):
        return x.to(torch.float64)
    if isinstance(x, np.ndarray):
        return x.astype(np.float64, copy=False)
    return float(x)


def top_p_limit(top_p: Any, total: Any) -> Any:
    """The top-p limit ``top_p * float64(Z)``, ``+inf`` where ``top_p >= 1`` (disabled).
    top_p: float64 (or ``+inf`` already where disabled); total: the int64 mass ``Z``."""
    if isinstance(total, torch.Tensor):
        tp = top_p.to(torch.float64) if isinstance(top_p, torch.Tensor) else top_p
        return torch.where(torch.as_tensor(tp >= 1.0), math.inf, tp * _f64(total))
    if isinstance(total, np.ndarray):
        tp = np.asarray(top_p, dtype=np.float64)
        return np.where(tp >= 1.0, math.inf, tp * _f64(total))
    return math.inf if top_p >= 1.0 else top_p * float(total)


def top_p_keeps(above: Any, limit: Any) -> Any:
    """Whether a value whose mass strictly above it is ``above`` (int64) is kept by the
    limit of :func:`top_p_limit`: ``float64(above) < limit``."""
    return _f64(above) < limit


def min_p_keeps(e: Any, min_p: Any) -> Any:
    """Whether a token with ``e = exp(z)`` (float32) is kept by min-p: ``e >= min_p``
    (``exp`` of the max is 1, so this is ``p >= min_p * p_max`` on any renormalisation)."""
    return e >= min_p


def min_p_drops(e: Any, min_p: Any) -> Any:
    """The complement of :func:`min_p_keeps` (``e < min_p``; ``e`` is never NaN)."""
    return e < min_p


# -- the element-wise filters -------------------------------------------------------------


@dataclass(frozen=True)
class ElementFilter:
    """A step-8 filter that keeps or drops each token by its own value: row-local and
    element-wise, unlike top-k (a rank) and top-p (a mass).

    ``name``: the :class:`~detsample.params.SamplingParams` field holding the row's
    parameter (carried as float32); ``neutral``: the parameter value that disables the
    filter (it keeps every token); ``keeps(e, value)``: whether a token with ``e =
    exp(z)`` (float32, the max-shifted scaled logit's ``exp``: 1 at the row's maximum) is
    kept, for the float32 parameter ``value`` (broadcastable to ``e``). The test must keep
    an upper set of ``e`` (a kept value keeps every larger one: the kept set stays ``z >=
    tau``) and keep ``e = 1`` for every admissible parameter (a row never loses its
    maximum); it may be applied to torch tensors, numpy arrays or Python floats.
    ``least(value)``: the smallest kept ``e`` as a float32-representable Python float, when
    the test is ``e >= least(value)`` (then a strategy may drop tokens with one select
    pass, ``ops.draw.kept_mass``), or None (the test is evaluated as a mask)."""

    name: str
    neutral: float
    keeps: Callable[[Any, Any], Any]
    least: Callable[[float], float] | None = None


#: the element-wise filters of step 8, in their column order of the ``(B, F)`` float32
#: parameter tensor every strategy reads (``SamplingBatch.element_filters``); a filter is
#: applied after top-k and top-p, the filters among themselves in this order (an AND:
#: the order changes nothing). The Triton spelling of each test is
#: ``kernels.common.element_keeps``.
ELEMENT_FILTERS: tuple[ElementFilter, ...] = (ElementFilter("min_p", 0.0, min_p_keeps, least=float),)


def element_values(params: Any) -> list[float]:
    """The element-wise filters' parameters of one row (an object with the fields, a
    :class:`~detsample.params.SamplingParams`), in :data:`ELEMENT_FILTERS` order."""
    return [float(getattr(params, f.name)) for f in ELEMENT_FILTERS]


def element_in_use(params: Any) -> bool:
    """Whether some element-wise filter of a row's ``params`` is not at its neutral
    value (a bound on the work: a neutral parameter keeps every token anyway)."""
    return any(getattr(params, f.name) != f.neutral for f in ELEMENT_FILTERS)


def element_tensor(rows: int, device: Any = "cpu", **columns: Any) -> torch.Tensor:
    """A ``(rows, F)`` float32 element-wise filter tensor: the named filters' columns
    from ``columns`` (a (rows,) tensor or a scalar each), every other filter neutral.
    Raises ValueError for a name that is not a registered filter."""
    names = [f.name for f in ELEMENT_FILTERS]
    unknown = sorted(set(columns) - set(names))
    if unknown:
        raise ValueError(f"not an element-wise filter: {unknown} (registered: {names})")
    out = torch.empty((rows, len(names)), dtype=torch.float32, device=device)
    for j, f in enumerate(ELEMENT_FILTERS):
        out[:, j] = columns.get(f.name, f.neutral)
    return out


def element_active(values: torch.Tensor) -> torch.Tensor:
    """(rows,) bool: the rows of a ``(rows, F)`` parameter tensor with some element-wise
    filter not at its neutral value."""
    active = None
    for j, f in enumerate(ELEMENT_FILTERS):
        a = values[:, j] != f.neutral
        active = a if active is None else active.logical_or_(a)
    if active is None:
        return torch.zeros(values.shape[:1], dtype=torch.bool, device=values.device)
    return active


def element_keeps(e: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """bool, ``e``'s shape: whether every element-wise filter keeps each token. e: (rows,
    K) float32 ``exp(z)``; values: (rows, F) float32 the rows' parameters (column j:
    ``ELEMENT_FILTERS[j]``). With no filter registered, every token is kept."""
    kept = None
    for j, f in enumerate(ELEMENT_FILTERS):
        k = f.keeps(e, values[:, j : j + 1])
        kept = k if kept is None else kept.logical_and_(k)
    return torch.ones_like(e, dtype=torch.bool) if kept is None else kept


# -- draw -------------------------------------------------------------------------------


def draw_target(u: Any, total: Any) -> Any:
    """The inverse-CDF target ``t = min(floor(u * float64(Q)), Q - 1)`` (int64) of a
    float64 uniform ``u`` in (0, 1) and the int64 kept mass ``Q >= 1``."""
    if isinstance(total, torch.Tensor):
        t = torch.floor(_f64(u) * _f64(total)).to(torch.int64)
        return torch.minimum(t, total - 1)
    if isinstance(total, np.ndarray):
        return np.minimum(np.floor(u * _f64(total)).astype(np.int64), total - 1)
    return min(math.floor(u * float(total)), total - 1)


def first_above(csum: Any, t: Any) -> Any:
    """The position of the first running mass above ``t``: the count of entries ``<= t``
    of the non-decreasing int64 running sums ``csum``. Torch: ``csum`` (rows, K), ``t``
    (rows, 1) -> (rows, 1); numpy: (R, K) and (R,) -> (R,), or one (K,) row and a scalar;
    a Python sequence and an int -> an int."""
    if isinstance(csum, torch.Tensor):
        return torch.searchsorted(csum, t, right=True)
    if isinstance(csum, np.ndarray):
        if csum.ndim == 1:
            return int(np.searchsorted(csum, t, side="right"))
        return (csum <= t[:, None]).sum(1)
    j = 0
    for c in csum:
        if c > t:
            break
        j += 1
    return j


# -- uniform ------------------------------------------------------------------------------


def u52(w0: Any, w1: Any) -> Any:
    """The 52 random bits ``(w0 << 20) | (w1 >> 12)`` of two uint32 Philox words (int64
    tensors, uint64 arrays or Python ints)."""
    if isinstance(w0, np.ndarray):
        return (w0 << np.uint64(20)) | (w1 >> np.uint64(12))
    return (w0 << 20) | (w1 >> 12)


def uniform(n: Any) -> Any:
    """``u = (n + 0.5) * 2**-52`` in float64 of 52 random bits ``n`` (an integer tensor,
    an integer array or a Python int): exact, never 0 and never 1."""
    if isinstance(n, torch.Tensor):
        return (n.to(torch.float64) + 0.5) * U_SCALE
    if isinstance(n, np.ndarray):
        return (n.astype(np.float64) + 0.5) * U_SCALE
    return (n + 0.5) * U_SCALE
