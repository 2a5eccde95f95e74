"""The Sampler: composes the pure ops of :mod:`detsample.ops` in the pipeline order of docs/sampling.md.

1. user logits processors  2. non-finite sanitising  3. penalties  4. grammar mask
5. logit_bias  6. greedy rows  7. temperature  8. top-k, top-p, min-p
9. seeded draw  10. logprobs

``Sampler()`` (deterministic, the default) gives every row bitwise the same token and
logprobs whatever the batch around it, the thread count or the run. It never sorts the
full vocabulary when a bounded ``topk`` provably gives the same bits (see
:mod:`detsample.ops.filters`); ``Sampler(filter_impl="sort")`` forces the full stable
sort, the reference semantics. ``Sampler(deterministic=False)`` is the fast mode: the
same pipeline without the tie-spill check of the bounded ``topk`` (a tie group that
straddles the candidate bound is cut wherever ``topk`` cut it), so it is statistically
correct but NOT guaranteed batch-invariant. Measured, it is no faster: the exact path
costs nothing noticeable (docs/performance.md), which is why it is the default.

``Sampler(backend=...)`` picks who computes the hot steps (sanitising, temperature,
filters and draw, uniforms, log_softmax): ``"torch"`` the ops of :mod:`detsample.ops`,
``"triton"`` their kernel twins of :mod:`detsample.kernels.sampler_ops` (same semantics;
on CPU tensors only under the Triton interpreter), ``"auto"`` Triton for CUDA tensors
when triton is installed, torch otherwise. docs/gpu.md says what each guarantees.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from types import ModuleType

import numpy as np
import torch

from detsample import kernels
from detsample.batch import SamplingBatch
from detsample.errors import InvalidSamplingParams
from detsample.grammar import batching as grammar_hooks
from detsample.grammar.masker import GrammarMasker
from detsample.ops import colcdf
from detsample.ops import draw as draw_ops
from detsample.ops import filters as filter_ops
from detsample.ops import hostcut
from detsample.ops import logprobs as lp_ops
from detsample.ops import radix
from detsample.ops.bias import apply_logit_bias_
from detsample.ops.host import host_tensor
from detsample.ops.sanitize import sanitize_rows_flagged
from detsample.ops.temperature import scale_logits
from detsample.processors.base import ProcessorRunner
from detsample.processors.loading import load_processors
from detsample import rules
from detsample.ops.mask import pack_bitmask
from detsample.rules import STATUS_NO_VALID_TOKEN
from detsample.processors.penalties import apply_penalties_and_constraints
from detsample.rng import RNG_NAME, row_uniforms
from detsample.sampling.rowplan import CANDIDATE_RATIO, RowPlan, Rows, plan_rows
from detsample.params.validation import check_logits, row_ids_tensor
from detsample.sampling.workspace import Workspace

FILTER_IMPLS = ("auto", "sort")
BACKENDS = ("auto", "torch", "triton")
#: first candidate count of a top-p row, and the growth factor while undecided
NUCLEUS_CANDIDATES = 64
NUCLEUS_GROWTH = 8
#: a plain grammar row is drawn over its allowed columns when they are at most this
#: fraction of the vocabulary (beyond it the gather costs about what the full pass does)
COLUMN_DRAW_MAX = 0.25
#: rows that need the full sort's threshold get it by radix select (ops.radix) from this
#: vocabulary size on (CPU, filter_impl "auto"); below it the sort is as fast
SELECT_MIN_V = 4096
#: ... and a top-p row stops growing its candidates once its nucleus is known to hold
#: more than V / SELECT_RATIO tokens
SELECT_RATIO = 64
DRAW_METHOD = "inverse-cdf/token-id-order/fixed-point"
NEG_INF = float("-inf")


@dataclass
class SampleOutput:
    """Result of :meth:`Sampler.sample` for a batch of B rows.

    token_ids: (B,) int64; -1 where a row had no admissible token (``status`` bit 4).
    logprobs: (B,) float32, the chosen token's logprob in the row's ``logprobs_mode``.
    top_logprobs: ``((B, n) float32, (B, n) int64)`` with n the largest ``logprobs`` of
    the batch, or None; row i's first ``params.logprobs`` entries are its answer, the
    rest are ``-inf`` / ``-1`` (every entry, for a row without an admissible token).
    seeds: (B,) int64 resolved seeds (for replay).
    status: (B,) int32 bit flags of :mod:`detsample.ops.sanitize`.
    """

    token_ids: torch.Tensor
    logprobs: torch.Tensor
    top_logprobs: tuple[torch.Tensor, torch.Tensor] | None
    seeds: torch.Tensor
    status: torch.Tensor


@dataclass(frozen=True)
class Prepared:
    """Steps 1-5 of one call (B rows, V tokens), all float32 unless noted."""

    raw: torch.Tensor      # (B, V) sanitised model logits (may alias the caller's)
    x: torch.Tensor        # (B, V) after steps 1-5 (may alias ``raw``)
    status: torch.Tensor   # (B,) int32 STATUS_* flags
    row_max: torch.Tensor  # (B, 1) max of ``x`` (-inf on a fully masked row)
    all_valid: bool        # host flag: every row finite, status all zero (the common case)
    kernels: ModuleType | None = None  # detsample.kernels.sampler_ops, or None: torch ops
    columns: dict | None = None  # {row: int64 numpy columns, ascending}: grammar rows of
    #                              ``x`` that are -inf outside them (step 4)
    column_values: dict | None = None  # {row: float32 numpy}: ``x`` at those columns, when
    #                                    nothing changed ``x`` after the mask (else None)


@dataclass(frozen=True)
class ColumnRows:
    """Plain sampling rows (no top-k / top-p) drawn over their allowed columns alone
    (:mod:`detsample.ops.colcdf`): ``rows`` (host list), ``index`` (n,) int64, ``every``
    (all rows of the batch, in order); ``rest``: the other plain rows (full pass)."""

    rows: list[int]
    index: torch.Tensor
    every: bool
    rest: Rows


@dataclass(frozen=True)
class Table:
    """One compact CDF table of step 8, for n rows decided on their candidates (or their
    allowed columns): ``index`` (n,) int64 rows of the batch (``every``: all of them, in
    order); ``ids`` (n, K) int64 kept ids ascending, then ``rules.PAD_ID``; ``csum`` (n, K)
    int64 running mass in that order (``csum[:, -1]`` the exact kept mass ``Q``); ``tau``
    (n,) float32 kept thresholds, or None (no value threshold: ``-inf``)."""

    index: torch.Tensor
    ids: torch.Tensor
    csum: torch.Tensor
    every: bool
    tau: torch.Tensor | None = None

    @staticmethod
    def of_prefix(idx: torch.Tensor, every: bool, vals: torch.Tensor, ids: torch.Tensor,
                  n: torch.Tensor, frac: int) -> "Table":
        """Rows whose kept set is the first ``n`` of their descending candidates
        ``vals`` / ``ids`` (``draw.compact_cdf``)."""
        sorted_ids, csum = draw_ops.compact_cdf(vals, ids, n, frac)
        return Table(idx, sorted_ids, csum, every, _prefix_tau(vals, n))

    @staticmethod
    def of_kept(idx: torch.Tensor, every: bool, cand: tuple[torch.Tensor, torch.Tensor],
                n: torch.Tensor, kept: torch.Tensor, q: torch.Tensor) -> "Table":
        """:meth:`of_prefix` from ``filters.candidate_cut``'s kept mask and masses
        (``draw.kept_cdf``); ``cand`` = (vals, ids)."""
        vals, ids = cand
        sorted_ids, csum = draw_ops.kept_cdf(ids, q, kept)
        return Table(idx, sorted_ids, csum, every, _prefix_tau(vals, n))

    @staticmethod
    def of_host(idx: torch.Tensor, every: bool, t: hostcut.CandidateTables,
                ok: np.ndarray | None = None) -> "Table":
        """The rows of host tables ``t`` (``ok``: those of its row positions, None: all),
        as tensors sharing the host arrays' memory."""
        if ok is not None:
            idx = idx[torch.from_numpy(ok)]
            t = hostcut.CandidateTables(*(a[ok] for a in (t.fits, t.n, t.tau, t.total,
                                                           t.sorted_ids, t.csum)))
        return Table(idx, torch.from_numpy(t.sorted_ids), torch.from_numpy(t.csum), every,
                     torch.from_numpy(t.tau))


def _prefix_tau(vals: torch.Tensor, n: torch.Tensor) -> torch.Tensor:
    """(n,) the last kept value of descending candidates ``vals`` with kept prefix ``n``."""
    return vals.gather(1, (n - 1).unsqueeze(1)).squeeze(1)


@dataclass(frozen=True)
class RouteResult:
    """What a route of step 8 decided: the CDF tables of its decided rows, and the rows
    it could not decide (``spilled``: they need the sort's threshold)."""

    tables: tuple[Table, ...] = ()
    spilled: tuple[torch.Tensor, ...] = ()


@dataclass(frozen=True)
class Cut:
    """Step 8, "thresholds and kept mass": what the filters keep in each row.

    tau: (B,) float32, kept = ``(z >= tau) & (exp(z) >= min_p)`` (``-inf`` on rows
    without a value threshold, and on non-sampling rows); total: (B,) int64, the exact
    fixed-point kept mass ``Q`` (0 on non-sampling rows). The CDF tables the draw reads:
    ``compact`` = :class:`Table` s for rows whose kept tokens are all among their
    candidates (or their allowed columns: plain grammar rows,
    :mod:`detsample.ops.colcdf`); ``blocks`` = (row
    index (n,), masses (n, V) int64, blocked running mass (n, nb), every) for rows drawn
    over the vocabulary; ``every``: the table holds every row of the batch, in order.
    """

    tau: torch.Tensor
    total: torch.Tensor
    compact: tuple[Table, ...] = ()
    blocks: tuple[torch.Tensor, torch.Tensor, torch.Tensor, bool] | None = None
    drawn: torch.Tensor | None = None  # (B,) tokens already drawn with the cut (a fused
    #                                    Triton kernel)

    @staticmethod
    def none(B: int, device: torch.device) -> "Cut":
        """No sampling row: nothing is cut, no mass (processed logprobs are one-hot)."""
        return Cut(torch.full((B,), NEG_INF, dtype=torch.float32, device=device),
                   torch.zeros((B,), dtype=torch.int64, device=device))


def _copy(t: torch.Tensor) -> torch.Tensor:
    """A copy of ``t`` (a host array copy on the CPU: one call, not an operator)."""
    if t.device.type == "cpu":
        return torch.from_numpy(t.numpy().copy())
    return t.clone()


def _zero_status(B: int, device: torch.device) -> torch.Tensor:
    """(B,) int32 all-zero status (a host array on the CPU: one call, not an operator)."""
    if device.type == "cpu":
        return torch.from_numpy(np.zeros(B, dtype=np.int32))
    return torch.zeros((B,), dtype=torch.int32, device=device)


class Sampler:
    """Batched sampler. ``deterministic=True`` (default) is bitwise batch-invariant.

    filter_impl: "auto" (bounded ``topk`` where it provably equals the full sort) or
    "sort" (always the full stable sort: the reference semantics).
    processors: batch-level logits processors run at pipeline step 1: instances, classes,
    class names or entry-point names (:mod:`detsample.processors.loading`).
    backend: "auto" (Triton kernels for CUDA tensors, torch ops otherwise), "torch" or
    "triton" (the kernels also on CPU tensors, under the Triton interpreter). The Triton
    backend is always exact (``deterministic`` does not change it).
    Logits may be float32, bfloat16 or float16: they are upcast once to float32, and
    every guarantee speaks of those float32 values (docs/sampling.md).
    A Sampler keeps scratch buffers between calls (:class:`~detsample.sampling.workspace.Workspace`);
    use one instance per thread.
    """

    rng_name = RNG_NAME
    draw_method = DRAW_METHOD

    def __init__(self, deterministic: bool = True, filter_impl: str = "auto",
                 processors: tuple = (), backend: str = "auto") -> None:
        if filter_impl not in FILTER_IMPLS:
            raise InvalidSamplingParams(
                f"filter_impl must be one of {FILTER_IMPLS}, got {filter_impl!r}")
        if not isinstance(backend, str) or backend not in BACKENDS:
            raise InvalidSamplingParams(f"backend must be one of {BACKENDS}, got {backend!r}")
        if backend == "triton" and not kernels.available():
            raise InvalidSamplingParams(
                "backend='triton' needs the triton package (pip install triton), "
                "which is not installed")
        self.backend = backend
        self.deterministic = bool(deterministic)
        self.filter_impl = filter_impl
        self.processors = load_processors(processors)
        self._ws = Workspace()
        self._runner = ProcessorRunner(self.processors)  # step 1
        self.grammar_masker = GrammarMasker()  # one reused bitmask buffer

    def prefetch_grammar(self, batch: SamplingBatch) -> int:
        """Start the next step's grammar bitmask fill in the background; call right after
        ``batch.advance`` so it overlaps the model's forward pass. The next
        :meth:`sample` waits for it; results are bitwise the same without it. Returns
        the number of rows being filled (docs/grammar.md)."""
        return grammar_hooks.prefetch_grammars(self.grammar_masker, batch)

    def validate_request(self, request) -> None:
        """Admission check against the registered processors' ``validate_params``;
        raises InvalidSamplingParams naming the request and the field. (The rules every
        batch applies are :func:`detsample.params.validation.check_request`.)"""
        self._runner.validate(request.rid, request.params)

    def _buf(self, name: str, like: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
        return self._ws.get(name, tuple(like.shape), dtype or like.dtype, like.device)

    def _lsm_out(self, x: torch.Tensor) -> torch.Tensor | None:
        """Where a shortcut writes the log_softmax of ``x``: a scratch buffer, or None (a
        fresh tensor) for a single row, whose allocation reuses memory the allocator has
        just freed and is still in cache (~10% faster for a 32000-token row after another
        kernel ran, the same in a tight loop); a (B, V) batch keeps the buffer (no page
        faults from a fresh multi-megabyte tensor)."""
        return None if x.shape[0] == 1 else self._buf("lsm", x)

    def _kernels(self, device: torch.device) -> ModuleType | None:
        """The Triton kernel set for tensors on ``device``, or None for the torch ops."""
        if self.backend == "torch" or (self.backend == "auto" and (
                device.type != "cuda" or not kernels.available())):
            return None
        from detsample.kernels import sampler_ops
        try:
            sampler_ops.check_device(device)
        except ValueError as e:
            raise InvalidSamplingParams(f"backend={self.backend!r}: {e}") from None
        return sampler_ops

    # -- steps 1-5 -------------------------------------------------------------------
    @staticmethod
    def _checked_logits(logits: torch.Tensor, batch: SamplingBatch) -> torch.Tensor:
        """The call's logits validated (once per call) and as float32 (a bfloat16 /
        float16 input upcast once, exactly)."""
        check_logits(logits, len(batch), batch.vocab_size, batch.device)
        return logits if logits.dtype == torch.float32 else logits.to(torch.float32)

    def _prepare(self, logits: torch.Tensor, batch: SamplingBatch) -> Prepared:
        """Steps 1-5 of float32 logits already checked (:meth:`_checked_logits`)."""
        k = self._kernels(logits.device)

        def sanitize(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, bool]:
            return (*k.sanitize_rows(t), False) if k else sanitize_rows_flagged(t)

        x = self._runner.run(logits, batch)  # step 1 (detsample.processors.base)
        raw, status, m, valid = sanitize(logits)  # step 2 ("raw" = sanitised model logits)
        if x is logits:
            x = raw
        else:
            x, st, m, fine = sanitize(x)
            status, valid = (status, valid) if fine and valid else (status | st, False)
        after_sanitize = x
        # Steps 3-5 never write into ``after_sanitize`` (it may alias the caller's logits):
        # a step that changes logits works on a copy, so ``x is after_sanitize`` means
        # "unchanged" and the row maxima of step 2 still hold.
        x = apply_penalties_and_constraints(  # step 3
            x, batch, lambda: self._buf("constrained", x))
        unchanged = x is after_sanitize
        mask_max = allowed = None
        if batch.has_grammars:  # step 4: grammar mask
            before = status
            x, status, mask_max, allowed = grammar_hooks.grammar_step(
                self.grammar_masker, batch, x, status, lambda: self._buf("mask", x),
                row_max=m if unchanged else None)
            valid = valid and status is before
        coo = batch.logit_bias_coo()  # step 5
        if coo is not None:
            x = apply_logit_bias_(x.clone() if x is after_sanitize else x, *coo)
        if x is not after_sanitize:  # a penalty or a bias can overflow a finite logit to +inf
            if unchanged and coo is None and mask_max is not None:
                m = mask_max  # only the mask changed x: its exact maxima (no +inf, no NaN)
            else:
                x, st, m, fine = sanitize(x)
                if not fine:
                    status, valid = status | st, False
        # (a bias adds finite values and re-sanitising keeps -inf: rows stay -inf outside
        # their columns; the mask's values at them hold when only the mask changed x)
        columns, values = allowed if allowed is not None else (None, None)
        only_mask = unchanged and coo is None and mask_max is not None
        return Prepared(raw=raw, x=x, status=status, row_max=m, all_valid=valid, kernels=k,
                        columns=columns or None,
                        column_values=values if only_mask and columns else None)

    def _build_plan(self, batch: SamplingBatch,
                    excluded: frozenset[int] = frozenset()) -> RowPlan:
        return plan_rows(batch.params, batch.vocab_size, self.filter_impl, batch.device,
                         batch.temperatures, batch.greedy,
                         (batch.top_ks, batch.top_ps, batch.min_ps), excluded)

    def _cached_plan(self, batch: SamplingBatch) -> RowPlan:
        """The batch's :class:`RowPlan`, built once per batch composition."""
        return batch.derived(("row_plan", self.filter_impl), lambda: self._build_plan(batch))

    def _plan(self, batch: SamplingBatch, prep: Prepared) -> RowPlan:
        """The batch's cached :class:`RowPlan`; rows without an admissible token this step
        (rare: a fully masked row) get a plan of their own that leaves them out."""
        plan = self._cached_plan(batch)
        if prep.all_valid:
            return plan
        dead = (prep.status & STATUS_NO_VALID_TOKEN) != 0
        if not bool(dead.any()):
            return plan
        return self._build_plan(batch, frozenset(dead.nonzero().flatten().tolist()))

    def _plain_greedy(self, x: torch.Tensor, batch: SamplingBatch, plan: RowPlan
                      ) -> SampleOutput | None:
        """The all-greedy shortcut: every row greedy with "raw" logprobs, and nothing of
        steps 1-5 in the batch, so the logits reach step 6 unchanged. The argmax and the
        chosen token's log_softmax come first, on the unsanitised logits; the logprob of
        a row's argmax is finite exactly when the row is valid (a NaN anywhere is the
        argmax and gives NaN, a +inf gives ``inf - inf``, a fully masked row
        ``-inf - -inf``; a finite maximum gives ``-log(sum)`` with ``1 <= sum <= V``), so
        when they are all finite the sanitising pass has nothing to do and is skipped.
        Returns None (the general path) otherwise. Same bits as the general path
        (tests/test_sampler.py). ``plan``: the batch's :meth:`_shortcut_plan`, every row
        greedy."""
        tokens = draw_ops.greedy_argmax(x)
        logprobs = lp_ops.gather_rows(lp_ops.log_softmax(x, out=self._lsm_out(x)), tokens,
                                      in_range=True)
        if not math.isfinite(float(logprobs.sum() if plan.size > 1 else logprobs)):
            # (each is in [-log V, 0] when finite)
            return None
        return self._shortcut_output(x, lambda: x.gather(1, tokens.unsqueeze(1)), tokens,
                                     logprobs, batch, plan=plan, greedy_tok=tokens)

    def _shortcut_plan(self, batch: SamplingBatch) -> RowPlan | None:
        """The batch's plan when a homogeneous-batch shortcut may apply: nothing of steps
        1-5 in the batch (so the logits reach step 6 unchanged), "raw" logprobs only and
        the torch ops; None otherwise."""
        plan = self._cached_plan(batch)
        if (plan.untouched and len(plan.modes) == 1 and "raw" in plan.modes
                and not self.processors and self._kernels(batch.device) is None):
            return plan
        return None

    def _plain_top_k(self, x: torch.Tensor, batch: SamplingBatch, plan: RowPlan,
                     positions: torch.Tensor) -> SampleOutput | None:
        """The small top-k shortcut of a CPU batch: every row samples with a small top-k
        (any top-p / min-p), "raw" logprobs, nothing of steps 1-5. One ``topk`` of the
        logits comes first; its largest value is the row maximum (``topk`` ranks NaN
        above everything, so a row with a NaN, a +inf or nothing but -inf shows a
        non-finite top value), so when they are all finite the sanitising pass has
        nothing to do and is skipped, and the candidates are scaled by that maximum
        (the value ``amax`` gives; a zero maximum may differ in sign, which changes only
        the sign of zero scaled values: no mass, threshold test or output). The host
        tables of :mod:`detsample.ops.hostcut` decide every row, the CDF search draws
        it. Returns None
        (the general path) for an invalid row or a tie group spilling past the
        candidates. Same bits as the general path (tests/test_sampler.py). ``plan``: the
        batch's :meth:`_shortcut_plan`."""
        if not plan.route.candidates.every or batch.device.type != "cpu":
            return None
        k_max, cf = plan.route.k_max, plan.route.candidate_filters
        vals, ids = torch.topk(x, min(k_max + 1, x.shape[1]), dim=-1)
        v = vals.numpy()
        top = v[:, :1]
        if not np.isfinite(top).all():
            return None
        with np.errstate(over="ignore"):  # x - max may overflow to -inf, as in torch
            # scale_logits on the host: the same IEEE float32 subtraction, then division
            vals = torch.from_numpy((v - top) / plan.temperatures.numpy())
        frac = rules.frac_bits(x.shape[1])
        t = hostcut.candidate_tables(vals, ids, cf.k_index, cf.cut_k, cf.top_p, cf.min_p,
                                     frac=frac, k_max=k_max)
        if self.deterministic and not t.fits.all():
            return None
        tokens = draw_ops.draw_by_cdf(torch.from_numpy(t.sorted_ids), torch.from_numpy(t.csum),
                                      row_uniforms(batch.seeds, positions))
        logprobs = lp_ops.gather_rows(lp_ops.log_softmax(x, out=self._lsm_out(x)), tokens,
                                      in_range=True)
        return self._shortcut_output(x, lambda: x.amax(-1, keepdim=True), tokens, logprobs,
                                     batch, plan=plan)

    def _plain_full(self, x: torch.Tensor, batch: SamplingBatch, plan: RowPlan,
                    positions: torch.Tensor) -> SampleOutput | None:
        """The temperature-only shortcut: every row samples without top-k / top-p (a
        temperature, maybe a min-p), "raw" logprobs, nothing of steps 1-5, CPU or GPU
        torch ops. The general path's own steps, without its bookkeeping: the row maxima
        (when they are all finite the sanitising pass has nothing to do: a NaN, +inf or
        fully masked row sends the batch to the general path), ``z`` over the vocabulary,
        the blocked masses and the draw, the one ``log_softmax``. Returns None (the
        general path) for an invalid row or another route. Same bits as the general path
        (tests/test_sampler.py). ``plan``: the batch's :meth:`_shortcut_plan`."""
        if not plan.route.plain.every:
            return None
        m = torch.amax(x, dim=-1, keepdim=True)  # sanitize_rows_flagged's maxima
        if not (np.isfinite(m.numpy()).all() if x.device.type == "cpu" else
                bool(torch.isfinite(m).all())):
            return None
        z = scale_logits(x, m, plan.temperatures, out=self._buf("z", x))
        tau = torch.full((plan.size,), NEG_INF, dtype=torch.float32, device=x.device)
        q, bsum = draw_ops.block_cdf(z, tau, batch.min_ps, rules.frac_bits(x.shape[1]),
                                     out=self._buf("w", z), q_out=self._buf("q", z, torch.int64),
                                     cut_tau=False, cut_min_p=None if plan.any_min_p else False)
        tokens = draw_ops.draw_by_blocks(q, bsum, row_uniforms(batch.seeds, positions))
        logprobs = lp_ops.gather_rows(lp_ops.log_softmax(x, out=self._lsm_out(x)), tokens,
                                      in_range=True)
        return self._shortcut_output(x, lambda: m, tokens, logprobs, batch, plan=plan)

    def _shortcut_output(self, x: torch.Tensor, row_max, tokens: torch.Tensor,
                         logprobs: torch.Tensor, batch: SamplingBatch, *, plan: RowPlan,
                         greedy_tok: torch.Tensor | None = None) -> SampleOutput:
        """A shortcut's :class:`SampleOutput`: every row valid (status all zero), the top
        logprobs ("raw") of the float32 logits ``x`` when a row asks for them
        (``row_max``: a callable giving (B, 1) maxima, called only then)."""
        status = _zero_status(plan.size, x.device)
        top = None
        if plan.max_top:
            prep = Prepared(raw=x, x=x, status=status, row_max=row_max(), all_valid=True)
            top = self._top_logprobs(prep, None, None, batch, plan, greedy_tok)
        return SampleOutput(token_ids=tokens, logprobs=logprobs, top_logprobs=top,
                            seeds=_copy(batch.seeds), status=status)

    # -- step 6 ----------------------------------------------------------------------
    def _greedy_tokens(self, prep: Prepared, plan: RowPlan) -> torch.Tensor | None:
        """(B,) argmax of x on greedy rows (on every row when "processed" logprobs need
        it), -1 elsewhere; None when no row needs one."""
        rows = plan.argmax
        if rows.every:
            return draw_ops.greedy_argmax(prep.x)
        if not rows:
            return None
        out = torch.full((plan.size,), -1, dtype=torch.int64, device=prep.x.device)
        out[rows.index] = draw_ops.greedy_argmax(rows.take(prep.x))
        return out

    # -- step 7 ----------------------------------------------------------------------
    @staticmethod
    def _shift(prep: Prepared) -> torch.Tensor:
        """(B, 1) the maxima subtracted by step 7 (0 on a fully masked row)."""
        m = prep.row_max
        if not prep.all_valid:
            m = torch.where(torch.isneginf(m), torch.zeros_like(m), m)  # all -inf rows
        return m

    def _scaled(self, prep: Prepared, plan: RowPlan) -> torch.Tensor:
        """z = (x - max) / T_eff for every row (T_eff = 1 on greedy rows)."""
        scale = prep.kernels.scale_logits if prep.kernels else scale_logits
        return scale(prep.x, self._shift(prep), plan.temperatures, out=self._buf("z", prep.x))

    @staticmethod
    def _needs_full_z(plan: RowPlan, prep: Prepared, by_columns: ColumnRows | None = None
                      ) -> bool:
        """Whether some consumer needs step 7's z over the whole vocabulary: every one
        but the bounded top-k candidates, which scale only their candidates
        (:func:`~detsample.ops.filters.logit_candidates`), and the plain rows drawn over
        their allowed columns (``by_columns``)."""
        if not plan.needs_scaled:
            return False
        rt = plan.route
        plain = rt.plain if by_columns is None else by_columns.rest
        return (prep.kernels is not None or "scaled" in plan.modes or plan.any_processed
                or bool(rt.nucleus or rt.top_k_only or rt.sort or plain))

    @staticmethod
    def _by_columns(plan: RowPlan, prep: Prepared) -> ColumnRows | None:
        """The plain sampling rows of grammar rows whose logits are ``-inf`` outside at
        most ``COLUMN_DRAW_MAX`` of the vocabulary (step 4's ``columns``): drawn over
        those columns alone, with the same bits (:mod:`detsample.ops.colcdf`). None
        when there is none (or the Triton kernels run step 8)."""
        cols, plain = prep.columns, plan.route.plain
        if not cols or not plain or prep.kernels is not None:
            return None
        most = COLUMN_DRAW_MAX * prep.x.shape[1]
        rows, rest = [], []
        for r in plain.rows:
            c = cols.get(r)
            (rows if c is not None and c.size <= most else rest).append(r)
        if not rows:
            return None
        B, dev = plan.size, prep.x.device
        return ColumnRows(rows, host_tensor(rows, torch.int64, dev), len(rows) == B,
                          Rows.of(rest, B, dev))

    # -- step 8 ----------------------------------------------------------------------
    def _cut(self, z: torch.Tensor | None, batch: SamplingBatch, plan: RowPlan,
             prep: Prepared, *, u: torch.Tensor | None = None,
             by_columns: ColumnRows | None = None) -> Cut:
        """Thresholds and exact kept mass of the sampling rows (a pure step: no draw).
        Each route of the plan gives a row the bits of the full sort; rows that a bounded
        route cannot decide join the sort. With Triton kernels ``k`` the same step runs
        fused with the draw when the uniforms ``u`` are given (``Cut.drawn``). ``z``
        None (only bounded top-k rows and ``by_columns``): candidates come from
        ``prep``'s logits, and z is computed only if a row spills into the sort. The
        plain rows of ``by_columns`` get a compact table over their allowed columns."""
        k = prep.kernels
        B, V = prep.x.shape if z is None else z.shape
        device = batch.device
        if not plan.sampling:
            return Cut.none(B, device)
        frac = rules.frac_bits(V)
        if k is not None:
            tau, total, drawn = k.thresholds_and_draw(
                z, plan.sampling.index, batch.top_ks, batch.top_ps, batch.min_ps, u, frac,
                sort_only=self.filter_impl == "sort")
            return Cut(tau, total, drawn=drawn if u is not None else None)
        rt = plan.route
        if rt.candidates.every and device.type == "cpu":
            cut = self._every_small_top_k(z, plan, prep, frac)
            if cut is not None:
                return cut
        tau = torch.full((B,), NEG_INF, dtype=torch.float32, device=device)
        total = torch.zeros((B,), dtype=torch.int64, device=device)
        results: list[RouteResult] = []
        if rt.candidates:
            results.append(self._small_top_k(z, rt.candidates, plan, prep, frac))
        if any(r.spilled for r in results) and z is None:  # a tie group spilled past the
            z = self._scaled(prep, plan)                     # candidates
        select = self.filter_impl == "auto" and V >= SELECT_MIN_V and device.type == "cpu"
        if rt.nucleus:
            results.append(self._nucleus(z, rt.nucleus, frac, select))
        if by_columns is not None:
            results.append(self._column_cut(by_columns, batch, plan, prep, frac))
        compact = [t for r in results for t in r.tables]
        for t in compact:
            if t.every:
                total.copy_(t.csum[:, -1])
                if t.tau is not None:
                    tau.copy_(t.tau)
            else:
                total[t.index] = t.csum[:, -1]
                if t.tau is not None:
                    tau[t.index] = t.tau
        sort_idx = ([rt.sort.index] if rt.sort else []) + [i for r in results for i in r.spilled]
        full_idx = list(sort_idx)
        if sort_idx:
            si = torch.cat(sort_idx) if len(sort_idx) > 1 else sort_idx[0]
            by = radix.thresholds_by_select if select else filter_ops.thresholds_by_sort
            tau[si] = by(z.index_select(0, si), batch.top_ks[si], batch.top_ps[si],
                         batch.min_ps[si], frac)
        if rt.top_k_only:
            ti = rt.top_k_only.index
            tau[ti] = filter_ops.topk_threshold(rt.top_k_only.take(z), batch.top_ks[ti])
            full_idx.append(ti)
        plain = rt.plain if by_columns is None else by_columns.rest
        if plain:
            full_idx.append(plain.index)
        blocks = None
        if full_idx:
            fi = torch.cat(full_idx) if len(full_idx) > 1 else full_idx[0]
            every = len(full_idx) == 1 and fi.numel() == B and (
                plain.every or rt.top_k_only.every or rt.sort.every)
            zf, tf, mf = (z, tau, batch.min_ps) if every else (
                z.index_select(0, fi), tau[fi], batch.min_ps[fi])
            q, bsum = draw_ops.block_cdf(zf, tf, mf, frac, out=self._buf("w", zf),
                                         q_out=self._buf("q", zf, torch.int64),
                                         cut_tau=len(full_idx) > bool(plain),
                                         cut_min_p=None if plan.any_min_p else False)
            if every:
                total = bsum[:, -1]
            else:
                total[fi] = bsum[:, -1]
            blocks = (fi, q, bsum, every)
        return Cut(tau, total, tuple(compact), blocks)

    def _column_cut(self, cr: ColumnRows, batch: SamplingBatch, plan: RowPlan,
                    prep: Prepared, frac: int) -> RouteResult:
        """Plain rows drawn over their allowed columns: their compact CDF table (their
        threshold stays ``-inf``, as on the full pass)."""
        known = prep.column_values
        vals, ids = colcdf.gather_columns(prep.x, cr.rows, [prep.columns[r] for r in cr.rows],
                                          None if known is None else
                                          [known.get(r) for r in cr.rows])
        ri = cr.index
        shift, temps = self._shift(prep), plan.temperatures
        if not cr.every:
            shift, temps = shift.index_select(0, ri), temps.index_select(0, ri)
        ids, csum = colcdf.column_cdf(vals, ids, shift, temps,
                                      batch.min_ps if cr.every else batch.min_ps[ri], frac,
                                      cut_min_p=None if plan.any_min_p else False)
        return RouteResult((Table(ri, ids, csum, cr.every),))

    def _small_top_k(self, z: torch.Tensor | None, rows: Rows, plan: RowPlan,
                     prep: Prepared, frac: int) -> RouteResult:
        """Rows with a small top-k: one bounded ``topk`` (of z, or of the logits when
        ``z`` is None); the rows whose tie group at the boundary spills past ``k_max``
        are left to the sort."""
        ci = rows.index
        k_max, cf = plan.route.k_max, plan.route.candidate_filters
        vals, ids = self._candidate_topk(z, prep, plan, rows)
        if vals.device.type == "cpu":  # a few dozen values a row: host arithmetic
            t = hostcut.candidate_tables(vals, ids, cf.k_index, cf.cut_k, cf.top_p, cf.min_p,
                                         frac=frac, k_max=k_max)
            if not self.deterministic or bool(t.fits.all()):  # fast mode: never spills
                return RouteResult((Table.of_host(ci, rows.every, t),))
            ok = np.flatnonzero(t.fits)
            return RouteResult((Table.of_host(ci, False, t, ok),) if ok.size else (),
                               (ci[torch.from_numpy(~t.fits)],))
        V = (prep.x if z is None else z).shape[1]
        vals, ids, fits = filter_ops.cut_candidates(vals, ids, cf.k_index, k_max, V)
        n, kept, q = filter_ops.candidate_cut(vals, cf.k_index, cf.cut_k, cf.top_p, cf.min_p,
                                              frac)
        if not self.deterministic or bool(fits.all()):  # fast mode: never spills
            return RouteResult((Table.of_kept(ci, rows.every, (vals, ids), n, kept, q),))
        ok = fits.nonzero().flatten()
        tables = (Table.of_kept(ci[ok], False, (vals[ok], ids[ok]), n[ok], kept[ok], q[ok]),
                  ) if ok.numel() else ()
        return RouteResult(tables, (ci[~fits],))

    def _candidate_topk(self, z: torch.Tensor | None, prep: Prepared, plan: RowPlan,
                        rows: Rows) -> tuple[torch.Tensor, torch.Tensor]:
        """The ``min(k_max + 1, V)`` largest scaled logits of ``rows``, descending, and
        their ids: a ``topk`` of ``z``, or (``z`` None) of the logits with only the
        candidates scaled (:func:`~detsample.ops.filters.logit_topk`)."""
        k_max = plan.route.k_max
        if z is None:
            return filter_ops.logit_topk(rows.take(prep.x), rows.take(self._shift(prep)),
                                         rows.take(plan.temperatures), k_max)
        return torch.topk(rows.take(z), min(k_max + 1, z.shape[1]), dim=-1)

    def _every_small_top_k(self, z, plan: RowPlan, prep: Prepared, frac: int) -> Cut | None:
        """Step 8 when every row of a CPU batch has a small top-k (a homogeneous batch):
        the host tables become the Cut as they are (no per-row scatter); None when a row
        spills past the candidates (the general path then sorts it)."""
        rows, k_max, cf = plan.route.candidates, plan.route.k_max, plan.route.candidate_filters
        vals, ids = self._candidate_topk(z, prep, plan, rows)
        t = hostcut.candidate_tables(vals, ids, cf.k_index, cf.cut_k, cf.top_p, cf.min_p,
                                     frac=frac, k_max=k_max)
        if self.deterministic and not bool(t.fits.all()):
            return None
        return Cut(torch.from_numpy(t.tau), torch.from_numpy(t.total),
                   (Table.of_host(rows.index, True, t),))

    def _nucleus(self, z: torch.Tensor, rows: Rows, frac: int,
                 select: bool = False) -> RouteResult:
        """Top-p rows without a small top-k: the exact mass of the top-k survivors, then
        a bounded ``topk`` that grows until the nucleus ends inside it
        (:func:`~detsample.ops.filters.nucleus_prefix`); the rows whose nucleus outgrows
        ``V / CANDIDATE_RATIO`` candidates are left to the sort's threshold.
        ``select``: that threshold comes from the radix select, so rows stop growing as
        soon as a nucleus is known to hold more than ``V / SELECT_RATIO`` tokens (a
        larger ``topk`` would cost more than the select)."""
        V = z.shape[1]
        idx, every = rows.index, rows.every
        zn = rows.take(z)
        top_ks, top_ps, min_ps = rows.filters
        thr = filter_ops.topk_threshold(zn, top_ks) if rows.any_top_k else None
        mass = filter_ops.survivor_mass(zn, thr, frac, out=self._buf("w", zn),
                                        q_out=self._buf("q", zn, torch.int64))
        if thr is None:
            thr = torch.full_like(min_ps, NEG_INF)
        cap = max(V // CANDIDATE_RATIO, 1)
        K = min(NUCLEUS_CANDIDATES, V)
        tables: list[Table] = []
        while True:
            vals, ids = torch.topk(zn, K, dim=-1, largest=True, sorted=True)
            n, decided = filter_ops.nucleus_prefix(vals, thr, mass, top_ps,
                                                   min_ps if rows.active[2] else None, frac)
            if K == V or bool(decided.all()):
                tables.append(Table.of_prefix(idx, every, vals, ids, n, frac))
                return RouteResult(tuple(tables))
            every = False
            dec = decided.nonzero().flatten()
            if dec.numel():
                tables.append(Table.of_prefix(idx[dec], False, vals[dec], ids[dec], n[dec],
                                              frac))
            und = (~decided).nonzero().flatten()
            plain = torch.isneginf(thr[und]) & (min_ps[und] == 0)  # the bound holds
            need = filter_ops.mass_needed_bound(vals[und], mass[und], top_ps[und], frac)
            bound = int(torch.where(plain, need, torch.zeros_like(need)).max())
            K = min(max(K * NUCLEUS_GROWTH, bound + K + 1), V)
            if K > cap or (select and bound > V // SELECT_RATIO):
                return RouteResult(tuple(tables), (idx[und],))
            idx, zn, thr, mass = idx[und], zn[und], thr[und], mass[und]
            top_ps, min_ps = top_ps[und], min_ps[und]

    # -- step 9 ----------------------------------------------------------------------
    @staticmethod
    def _draw(cut: Cut, u: torch.Tensor) -> torch.Tensor:
        """(B,) int64 drawn tokens of the rows in ``cut``'s CDF tables, -1 elsewhere.
        u: (B,) float64 per-row uniforms."""
        if cut.drawn is not None:
            return cut.drawn
        tables = [(draw_ops.draw_by_cdf, t.ids, t.csum, t.index, t.every)
                  for t in cut.compact]
        if cut.blocks is not None:
            idx, q, bsum, every = cut.blocks
            tables.append((draw_ops.draw_by_blocks, q, bsum, idx, every))
        if len(tables) == 1 and tables[0][4]:  # one table for every row, in order
            fn, a, b, _, _ = tables[0]
            return fn(a, b, u)
        tokens = torch.full(u.shape, -1, dtype=torch.int64, device=u.device)
        for fn, a, b, idx, _ in tables:
            tokens[idx] = fn(a, b, u[idx])
        return tokens

    # -- step 10 ---------------------------------------------------------------------
    def _processed(self, cut: Cut, batch: SamplingBatch, rows: Rows, z: torch.Tensor,
                   ids: torch.Tensor, greedy_tok: torch.Tensor, *,
                   k: ModuleType | None = None) -> torch.Tensor:
        """The "processed_fixed" logprob of scaled logits ``z`` with token ids ``ids`` of
        ``rows``: either (n,) picked tokens, or (n, V) full rows with ``ids`` (1, V).
        Kept entries get the renormalised logprob of the draw, others -inf; a greedy row
        is one-hot on its greedy token. (The min-p test uses the backend's own exp, the
        one its draw used.)"""
        col = (lambda t: t.unsqueeze(1)) if z.dim() == 2 else (lambda t: t)  # noqa: E731
        keep = self._kept(cut, batch, rows, z, col, k)
        lp = lp_ops.log_softmax(z, kept_mass=col(rows.take(cut.total).clamp(min=1)),
                                frac=rules.frac_bits(batch.vocab_size))
        return self._one_hot_greedy(lp.masked_fill(~keep, NEG_INF), batch, rows, ids,
                                    greedy_tok, col)

    @staticmethod
    def _kept(cut: Cut, batch: SamplingBatch, rows: Rows, z: torch.Tensor, col,
              k: ModuleType | None) -> torch.Tensor:
        """bool, z's shape: the kept set of step 8 (threshold, then min-p; the min-p test
        with the backend's own exp, the one its draw used)."""
        exp = k.exp if k else torch.exp
        return (z >= col(rows.take(cut.tau))) & rules.min_p_keeps(exp(z),
                                                                  col(rows.take(batch.min_ps)))

    @staticmethod
    def _one_hot_greedy(lp: torch.Tensor, batch: SamplingBatch, rows: Rows, ids: torch.Tensor,
                        greedy_tok: torch.Tensor, col) -> torch.Tensor:
        """``lp`` with greedy rows replaced by their one-hot distribution (0 on the greedy
        token, -inf elsewhere)."""
        onehot = torch.where(ids == col(rows.take(greedy_tok)), torch.zeros_like(lp),
                             torch.full_like(lp, NEG_INF))
        return torch.where(col(rows.take(batch.greedy)), onehot, lp)

    def _processed_rows(self, prep: Prepared, cut: Cut, batch: SamplingBatch, plan: RowPlan,
                        rows: Rows, z: torch.Tensor, *, greedy_tok: torch.Tensor) -> torch.Tensor:
        """(n, V) vLLM's "processed" logprobs of ``rows``: ``log_softmax`` of step 5's
        logits divided by the temperature, -inf outside step 8's kept set
        (:func:`~detsample.ops.logprobs.processed_log_softmax`); greedy rows one-hot."""
        col = lambda t: t.unsqueeze(1)  # noqa: E731
        zr = rows.take(z)
        keep = self._kept(cut, batch, rows, zr, col, prep.kernels)
        lp = lp_ops.processed_log_softmax(rows.take(prep.x), rows.take(plan.temperatures), keep)
        full = torch.arange(batch.vocab_size, device=z.device).unsqueeze(0)
        return self._one_hot_greedy(lp, batch, rows, full, greedy_tok, col)

    def _token_logprobs(self, prep: Prepared, z: torch.Tensor | None, cut: Cut,
                        batch: SamplingBatch, plan: RowPlan, tokens: torch.Tensor, *,
                        greedy_tok: torch.Tensor, some_none: bool) -> torch.Tensor:
        """(B,) float32 logprob of ``tokens`` (-1 = none: -inf) in each row's mode;
        ``some_none``: whether any token may be -1."""
        out = torch.full((plan.size,), NEG_INF, dtype=torch.float32, device=tokens.device) \
            if len(plan.modes) > 1 else None
        safe = tokens.clamp(min=0) if some_none else tokens
        for mode, rows in plan.modes.items():
            picked = rows.take(safe)
            if mode == "processed":
                vals = lp_ops.gather_rows(self._processed_rows(prep, cut, batch, plan, rows, z,
                                                               greedy_tok=greedy_tok), picked)
            elif mode == "processed_fixed":
                ztok = lp_ops.gather_rows(rows.take(z), picked)
                vals = self._processed(cut, batch, rows, ztok, picked, greedy_tok,
                                       k=prep.kernels)
            else:
                sub = rows.take(prep.raw if mode == "raw" else z)
                log_softmax = prep.kernels.log_softmax_rows if prep.kernels else \
                    lp_ops.log_softmax
                lsm = log_softmax(sub, out=self._buf("lsm", sub))
                vals = lp_ops.gather_rows(lsm, picked)
            if out is None:
                out = vals
            else:
                out[rows.index] = vals
        return out.masked_fill(tokens < 0, NEG_INF) if some_none else out

    def _top_logprobs(self, prep: Prepared, z: torch.Tensor | None, cut: Cut,
                      batch: SamplingBatch, plan: RowPlan, greedy_tok: torch.Tensor
                      ) -> tuple[torch.Tensor, torch.Tensor] | None:
        n = plan.max_top
        if n == 0:
            return None
        B, dev = plan.size, batch.device
        vals = torch.full((B, n), NEG_INF, dtype=torch.float32, device=dev)
        ids = torch.full((B, n), -1, dtype=torch.int64, device=dev)
        for mode, rows in plan.top.items():
            if mode == "processed":
                lp = self._processed_rows(prep, cut, batch, plan, rows, z, greedy_tok=greedy_tok)
            elif mode == "processed_fixed":
                full = torch.arange(batch.vocab_size, device=dev).unsqueeze(0)
                lp = self._processed(cut, batch, rows, rows.take(z), full, greedy_tok,
                                     k=prep.kernels)
            else:
                log_softmax = prep.kernels.log_softmax_rows if prep.kernels else \
                    lp_ops.log_softmax
                lp = log_softmax(rows.take(prep.raw if mode == "raw" else z))
            v, i = lp_ops.topn(lp, n)
            vals[rows.index] = v
            ids[rows.index] = i
        beyond = torch.arange(n, device=dev).unsqueeze(0) >= plan.want_top.unsqueeze(1)
        return vals.masked_fill(beyond, NEG_INF), ids.masked_fill(beyond, -1)

    # -- public API ------------------------------------------------------------------
    def sample(self, logits: torch.Tensor, batch: SamplingBatch,
               positions: torch.Tensor) -> SampleOutput:
        """Sample one token per row.

        logits: (B, V) float32, bfloat16 or float16 on the batch's device (never
        modified; a half-precision input is upcast once to float32).
        positions: (B,) int64, the position of each row's last input token; the row's
        random stream is keyed by (seed, position) only.
        Deterministic mode: bitwise batch-invariant and run-to-run reproducible.
        """
        positions = row_ids_tensor("positions", positions, len(batch), batch.device)
        logits = self._checked_logits(logits, batch)
        if len(batch) and not logits.requires_grad:
            # no input requires grad, so no operation records a graph: the shortcuts run
            # without entering a no_grad context
            plan = self._shortcut_plan(batch)
            if plan is not None:
                out = (self._plain_greedy(logits, batch, plan) if plan.greedy.every else
                       self._plain_top_k(logits, batch, plan, positions)
                       if plan.route.candidates.every else
                       self._plain_full(logits, batch, plan, positions))
                if out is not None:
                    return out
        return self._sample(logits, batch, positions)

    @torch.no_grad()  # not differentiable; logits may come from a training model
    def _sample(self, logits: torch.Tensor, batch: SamplingBatch,
                positions: torch.Tensor) -> SampleOutput:
        """:meth:`sample` after its shortcuts (positions validated)."""
        B = len(batch)
        prep = self._prepare(logits, batch)
        if B == 0:
            return SampleOutput(torch.empty((0,), dtype=torch.int64, device=batch.device),
                                torch.empty((0,), dtype=torch.float32, device=batch.device),
                                None, batch.seeds.clone(), prep.status)
        plan = self._plan(batch, prep)
        greedy_tok = self._greedy_tokens(prep, plan)
        by_columns = self._by_columns(plan, prep)
        z = self._scaled(prep, plan) if self._needs_full_z(plan, prep, by_columns) else None
        u = None
        if plan.sampling:
            u = (prep.kernels.row_uniforms if prep.kernels else row_uniforms)(batch.seeds,
                                                                              positions)
        cut = self._cut(z, batch, plan, prep, u=u, by_columns=by_columns) \
            if plan.needs_scaled else Cut.none(B, batch.device)
        if plan.greedy.every:
            tokens = greedy_tok
        elif plan.sampling:
            drawn = self._draw(cut, u)
            tokens = torch.where(batch.greedy, greedy_tok, drawn) if plan.greedy else drawn
        else:  # greedy rows and rows without an admissible token only
            none = torch.full((B,), -1, dtype=torch.int64, device=batch.device)
            tokens = none if greedy_tok is None else torch.where(batch.greedy, greedy_tok, none)
        if plan.excluded:
            tokens = tokens.masked_fill((prep.status & STATUS_NO_VALID_TOKEN) != 0, -1)
        logprobs = self._token_logprobs(prep, z, cut, batch, plan, tokens,
                                        greedy_tok=greedy_tok, some_none=bool(plan.excluded))
        top = self._top_logprobs(prep, z, cut, batch, plan, greedy_tok)
        return SampleOutput(token_ids=tokens, logprobs=logprobs, top_logprobs=top,
                            seeds=batch.seeds.clone(), status=prep.status)

    @torch.no_grad()  # not differentiable; logits may come from a training model
    def compute_logprobs(self, logits: torch.Tensor, batch: SamplingBatch,
                         token_ids: torch.Tensor) -> torch.Tensor:
        """The rescoring (prefill) path: logprob of ``token_ids`` per row, in each row's
        ``logprobs_mode``, through the same steps 1-8 as :meth:`sample`.

        logits: (B, V) float32, bfloat16 or float16 (upcast once to float32);
        token_ids: (B,) int64, -1 meaning "no token" (what :meth:`sample` reports for a
        row without an admissible token; its logprob is -inf). Returns (B,) float32,
        bitwise equal to the ``logprobs`` that :meth:`sample` reported for the same inputs.
        """
        token_ids = row_ids_tensor("token_ids", token_ids, len(batch), batch.device,
                                   lowest=-1, upper=batch.vocab_size)
        prep = self._prepare(self._checked_logits(logits, batch), batch)
        B = len(batch)
        if B == 0:
            return torch.empty((0,), dtype=torch.float32, device=batch.device)
        plan = self._plan(batch, prep)
        greedy_tok = self._greedy_tokens(prep, plan)
        by_columns = self._by_columns(plan, prep)
        z = self._scaled(prep, plan) if self._needs_full_z(plan, prep, by_columns) else None
        processed = plan.any_processed  # a processed mode: step 8's kept sets
        cut = self._cut(z, batch, plan, prep, by_columns=by_columns) \
            if processed else Cut.none(B, batch.device)
        if plan.excluded:
            token_ids = token_ids.masked_fill((prep.status & STATUS_NO_VALID_TOKEN) != 0, -1)
        some_none = bool(plan.excluded) or bool((token_ids < 0).any())
        return self._token_logprobs(prep, z, cut, batch, plan, token_ids,
                                    greedy_tok=greedy_tok, some_none=some_none)

    @torch.no_grad()  # not differentiable; logits may come from a training model
    def sampling_mask(self, logits: torch.Tensor, batch: SamplingBatch, *,
                      bitmask: bool = False) -> torch.Tensor:
        """The kept support of each row (SGLang's ``return_sampling_mask``): the tokens
        :meth:`sample` may draw from these logits and this batch state.

        Through the same steps 1-8 as :meth:`sample`: a token is in the support when step
        8 keeps it (exactly where the "processed" logprob is finite; a -inf logit never
        is); a greedy row's support is its greedy token; a row without an
        admissible token has none. Returns (B, V) bool, or with ``bitmask`` (B, ceil(V /
        32)) int32 words, token ``v`` at bit ``v % 32`` of word ``v // 32`` (xgrammar's
        layout). Row-local, so bitwise batch-invariant like the tokens. A second pass
        over the logits: :meth:`sample_with_mask` gives both.
        """
        prep = self._prepare(self._checked_logits(logits, batch), batch)
        B, V = len(batch), batch.vocab_size
        keep = torch.zeros((B, V), dtype=torch.bool, device=batch.device)
        if B:
            plan = self._plan(batch, prep)
            z = self._scaled(prep, plan)
            cut = self._cut(z, batch, plan, prep) if plan.needs_scaled else Cut.none(B, batch.device)
            every = Rows.of(range(B), B, batch.device)
            keep = self._kept(cut, batch, every, z, lambda t: t.unsqueeze(1), prep.kernels)
            greedy_tok = self._greedy_tokens(prep, plan)
            if greedy_tok is not None:
                onehot = torch.arange(V, device=batch.device).unsqueeze(0) == \
                    greedy_tok.clamp(min=0).unsqueeze(1)
                keep = torch.where(batch.greedy.unsqueeze(1), onehot, keep)
            keep &= ((prep.status & STATUS_NO_VALID_TOKEN) == 0).unsqueeze(1)
        return pack_bitmask(keep) if bitmask else keep

    def sample_with_mask(self, logits: torch.Tensor, batch: SamplingBatch,
                         positions: torch.Tensor, *, bitmask: bool = False
                         ) -> tuple[SampleOutput, torch.Tensor]:
        """:meth:`sample` and :meth:`sampling_mask` of the same inputs."""
        return (self.sample(logits, batch, positions),
                self.sampling_mask(logits, batch, bitmask=bitmask))

