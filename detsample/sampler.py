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

import numpy as np
import torch

from detsample import arith, rules
from detsample.batch import SamplingBatch
from detsample.errors import InvalidSamplingParams
from detsample.grammar import batching as grammar_hooks
from detsample.grammar.masker import GrammarMasker
from detsample.ops import draw as draw_ops
from detsample.ops import rowpass, topkdraw
from detsample.ops.mask import pack_bitmask
from detsample.params.validation import check_logits, row_ids_tensor
from detsample.processors.base import ProcessorRunner
from detsample.processors.loading import load_processors
from detsample.rng import RNG_NAME
from detsample.rules import STATUS_NO_VALID_TOKEN
from detsample.sampling import keptset
from detsample.sampling import logprobs as lp_steps
from detsample.sampling.backend import BACKENDS, TORCH, resolve
from detsample.sampling.keptset import CutInputs, KeptCDF
from detsample.sampling.logprobs import Steps
from detsample.sampling.prepare import Prepared, prepare
from detsample.sampling.rowplan import RowPlan, Rows, plan_rows
from detsample.sampling.workspace import Workspace

FILTER_IMPLS = ("auto", "sort")
__all__ = ["BACKENDS", "FILTER_IMPLS", "SampleOutput", "Sampler"]
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

    def __init__(
        self, deterministic: bool = True, filter_impl: str = "auto", processors: tuple = (), backend: str = "auto"
    ) -> None:
        if filter_impl not in FILTER_IMPLS:
            raise InvalidSamplingParams(f"filter_impl must be one of {FILTER_IMPLS}, got {filter_impl!r}")
        self._backend = resolve(backend)  # bound once: torch ops or Triton kernels
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

    # -- steps 1-5 -------------------------------------------------------------------
    @staticmethod
    def _checked_logits(logits: torch.Tensor, batch: SamplingBatch) -> torch.Tensor:
        """The call's logits validated (once per call) and as float32 (a bfloat16 /
        float16 input upcast once, exactly)."""
        check_logits(logits, len(batch), batch.vocab_size, batch.device)
        return logits if logits.dtype == torch.float32 else logits.to(torch.float32)

    def _prepare(self, logits: torch.Tensor, batch: SamplingBatch) -> Prepared:
        """Steps 1-5 of float32 logits already checked (:meth:`_checked_logits`)."""
        return prepare(
            logits,
            batch,
            backend=self._backend.for_device(logits.device),
            runner=self._runner,
            masker=self.grammar_masker,
            scratch=self._buf,
        )

    def _build_plan(self, batch: SamplingBatch, excluded: frozenset[int] = frozenset()) -> RowPlan:
        return plan_rows(
            batch.params,
            batch.vocab_size,
            self.filter_impl,
            batch.device,
            temperatures=batch.temperatures,
            greedy=batch.greedy,
            filters=(batch.top_ks, batch.top_ps, batch.element_filters),
            excluded=excluded,
        )

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

    def _plain_greedy(self, x: torch.Tensor, batch: SamplingBatch, plan: RowPlan) -> SampleOutput | None:
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
        tokens, logprobs = draw_ops.greedy_with_logprob(x)
        if not math.isfinite(float(logprobs.sum() if plan.size > 1 else logprobs)):
            # (each is in [-log V, 0] when finite)
            return None
        return self._shortcut_output(
            x, lambda: x.gather(1, tokens.unsqueeze(1)), tokens, logprobs, batch, plan=plan, greedy_tok=tokens
        )

    def _small_top_k(
        self, x: torch.Tensor, batch: SamplingBatch, plan: RowPlan, positions: torch.Tensor
    ) -> SampleOutput | None:
        """The small top-k shortcut: every row samples with a small top-k (any top-p and
        element-wise filters), nothing of steps 1-5 in the batch, "raw" logprobs, a CPU:
        steps 7-10 of each row in one numba pass (:func:`detsample.ops.topkdraw.draw`,
        the bits of the general path: tests/ops/test_topkdraw.py). Returns None (the
        general path) where it does not apply, or where a row is invalid or its top-k
        tie group spills past the candidates. ``plan``: the batch's
        :meth:`_shortcut_plan`."""
        if not topkdraw.applies(x):
            return None
        rows = batch.derived(("small_top_k", self.filter_impl), lambda: self._small_top_k_rows(batch, plan) or False)
        if rows is False:
            return None
        got = topkdraw.draw(x, rows, TORCH.uniforms(batch.seeds, positions), deterministic=self.deterministic)
        if got is None:
            return None
        row_max = lambda: arith.row_max(x).unsqueeze(1)  # noqa: E731 - called only for top logprobs
        return self._shortcut_output(x, row_max, got.tokens, got.logprobs, batch, plan=plan)

    @staticmethod
    def _small_top_k_rows(batch: SamplingBatch, plan: RowPlan) -> topkdraw.SmallTopK | None:
        """The batch's :class:`~detsample.ops.topkdraw.SmallTopK` when every row samples
        with a small top-k (one candidate route for all, in batch order); else None."""
        rt = plan.route
        bf = rt.filters
        if not (plan.sampling.every and rt.bounded.every and bf is not None):
            return None
        if bf.k_index is None or bf.small is not None or bf.wide is not None:
            return None
        K = min(rt.k_max + 1, batch.vocab_size)
        return topkdraw.SmallTopK.of(
            batch.vocab_size, K, bf.k_index, plan.temperatures, bf.top_p, batch.element_filters
        )

    def _shortcut_plan(self, batch: SamplingBatch) -> RowPlan | None:
        """The batch's plan when a shortcut may apply (all-greedy, :meth:`_plain_greedy`;
        all small top-k, :meth:`_small_top_k`): nothing of steps 1-5 in the batch (so the
        logits reach step 6 unchanged), "raw" logprobs only and the torch ops; None
        otherwise."""
        plan = self._cached_plan(batch)
        if (
            plan.untouched
            and len(plan.modes) == 1
            and "raw" in plan.modes
            and not self.processors
            and self._backend.for_device(batch.device) is TORCH
        ):
            return plan
        return None

    def _shortcut_output(
        self,
        x: torch.Tensor,
        row_max,
        tokens: torch.Tensor,
        logprobs: torch.Tensor,
        batch: SamplingBatch,
        *,
        plan: RowPlan,
        greedy_tok: torch.Tensor | None = None,
    ) -> SampleOutput:
        """A shortcut's :class:`SampleOutput`: every row valid (status all zero), the top
        logprobs ("raw") of the float32 logits ``x`` when a row asks for them
        (``row_max``: a callable giving (B, 1) maxima, called only then)."""
        status = _zero_status(plan.size, x.device)
        top = None
        if plan.max_top:
            prep = Prepared(raw=x, x=x, status=status, row_max=row_max(), all_valid=True)
            steps = Steps(batch, prep, plan, greedy_tok, z=None, cdf=None, u=None)
            top = self._top_logprobs(steps)
        return SampleOutput(
            token_ids=tokens, logprobs=logprobs, top_logprobs=top, seeds=_copy(batch.seeds), status=status
        )

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
        return prep.backend.scale(prep.x, self._shift(prep), plan.temperatures, out=self._buf("z", prep.x))

    def _first_pass(self, prep: Prepared, plan: RowPlan):
        """Step 7's z with, in the same pass over each row, the "raw" rows' normalisers
        and the top-p rows' exact masses and group maxima (:func:`rowpass.first_pass`):
        when the logits are the model's (steps 1-5 changed nothing) and the torch ops
        run; None otherwise (then each is its own pass)."""
        if prep.backend is not TORCH or prep.x is not prep.raw or prep.raw_max is None:
            return None
        flags = torch.zeros(plan.size, dtype=torch.int8)
        if "raw" in plan.modes:
            flags[plan.modes["raw"].index] = 1
        nuc = keptset.prepass_rows(plan)
        if nuc is not None:
            flags[nuc] |= 2
        return rowpass.first_pass(
            prep.x, (self._shift(prep), prep.raw_max), plan.temperatures, flags, self._buf("z", prep.x)
        )

    @staticmethod
    def _needs_full_z(plan: RowPlan, prep: Prepared, by_columns) -> bool:
        """Whether some consumer needs step 7's z over the whole vocabulary: the Triton
        kernels, the "scaled" and "processed" logprobs, and step 8 but for the small
        top-k candidates and the allowed-columns rows (:func:`keptset.needs_full_z`)."""
        if not plan.needs_scaled:
            return False
        return (
            prep.backend is not TORCH
            or "scaled" in plan.modes
            or plan.any_processed
            or keptset.needs_full_z(plan, by_columns)
        )

    @staticmethod
    def _by_columns(plan: RowPlan, prep: Prepared):
        """The plain grammar rows drawn over their allowed columns, and the other plain
        rows (:func:`keptset.column_rows`); None when there is none (or the Triton kernels
        run step 8)."""
        if prep.backend is not TORCH:
            return None
        return keptset.column_rows(plan, prep.columns, prep.x)

    # -- step 8 ----------------------------------------------------------------------
    def _kept_cdf(
        self,
        z: torch.Tensor | None,
        batch: SamplingBatch,
        plan: RowPlan,
        prep: Prepared,
        *,
        u: torch.Tensor | None = None,
        by_columns=None,
        first=None,
    ) -> KeptCDF:
        """Thresholds, exact kept mass and CDF tables of the sampling rows
        (:func:`detsample.sampling.keptset.kept_cdf`; a pure step: no draw). The Triton
        backend runs the same step fused with the draw when the uniforms ``u`` are given
        (``KeptCDF.drawn``). ``z`` None: step 8 computes it only if a row needs it."""
        if not plan.sampling:
            return KeptCDF.none(plan.size, batch.device)
        filters = (batch.top_ks, batch.top_ps, batch.element_filters)
        fused = prep.backend.fused_cut
        if fused is not None:
            tau, total, drawn = fused(
                z, plan.sampling.index, *filters, u, rules.frac_bits(z.shape[1]), sort_only=self.filter_impl == "sort"
            )
            return KeptCDF(tau, total, drawn=drawn if u is not None else None)
        inp = CutInputs(
            prep.x,
            self._shift(prep),
            filters,
            prep.columns,
            prep.column_values,
            lambda: self._scaled(prep, plan),
            self._buf,
            self.deterministic,
            self.filter_impl,
            first,
        )
        return keptset.kept_cdf(z, plan, inp, by_columns)

    # -- step 10 (detsample.sampling.logprobs) ---------------------------------------
    def _token_logprobs(self, st: Steps, tokens: torch.Tensor, some_none: bool) -> torch.Tensor:
        return lp_steps.token_logprobs(st, tokens, some_none)

    def _top_logprobs(self, st: Steps) -> tuple[torch.Tensor, torch.Tensor] | None:
        return lp_steps.top_logprobs(st)

    # -- the pipeline ----------------------------------------------------------------
    def _steps(self, logits: torch.Tensor, batch: SamplingBatch, positions: torch.Tensor | None) -> Steps:
        """Steps 1-8 of a non-empty batch (and the uniforms of step 9 when ``positions``
        are given: the Triton backend draws with its cut): prepare -> plan -> greedy ->
        temperature -> kept set. ``positions`` None: the rescoring path, which stops
        before the draw (only "processed" logprobs read the kept set)."""
        prep = self._prepare(logits, batch)
        plan = self._plan(batch, prep)
        by_columns = self._by_columns(plan, prep)
        needs_z = self._needs_full_z(plan, prep, by_columns)
        first = self._first_pass(prep, plan) if needs_z else None
        raw_norm = (
            lp_steps.raw_normalisers(prep, plan)
            if first is None
            else (None if prep.raw_max is None else prep.raw_max.squeeze(1), first.norm)
        )
        greedy_tok = self._greedy_tokens(prep, plan)
        z = first.z if first is not None else (self._scaled(prep, plan) if needs_z else None)
        u = prep.backend.uniforms(batch.seeds, positions) if positions is not None and plan.sampling else None
        wants_cdf = plan.needs_scaled if positions is not None else plan.any_processed
        cdf = (
            self._kept_cdf(z, batch, plan, prep, u=u, by_columns=by_columns, first=first)
            if wants_cdf
            else KeptCDF.none(plan.size, batch.device)
        )
        return Steps(batch, prep, plan, greedy_tok, z, cdf, u, raw_norm)

    def sample(self, logits: torch.Tensor, batch: SamplingBatch, positions: torch.Tensor) -> SampleOutput:
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
                if plan.greedy.every:
                    out = self._plain_greedy(logits, batch, plan)
                else:
                    out = self._small_top_k(logits, batch, plan, positions)
                if out is not None:
                    return out
        return self._sample(logits, batch, positions)

    @torch.no_grad()  # not differentiable; logits may come from a training model
    def _sample(self, logits: torch.Tensor, batch: SamplingBatch, positions: torch.Tensor) -> SampleOutput:
        """:meth:`sample` after its shortcuts (positions validated): the steps, then the
        draw, the greedy rows merged, the logprobs gathered."""
        if len(batch) == 0:
            prep = self._prepare(logits, batch)
            return SampleOutput(
                torch.empty((0,), dtype=torch.int64, device=batch.device),
                torch.empty((0,), dtype=torch.float32, device=batch.device),
                None,
                batch.seeds.clone(),
                prep.status,
            )
        st = self._steps(logits, batch, positions)
        plan, greedy_tok = st.plan, st.greedy_tok
        if plan.greedy.every:
            tokens = greedy_tok
        elif plan.sampling:
            drawn = st.cdf.draw(st.u)
            tokens = torch.where(batch.greedy, greedy_tok, drawn) if plan.greedy else drawn
        else:  # greedy rows and rows without an admissible token only
            none = torch.full((plan.size,), -1, dtype=torch.int64, device=batch.device)
            tokens = none if greedy_tok is None else torch.where(batch.greedy, greedy_tok, none)
        if plan.excluded:
            tokens = tokens.masked_fill((st.prep.status & STATUS_NO_VALID_TOKEN) != 0, -1)
        return SampleOutput(
            token_ids=tokens,
            logprobs=self._token_logprobs(st, tokens, bool(plan.excluded)),
            top_logprobs=self._top_logprobs(st),
            seeds=_copy(batch.seeds),
            status=st.prep.status,
        )

    @torch.no_grad()  # not differentiable; logits may come from a training model
    def compute_logprobs(self, logits: torch.Tensor, batch: SamplingBatch, token_ids: torch.Tensor) -> torch.Tensor:
        """The rescoring (prefill) path: logprob of ``token_ids`` per row, in each row's
        ``logprobs_mode``, through the same steps 1-8 as :meth:`sample`.

        logits: (B, V) float32, bfloat16 or float16 (upcast once to float32);
        token_ids: (B,) int64, -1 meaning "no token" (what :meth:`sample` reports for a
        row without an admissible token; its logprob is -inf). Returns (B,) float32,
        bitwise equal to the ``logprobs`` that :meth:`sample` reported for the same inputs.
        """
        token_ids = row_ids_tensor("token_ids", token_ids, len(batch), batch.device, lowest=-1, upper=batch.vocab_size)
        logits = self._checked_logits(logits, batch)
        if len(batch) == 0:
            self._prepare(logits, batch)
            return torch.empty((0,), dtype=torch.float32, device=batch.device)
        st = self._steps(logits, batch, None)
        if st.plan.excluded:
            token_ids = token_ids.masked_fill((st.prep.status & STATUS_NO_VALID_TOKEN) != 0, -1)
        some_none = bool(st.plan.excluded) or bool((token_ids < 0).any())
        return self._token_logprobs(st, token_ids, some_none)

    @torch.no_grad()  # not differentiable; logits may come from a training model
    def sampling_mask(self, logits: torch.Tensor, batch: SamplingBatch, *, bitmask: bool = False) -> torch.Tensor:
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
            cdf = self._kept_cdf(z, batch, plan, prep) if plan.needs_scaled else KeptCDF.none(B, batch.device)
            every = Rows.of(range(B), B, batch.device)
            keep = lp_steps.kept_mask(cdf, batch, every, z, lambda t: t.unsqueeze(1), prep.backend.exp)
            greedy_tok = self._greedy_tokens(prep, plan)
            if greedy_tok is not None:
                onehot = torch.arange(V, device=batch.device).unsqueeze(0) == greedy_tok.clamp(min=0).unsqueeze(1)
                keep = torch.where(batch.greedy.unsqueeze(1), onehot, keep)
            keep &= ((prep.status & STATUS_NO_VALID_TOKEN) == 0).unsqueeze(1)
            keep &= prep.x != float("-inf")  # a row's -inf logits hold no mass (no filter: tau = -inf)
        return pack_bitmask(keep) if bitmask else keep

    def sample_with_mask(
        self, logits: torch.Tensor, batch: SamplingBatch, positions: torch.Tensor, *, bitmask: bool = False
    ) -> tuple[SampleOutput, torch.Tensor]:
        """:meth:`sample` and :meth:`sampling_mask` of the same inputs."""
        return (self.sample(logits, batch, positions), self.sampling_mask(logits, batch, bitmask=bitmask))
