"""On-machine verification: the properties the fast kernels rest on, checked where they run.

The verified (non-portable) kernels of the mode lean on torch's and MKL's kernels, whose
choices depend on the CPU, ``MKL_ENABLE_INSTRUCTIONS``, the thread count and the operands'
shapes and layouts. None of that is assumed: at the first use of each key, the property
the kernel needs is checked on this machine with random data, and the decision is kept
in the plan registry (:mod:`detsample.invariant.state`).

Every decision is made **at 1 thread** (the canonical plan) and then **checked at each
other thread count** the process uses: where the same kernel gives the 1-thread bits there
(at every position, next to fresh or zero neighbours), it runs at that count; where it
does not (MKL splits K across threads for large K), it runs at 1 thread. So every thread
count gives the canonical plan's bits, by construction. Ladders are chosen by a static
cost (:func:`~detsample.invariant.tiles.ladder_cost`), never by timing, so two runs of one
machine always choose alike.

``matmul_plan(kind, k, n, layout, dtype)``
    a row of a tiled product (:mod:`detsample.invariant.tiles`) has the same bits in every
    tile size of a ladder, at every position of a tile, next to random or zero neighbours,
    and (``bmm``) in a batch of 1, 3 or 8 matrices; a column keeps its bits when B's other
    columns change. Tried: ``B`` in its own layout and (for a transposed ``B``) as a
    contiguous copy; the passing ladder of least cost wins. None passes: the portable
    correctly rounded product (:mod:`detsample.invariant.exact`), with a warning.
``sum_plan(n, dtype)``
    a row summed by torch's ``sum`` alone, or in calls of 2, 3 or many rows (at any
    position), has the same bits. Else: the fixed tree (:mod:`detsample.invariant.tree`),
    with a warning.
``pointwise_plan(op, dtype, args)``
    an element's bits under :func:`detsample.ops.vector.pointwise` do not depend on its
    position or the buffer's length. Else: the op is refused (:class:`NotInvariantError`),
    or, where one exists, a fallback is named by the caller.

Every check compares bits (``torch.equal``); its random data are seeded by the key, so a
decision is reproducible. A plan records what it rests on and why
(:class:`~detsample.invariant.state.Plan`); ``detsample probe model`` lists them.
"""

from __future__ import annotations

import warnings
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from detsample.errors import DetsampleError
from detsample.invariant import tiles
from detsample.invariant.state import ARITHMETIC, VERIFIED, Plan, plans
from detsample.ops.vector import PAD, pointwise
from detsample.probe.threads import torch_threads

aten = torch.ops.aten

SUM_CHUNK = 8192  # widest row summed by one torch call (longer rows: chunks, then again)
SUM_GRAIN = 32768  # torch's GRAIN_SIZE: calls below it run one serial loop
BATCHES = (1, 2, 3, 8)  # bmm batch sizes compared at 1 thread (see batches())


def batches(threads: int) -> tuple[int, ...]:
    """The bmm batch sizes compared at ``threads`` threads: :data:`BATCHES` and every count
    up to ``threads + 1``. A BLAS gives each matrix of a batch with fewer matrices than
    threads more than one thread, and that share decides its kernel: measured, under MKL's
    AVX2 path at 4 threads a batch of 2 rounded its 64-row tiles unlike 1 thread while
    batches of 1, 3 and 8 agreed (the attention's GQA groups made such a batch)."""
    return tuple(sorted(set(BATCHES) | set(range(1, threads + 2))))


class NotInvariantError(DetsampleError, RuntimeError):
    """An op the mode needs is not invariant on this machine and has no fallback."""


class FallbackWarning(UserWarning):
    """A verified kernel failed its check here; the mode took a constructed one."""


def _gen(key: tuple) -> torch.Generator:
    return torch.Generator().manual_seed(zlib.crc32(repr(key).encode()))


def _values(shape: Sequence[int], g: torch.Generator, dtype: torch.dtype) -> torch.Tensor:
    """Normal values with row magnitudes spread over 2**-6 .. 2**6 (float32 normals times
    exact powers of two, then cast to ``dtype``)."""
    x = torch.randn(tuple(shape), generator=g, dtype=torch.float32)
    scale = torch.exp2(torch.randint(-6, 7, tuple(shape[:-1]) + (1,), generator=g).to(torch.float32))
    return x.mul_(scale).to(dtype)


WEIGHT_ROWS = 521  # distinct random rows of a checked weight (a prime: no tile or block period)


def _weight(shape: tuple[int, int, int], g: torch.Generator, dtype: torch.dtype) -> torch.Tensor:
    """A random ``(nb, n, k)`` weight whose rows repeat with period :data:`WEIGHT_ROWS`:
    the call keeps its real shape (which decides the BLAS kernel) while only
    ``WEIGHT_ROWS * k`` values are drawn (drawing all of a 2048 x 8192 weight was most of a
    check's time); every output column is still compared."""
    nb, n, k = shape
    if n <= WEIGHT_ROWS:
        return _values(shape, g, dtype)
    base = _values((nb, WEIGHT_ROWS, k), g, dtype)
    return base.index_select(1, torch.arange(n) % WEIGHT_ROWS)


# -- matmul --------------------------------------------------------------------------------


def _layout(b: torch.Tensor) -> str:
    """``"nn"`` (rows of B contiguous), ``"nt"`` (B a transposed contiguous matrix) or
    ``"other"`` (anything else: the kernel makes it contiguous)."""
    st = b.stride()[-2:]
    k, n = b.shape[-2:]
    if st[1] == 1 and (st[0] == n or k <= 1):
        return "nn"
    if st[0] == 1 and (st[1] == k or n <= 1):
        return "nt"
    return "other"


def layout(b: torch.Tensor) -> str:
    """B's layout class as the plans key it (see :func:`matmul_plan`)."""
    lay = _layout(b)
    return "nn" if lay == "other" else lay


def _run(a: torch.Tensor, b: torch.Tensor, size: int) -> torch.Tensor:
    """``a``'s rows in tiles of ``size`` rows only."""
    return tiles.run(a, b, (size,))


MIN_VALUES = 2048  # output values compared per tile size (a narrow B: more rows)


def compared_rows(size: int, n: int) -> int:
    """Rows of A compared for tile size ``size`` when B has ``n`` columns: at least the
    tile and at least MIN_VALUES / n rows (in whole tiles, at most TILE): a 1-row tile of a
    3-column product must not pass on 3 values that happen to agree (measured: it did)."""
    want = -(-MIN_VALUES // max(n, 1))
    return max(size, min(tiles.TILE, -(-want // size) * size))


def _refs(a: torch.Tensor, b: torch.Tensor, nbs: Sequence[int]) -> dict:
    """``{(nb, size): rows}``: each matrix alone, at 1 thread, :func:`compared_rows` rows in
    tiles of each size: the bits every call of a passing plan must give (batched:
    concatenated per nb)."""
    two_d = nbs == (1,)
    n = b.shape[-1]
    with torch_threads(1):
        per = {
            s: [
                _run(
                    (a[i] if two_d else a[i : i + 1])[..., : compared_rows(s, n), :], b[i] if two_d else b[i : i + 1], s
                )
                for i in range(max(nbs))
            ]
            for s in tiles.SIZES
        }
    return {
        (nb, s): per[s][0] if two_d else torch.cat(per[s][:nb]) for nb in range(1, max(nbs) + 1) for s in tiles.SIZES
    }


@dataclass(frozen=True)
class _Operands:
    """A product's check operands: ``a`` ``(nb, 2*TILE, K)``, ``b`` ``(nb, K, N)``, the batch
    counts ``nbs`` (``(1,)``: a 2-D ``mm``) and the 1-thread references ``ref``
    (:func:`_refs`)."""

    a: torch.Tensor
    b: torch.Tensor
    nbs: tuple[int, ...]
    ref: dict

    def sub(self, x: torch.Tensor, nb: int) -> torch.Tensor:
        return x[0] if self.nbs == (1,) else x[:nb]

    def threads_differ(self, s: int, threads: int) -> str | None:
        """Why ``s``-row tiles at ``threads`` threads differ from the references (None: not)."""
        n = self.b.shape[-1]
        for nb in self.nbs:
            a = self.sub(self.a, nb)[..., : compared_rows(s, n), :]
            if not torch.equal(_run(a, self.sub(self.b, nb), s), self.ref[(nb, s)]):
                return f"{threads} thread(s) differ from 1 thread" + (
                    "" if self.nbs == (1,) else f" or {nb} matrices from one"
                )
        return None

    def placed(self, s: int) -> str | None:
        """Why a row's bits depend on its place in an s-row tile (None: they do not):
        the reference rows reversed at odd positions, fresh rows and zero rows
        alternating at even ones (a 1-row tile: the row is its own reference)."""
        if s == 1:
            return None
        T = tiles.TILE
        for nb in self.nbs:
            aa, bb, want = self.sub(self.a, nb), self.sub(self.b, nb), self.ref[(nb, s)][..., :s, :]
            mixed = aa[..., T : T + s, :].clone()
            mixed[..., 0::4, :] = 0
            mixed[..., 1::2, :] = aa[..., :s, :].flip(-2)[..., 1::2, :]
            if not torch.equal(_run(mixed, bb, s)[..., 1::2, :], want.flip(-2)[..., 1::2, :]):
                return "a row's bits depend on its position or neighbours"
            if (why := _everywhere(aa, bb, want, s)) is not None:
                return why
        return None

    def columns_free(self, top: int) -> bool:
        """Whether a column's bits stay when the other columns of B change."""
        for nb in self.nbs:
            aa, bb = self.sub(self.a, nb), self.sub(self.b, nb)
            other = bb.flip(-1) * 0.5
            other[..., :1] = bb[..., :1]
            if not torch.equal(
                _run(aa[..., :top, :], _like_layout(other, bb), top)[..., :1], self.ref[(nb, top)][..., :top, :1]
            ):
                return False
        return True

    def ladders(self, valid: list[int]) -> list[list[int]]:
        """``valid`` sizes grouped by agreeing rows (row p of a small tile = row p of the
        largest), each ladder smallest first."""
        out: list[list[int]] = []
        for s in reversed(valid):
            for lad in out:
                m = self.ref[(self.nbs[0], s)].shape[-2]
                if all(torch.equal(self.ref[(nb, s)], self.ref[(nb, lad[0])][..., :m, :]) for nb in self.nbs):
                    lad.insert(0, s)
                    break
            else:
                out.append([s])
        return out


def _everywhere(aa: torch.Tensor, bb: torch.Tensor, want: torch.Tensor, s: int) -> str | None:
    """The tile's first row at EVERY position of the tile (a tile of its copies) against its
    own bits at position 0 (:meth:`_Operands.placed` covers zero and fresh neighbours)."""
    row = aa[..., :1, :]
    copies = row.expand(row.shape[:-2] + (s, row.shape[-1])).contiguous()
    expect = want[..., :1, :]
    if not torch.equal(_run(copies, bb, s), expect.expand(expect.shape[:-2] + (s, expect.shape[-1]))):
        return "row 0 of a tile has other bits at another position"
    return None


def _matmul_candidate(
    a: torch.Tensor, b: torch.Tensor, nbs: Sequence[int], threads: int, ref: dict, only: tuple[int, ...] | None = None
) -> tuple[tuple[int, ...] | None, str]:
    """(the cheapest ladder that passes, or None; why) for operands ``a`` ``(nb, 2*TILE, K)``
    and ``b`` ``(nb, K, N)`` (``nbs == (1,)``: a 2-D ``mm``) run at ``threads`` threads,
    against the 1-thread references ``ref`` (:func:`_refs`).

    A tile size qualifies when its rows (in a batch of 1, 3 or 8 matrices for ``bmm``)
    equal the references (at 1 thread the references themselves). Qualifying sizes whose
    rows agree with each other (row p of a small tile = row p of the largest) form a
    ladder; ladders are tried cheapest first (:func:`~detsample.invariant.tiles.ladder_cost`):
    its largest and smallest tiles must keep a row's bits at another position among fresh
    and zero rows (with the agreement across sizes, every size then does), and its largest
    tile a column's bits when the other columns of B change (the attention's future keys).
    ``only``: check just these sizes, as one ladder (a canonical plan at another thread
    count)."""
    ops = _Operands(a, b, tuple(nbs), ref)
    bad: dict[int, str] = {}
    sizes = only if only is not None else tiles.SIZES
    with torch_threads(threads):
        for s in sizes if threads > 1 or ops.nbs != (1,) else ():
            if (why := ops.threads_differ(s, threads)) is not None:
                bad[s] = why
        while True:
            valid = [s for s in sizes if s not in bad]
            if only is not None and len(valid) < len(only):
                break
            ladders = ops.ladders(valid)
            if not ladders or (only is not None and len(ladders) > 1):
                break
            lad = min(ladders, key=lambda la: tiles.ladder_cost(tuple(la)))
            why_not = {s: w for s in lad if (w := ops.placed(s)) is not None}
            if why_not:
                bad.update(why_not)
                continue
            if not ops.columns_free(lad[-1]):
                bad[lad[-1]] = "a column depends on the other columns"
                continue
            why = "; ".join(f"{s} rows: {w}" for s, w in sorted(bad.items()))
            return tuple(lad), (f"rows agree in tiles of {'/'.join(map(str, lad))}" + (f" (not: {why})" if why else ""))
    return None, "; ".join(f"{s} rows: {w}" for s, w in sorted(bad.items())) or "no tile size passed"


def _like_layout(x: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """``x`` copied into the memory layout of ``like`` (a transposed matrix)."""
    return x.transpose(-1, -2).contiguous().transpose(-1, -2) if _layout(like) == "nt" else x.contiguous()


class _RefCache(dict):
    """The last few canonical decisions' 1-thread reference rows, so that checking the
    plan at another thread count does not recompute them (bounded: 8 entries)."""

    def __setitem__(self, key, value) -> None:
        while len(self) >= 8:
            del self[next(iter(self))]
        super().__setitem__(key, value)


_REFS = _RefCache()


class _LastOperands(dict):
    """The operands of the decision in progress, so that checking a canonical plan at
    another thread count reuses the random values it was decided on (cleared when the
    decision ends; bounded: a weight can be 64 MB)."""

    def __setitem__(self, key, value) -> None:
        while len(self) >= 2:
            del self[next(iter(self))]
        super().__setitem__(key, value)


_OPERANDS = _LastOperands()


def _operands(
    kind: str, k: int, n: int, lay: str, dtype: torch.dtype, threads: int = 1
) -> tuple[torch.Tensor, torch.Tensor, tuple[int, ...]]:
    """Seeded random operands of a key: ``a (nb, 2*TILE, k)``, ``b (nb, k, n)`` of layout
    ``lay``, and the batch sizes compared at ``threads`` threads (``(1,)`` for mm;
    :func:`batches` for bmm)."""
    nbs = (1,) if kind == "mm" else batches(threads)
    key = (kind, k, n, lay, dtype, max(nbs))
    if key not in _OPERANDS:
        g = _gen(key[:5])
        a = _values((max(nbs), 2 * tiles.TILE, k), g, dtype)
        w = _weight((max(nbs), n, k), g, dtype)
        _OPERANDS[key] = a, w.transpose(1, 2) if lay == "nt" else w.transpose(1, 2).contiguous()
    return _OPERANDS[key] + (nbs,)


def _decide_matmul(kind: str, k: int, n: int, lay: str, dtype: torch.dtype) -> Plan:
    """The canonical plan (decided at 1 thread, so that every thread count gives its bits):
    B in its own layout and (transposed B) as a contiguous copy; the cheapest passing
    ladder wins (a static cost: the choice, hence the bits, never depends on timing)."""
    a, b, nbs = _operands(kind, k, n, lay, dtype)
    tried = []
    best: tuple[float, tuple[int, ...], str, str] | None = None
    ideal = tiles.ladder_cost(tiles.SIZES)
    for form in ("native", "contiguous") if lay == "nt" else ("native",):
        if best is not None and best[0] <= 1.1 * ideal:
            break  # within 10% of every size agreeing: no weight copy
        bb = b if form == "native" else b.contiguous()
        ref = _refs(a, bb, nbs)
        _REFS[(kind, k, n, lay, dtype, form, a.shape[0])] = ref
        ladder, why = _matmul_candidate(a, bb, nbs, 1, ref)
        tried.append(f"{form} layout: {why}")
        # a contiguous copy costs the weight's memory again: it must save 10%
        factor = 1.0 if form == "native" else 1.1
        if ladder is not None and (best is None or factor * tiles.ladder_cost(ladder) < best[0]):
            best = (tiles.ladder_cost(ladder), ladder, form, why)
    if best is not None:
        _, ladder, form, why = best
        return Plan(
            f"torch/BLAS {kind} in row tiles of {'/'.join(map(str, ladder))}, {form} B",
            VERIFIED,
            f"{why} ({'; '.join(tried)})",
            (form, ladder, False),
        )
    reason = "; ".join(tried)
    warnings.warn(
        f"batch-invariant mode: {kind} with K={k}, N={n} ({lay} B, {dtype}) is not "
        f"invariant on this machine's BLAS ({reason}); it takes the portable "
        f"correctly rounded product instead",
        FallbackWarning,
        stacklevel=5,
    )
    return Plan("portable correctly rounded product", ARITHMETIC, f"BLAS check failed: {reason}")


def _at_threads(canon: Plan, kind: str, k: int, n: int, lay: str, dtype: torch.dtype, threads: int) -> Plan:
    """The canonical plan at ``threads`` threads: as is where each of its tile sizes gives
    the 1-thread bits there (at every position, among fresh or zero rows), else the same
    tiles run at 1 thread (the same bits by construction)."""
    form, ladder, _ = canon.data
    a, b, nbs = _operands(kind, k, n, lay, dtype, threads)
    bb = b if form == "native" else b.contiguous()
    ref = _REFS.get((kind, k, n, lay, dtype, form, a.shape[0])) or _refs(a, bb, nbs)
    got, why = _matmul_candidate(a, bb, nbs, threads, ref, only=ladder)
    if got == ladder:
        return Plan(canon.kernel, VERIFIED, f"at {threads} threads: {why}", canon.data)
    return Plan(
        canon.kernel + ", at 1 thread",
        VERIFIED,
        f"at {threads} threads the tiles differ from 1 thread ({why}); they run at 1 thread",
        (form, ladder, True),
    )


def matmul_plan(kind: str, k: int, n: int, lay: str, dtype: torch.dtype) -> Plan:
    """The plan of a product (``kind`` "mm" or "bmm") with ``K = k`` and a column block of
    ``n`` columns, B of layout ``lay`` ("nn" / "nt"), in compute dtype ``dtype``, at the
    current thread count: the canonical (1-thread) plan, checked at this thread count."""
    return _threaded(
        ("matmul", kind, k, n, lay, dtype),
        lambda: _decide_matmul(kind, k, n, lay, dtype),
        lambda canon, t: _at_threads(canon, kind, k, n, lay, dtype, t),
    )


def _decide_big(k: int, n: int, lay: str, dtype: torch.dtype, canon: Plan, threads: int) -> Plan:
    """Which sizes of :data:`~detsample.invariant.tiles.BIG` may run a long 2-D product at
    ``threads`` threads: a big tile qualifies when every row it holds has the canonical
    bits -- the ladder's at 1 thread -- both among fresh rows and reversed among zero
    rows. It changes no bit by construction of the check; it saves the calls (and, where
    the ladder runs at 1 thread because MKL splits K across threads for short tiles, the
    threads: a 512-row call there gives the 1-thread bits at 2 threads)."""
    form, ladder, _ = canon.data
    try:
        _, b, _ = _operands("mm", k, n, lay, dtype)
        bb = b[0] if form == "native" else b[0].contiguous()
        a = _values((max(tiles.BIG), k), _gen(("big", k, n, lay, dtype)), dtype)
        with torch_threads(1):
            ref = tiles.run(a, bb, ladder)
        ok, bad = [], []
        with torch_threads(threads):
            for s in tiles.BIG:
                mixed = a[:s].flip(0).clone()
                mixed[0::4] = 0
                keep = torch.ones(s, dtype=torch.bool)
                keep[0::4] = False
                same = torch.equal(tiles.run_sizes(a[:s], bb, [s]), ref[:s]) and torch.equal(
                    tiles.run_sizes(mixed, bb, [s])[keep], ref[:s].flip(0)[keep]
                )
                (ok if same else bad).append(s)
    finally:
        _OPERANDS.clear()
    why = (
        f"rows of {'/'.join(map(str, ok)) or 'no'}-row calls at {threads} thread(s) agree with "
        f"the tiles of {'/'.join(map(str, ladder))} at 1 thread" + (f" (not: {'/'.join(map(str, bad))})" if bad else "")
    )
    if not ok:
        return Plan("no big tiles", VERIFIED, why, ())
    return Plan(f"big row tiles of {'/'.join(map(str, ok))} at {threads} thread(s)", VERIFIED, why, tuple(ok))


def big_plan(k: int, n: int, lay: str, dtype: torch.dtype, canon: Plan) -> Plan:
    """The big tiles a 2-D product with ``K = k`` and ``n`` columns (canonical plan
    ``canon``) may take at the current thread count (``data``: the qualifying sizes, maybe
    none); decided at the first call with at least ``tiles.BIG[0]`` rows."""
    threads = torch.get_num_threads()
    return plans().get(("big", k, n, lay, dtype, threads), lambda: _decide_big(k, n, lay, dtype, canon, threads))


# -- reductions ----------------------------------------------------------------------------


def torch_row_sum(x: torch.Tensor) -> torch.Tensor:
    """Row sums of ``(R, n)`` (``n <= SUM_CHUNK``) by torch's ``sum``, in calls of fewer
    than SUM_GRAIN elements (one serial loop each)."""
    r, n = x.shape
    out = x.new_empty((r,))
    step = max(1, (SUM_GRAIN - 1) // max(n, 1))
    if r <= step:  # one call (no slices to cut)
        return aten.sum.IntList_out(x, [1], out=out)
    for s in range(0, r, step):
        aten.sum.IntList_out(x[s : s + step], [1], out=out[s : s + step])
    return out


def _sum_rows(n: int, dtype: torch.dtype) -> torch.Tensor:
    step = max(1, (SUM_GRAIN - 1) // max(n, 1))
    return _values((min(max(step, 4), 64), n), _gen(("sum", n, dtype)), dtype)


def _sum_differs(x: torch.Tensor, alone: torch.Tensor) -> str | None:
    """Why a row summed among others differs from ``alone`` (None: it does not)."""
    rows = x.shape[0]
    for count in sorted({2, 3, rows}):
        for start in (0, rows - count):
            if not torch.equal(torch_row_sum(x[start : start + count].contiguous()), alone[start : start + count]):
                return f"a row summed among {count} rows differs from the row alone"
    return None


def _decide_sum(n: int, dtype: torch.dtype) -> Plan:
    """The canonical plan, at 1 thread: torch's sum where a row's bits do not depend on
    the call's other rows, else the fixed tree."""
    x = _sum_rows(n, dtype)
    alone = torch.cat([torch_row_sum(x[i : i + 1]) for i in range(x.shape[0])])
    why = _sum_differs(x, alone)
    if why is not None:
        warnings.warn(
            f"batch-invariant mode: torch's sum is not row-invariant here ({why}, "
            f"{n} columns); rows take the fixed-tree sum",
            FallbackWarning,
            stacklevel=5,
        )
        return Plan("fixed-tree sum", ARITHMETIC, f"torch's sum check failed: {why}")
    return Plan(
        "torch sum (serial vector loop per call)",
        VERIFIED,
        f"rows agree alone and in calls of 2, 3 and {x.shape[0]} rows",
        (False,),
    )


def _sum_at_threads(canon: Plan, n: int, dtype: torch.dtype, threads: int) -> Plan:
    x = _sum_rows(n, dtype)
    with torch_threads(1):
        alone = torch.cat([torch_row_sum(x[i : i + 1]) for i in range(x.shape[0])])
    why = _sum_differs(x, alone)
    if why is None:
        return Plan(canon.kernel, VERIFIED, f"at {threads} threads: the 1-thread bits", (False,))
    return Plan(
        canon.kernel + ", at 1 thread", VERIFIED, f"at {threads} threads {why}; the sums run at 1 thread", (True,)
    )


def sum_plan(n: int, dtype: torch.dtype) -> Plan:
    """The plan of a row sum of ``n <= SUM_CHUNK`` columns in ``dtype`` at the current
    thread count (``data[0]``: run it at 1 thread)."""
    return _threaded(
        ("sum", n, dtype), lambda: _decide_sum(n, dtype), lambda canon, t: _sum_at_threads(canon, n, dtype, t)
    )


def _at_one_thread(decide: Callable[[], Plan]) -> Plan:
    """``decide()`` at 1 thread. Only a decision changes the thread count: a call whose
    plan is known leaves it alone (two ``torch.set_num_threads`` calls cost ~2.5 us,
    measured on a Zen 2, paid before by every product, sum and pointwise op of the mode)."""
    with torch_threads(1):
        return decide()


def _threaded(key: tuple, decide: Callable[[], Plan], at: Callable[[Plan, int], Plan]) -> Plan:
    """The canonical plan of ``key`` (decided at 1 thread: every thread count then gives
    its bits) and, at another thread count, ``at(canon, threads)``: the same kernel, run
    at that count where its check holds there, else at 1 thread."""
    threads = torch.get_num_threads()
    try:
        canon = plans().get(key + (1,), lambda: _at_one_thread(decide))
        if threads == 1 or not canon.data:
            return canon
        return plans().get(key + (threads,), lambda: at(canon, threads))
    finally:
        _OPERANDS.clear()  # the random operands live only as long as one decision


# -- pointwise -----------------------------------------------------------------------------

_SPECIALS = (0.0, -0.0, 1.0, -1.0, 1e-30, -1e-30, 88.0, -88.0, 20.0, -20.0)


def _pw_values(
    name: str, dtype: torch.dtype, args: tuple, kwargs: tuple, domain: Callable[[torch.Tensor], torch.Tensor]
) -> torch.Tensor:
    g = _gen(("pointwise", name, dtype, args, kwargs))
    return domain(
        torch.cat(
            [
                torch.randn(4096 - len(_SPECIALS), generator=g, dtype=torch.float64) * 8,
                torch.tensor(_SPECIALS, dtype=torch.float64),
            ]
        )
    ).to(dtype)


def _pw_differs(
    out_op: Callable[..., torch.Tensor], x: torch.Tensor, ref: torch.Tensor, args: tuple, kw: dict
) -> str | None:
    """Why an element's bits depend on its place (None: they do not)."""
    for shift in (0, 1, 7, 16, 33):
        y = torch.cat([x[-shift:], x[:-shift]]) if shift else x
        got = pointwise(out_op, y, *args, **kw)
        if not torch.equal(torch.cat([got[shift:], got[:shift]]), ref):
            return f"an element's bits depend on its position (shifted by {shift})"
    if not torch.equal(pointwise(out_op, x[:PAD].clone(), *args, **kw), ref[:PAD]):
        return f"a {PAD}-element buffer differs from a 4096-element one"
    return None


def _decide_pointwise(
    name: str,
    out_op: Callable[..., torch.Tensor],
    dtype: torch.dtype,
    args: tuple,
    kwargs: tuple,
    domain: Callable[[torch.Tensor], torch.Tensor],
) -> Plan:
    x = _pw_values(name, dtype, args, kwargs, domain)
    kw = dict(kwargs)
    why = _pw_differs(out_op, x, pointwise(out_op, x, *args, **kw), args, kw)
    if why is not None:
        return Plan("refused", VERIFIED, f"{name} ({dtype}): {why}")
    return Plan(
        f"torch {name} on the vector loop", VERIFIED, "elements agree at 5 positions and 2 buffer lengths", (False,)
    )


def _pointwise_at_threads(
    canon: Plan,
    name: str,
    out_op: Callable[..., torch.Tensor],
    dtype: torch.dtype,
    args: tuple,
    kwargs: tuple,
    domain: Callable[[torch.Tensor], torch.Tensor],
    threads: int,
) -> Plan:
    x = _pw_values(name, dtype, args, kwargs, domain)
    kw = dict(kwargs)
    with torch_threads(1):
        ref = pointwise(out_op, x, *args, **kw)
    why = _pw_differs(out_op, x, ref, args, kw)
    if why is None:
        return Plan(canon.kernel, VERIFIED, f"at {threads} threads: the 1-thread bits", (False,))
    return Plan(canon.kernel + ", at 1 thread", VERIFIED, f"at {threads} threads {why}; it runs at 1 thread", (True,))


def pointwise_plan(
    name: str,
    out_op: Callable[..., torch.Tensor],
    dtype: torch.dtype,
    args: tuple = (),
    kwargs: dict[str, Any] | None = None,
    domain: Callable[[torch.Tensor], torch.Tensor] = lambda t: t,
) -> Plan:
    """The plan of elementwise op ``name`` (its ``.out`` overload ``out_op``) in ``dtype``
    with extra arguments ``args`` / ``kwargs`` at the current thread count; ``domain`` maps
    test values into the op's domain. A ``"refused"`` plan: the caller raises
    :class:`NotInvariantError` or takes a fallback; ``data[0]``: run it at 1 thread."""
    kw = tuple(sorted((kwargs or {}).items()))
    return _threaded(
        ("pointwise", name, dtype, args, kw),
        lambda: _decide_pointwise(name, out_op, dtype, args, kw, domain),
        lambda canon, t: _pointwise_at_threads(canon, name, out_op, dtype, args, kw, domain, t),
    )
