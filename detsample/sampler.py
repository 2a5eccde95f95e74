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
filters, draw, uniforms, log_softmax): ``"torch"`` the ops of :mod:`detsample.ops`,
``"triton"`` their kernel twins of :mod:`detsample.kernels.sampler_ops` (same semantics;
on CPU tensors only under the Triton interpreter), ``"auto"`` Triton for CUDA tensors
when triton is installed and torch otherwise. docs/gpu.md says what each guarantees.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType

import torch

from detsample.batch import SamplingBatch
from detsample.errors import InvalidSamplingParams
from detsample.grammar import batching as grammar_hooks
from detsample.grammar.masker import GrammarMasker
from detsample import kernels
from detsample.ops import draw as draw_ops
from detsample.ops import filters as filter_ops
from detsample.ops import logprobs as lp_ops
from detsample.ops.bias import apply_logit_bias_
from detsample.ops.sanitize import STATUS_NO_VALID_TOKEN, sanitize_rows
from detsample.ops.temperature import scale_logits
from detsample.processors.penalties import apply_step3
from detsample.processors.base import ProcessorRunner
from detsample.rng import RNG_NAME, row_uniforms
from detsample.workspace import Workspace

FILTER_IMPLS = ("auto", "sort")
BACKENDS = ("auto", "torch", "triton")
DRAW_METHOD = "inverse-cdf/token-id-order/fixed-point"


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


@dataclass
class _Prepared:
    raw: torch.Tensor      # (B, V) sanitised model logits (may alias the caller's)
    x: torch.Tensor        # (B, V) after steps 1-5 (may alias ``raw``)
    status: torch.Tensor   # (B,) int32
    row_max: torch.Tensor  # (B, 1) float32 max of ``x``
    z: torch.Tensor | None = None          # (B, V) scaled logits, every row (set by _scaled)
    tau: torch.Tensor | None = None        # (B,) float32 kept threshold (sampling rows)
    total: torch.Tensor | None = None      # (B,) int64 kept mass (sampling rows)
    kernels: ModuleType | None = None      # detsample.kernels.sampler_ops, or None: torch ops


class Sampler:
    """Batched sampler. ``deterministic=True`` (default) is bitwise batch-invariant.

    filter_impl: "auto" (bounded ``topk`` where it provably equals the full sort) or
    "sort" (always the full stable sort: the reference semantics).
    processors: batch-level logits processors run at pipeline step 1.
    backend: "auto" (Triton kernels for CUDA tensors, torch ops otherwise), "torch" or
    "triton" (the kernels also on CPU tensors, under the Triton interpreter). The Triton
    backend is always exact (the ``deterministic`` flag does not change it).
    A Sampler keeps scratch buffers between calls (:class:`~detsample.workspace.Workspace`);
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
        self.processors = tuple(processors)
        self._ws = Workspace()
        self._runner = ProcessorRunner(self.processors)  # step 1
        self.grammar_masker = GrammarMasker()  # one reused bitmask buffer

    def validate_request(self, request) -> None:
        """Admission check against the registered processors' ``validate_params``
       ; raises InvalidSamplingParams naming the request and the field."""
        self._runner.validate(request.rid, request.params)

    # -- input checks ----------------------------------------------------------------
    @staticmethod
    def _check_logits(logits: torch.Tensor, batch: SamplingBatch) -> None:
        if not isinstance(logits, torch.Tensor):
            raise InvalidSamplingParams(f"logits must be a torch.Tensor, got {type(logits).__name__}")
        if logits.dtype != torch.float32:
            raise InvalidSamplingParams(f"logits must be float32, got {logits.dtype}")
        want = (len(batch), batch.vocab_size)
        if tuple(logits.shape) != want:
            raise InvalidSamplingParams(f"logits must have shape {want}, got {tuple(logits.shape)}")
        if logits.device != batch.device:
            raise InvalidSamplingParams(
                f"logits must be on the batch's device {batch.device}, got {logits.device}")

    @staticmethod
    def _check_ids(name: str, t, batch: SamplingBatch, vocab: bool,
                   lowest: int = 0) -> torch.Tensor:
        if not isinstance(t, torch.Tensor):
            try:
                t = torch.as_tensor(t)
                if t.numel() == 0:  # [] is float32 to torch; empty ids are int64
                    t = t.to(torch.int64)
            except (TypeError, ValueError, OverflowError, RuntimeError) as e:
                raise InvalidSamplingParams(
                    f"{name} must be an int64 tensor of shape ({len(batch)},), got {t!r} "
                    f"({e})") from None
        if t.dtype not in (torch.int64, torch.int32) or tuple(t.shape) != (len(batch),):
            raise InvalidSamplingParams(
                f"{name} must be an int64 tensor of shape ({len(batch)},), got "
                f"{t.dtype} {tuple(t.shape)}")
        t = t.to(device=batch.device, dtype=torch.int64)
        if t.numel():
            lo, hi = int(t.min()), int(t.max())
            if lo < lowest:
                raise InvalidSamplingParams(f"{name} must be >= {lowest}, got {lo}")
            if vocab and hi >= batch.vocab_size:
                raise InvalidSamplingParams(
                    f"{name} must be < vocab_size ({batch.vocab_size}), got {hi}")
        return t

    # -- pipeline steps 1-5 ----------------------------------------------------------
    def _prepare(self, logits: torch.Tensor, batch: SamplingBatch) -> _Prepared:
        self._check_logits(logits, batch)
        k = self._kernels(logits.device)
        sanitize = k.sanitize_rows if k else sanitize_rows
        x = self._runner.run(logits, batch)  # step 1 (detsample.processors.base)
        raw, status, m = sanitize(logits)  # step 2 ("raw" = sanitised model logits)
        if x is logits:
            x = raw
        else:
            x, st, m = sanitize(x)
            status = status | st
        after_step2 = x
        # Steps 3-5 never write into ``after_step2`` (it may alias the caller's logits):
        # a step that changes logits works on a copy, so ``x is after_step2`` means
        # "unchanged" and the row maxima of step 2 still hold.
        x = apply_step3(x, batch, lambda: self._buf("step3", x))  # step 3
        x, status = grammar_hooks.grammar_step(  # step 4: grammar mask
            self.grammar_masker, batch, x, status, lambda: self._buf("mask", x))
        coo = batch.logit_bias_coo()  # step 5
        if coo is not None:
            x = apply_logit_bias_(x.clone() if x is after_step2 else x, *coo)
        if x is not after_step2:  # a penalty or a bias can overflow a finite logit to +inf
            x, st, m = sanitize(x)
            status = status | st
        return _Prepared(raw=raw, x=x, status=status, row_max=m, kernels=k)

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

    def _buf(self, name: str, like: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
        return self._ws.get(name, tuple(like.shape), dtype or like.dtype, like.device)

    # -- steps 7-8 -------------------------------------------------------------------
    def _scaled(self, prep: _Prepared, batch: SamplingBatch) -> torch.Tensor:
        """z = (x - max) / T_eff for every row (T_eff = 1 on greedy rows)."""
        if prep.z is None:
            x = prep.x
            m = prep.row_max
            m = torch.where(torch.isneginf(m), torch.zeros_like(m), m)  # all -inf rows
            t = torch.where(batch.greedy.unsqueeze(1), torch.ones_like(batch.temperatures),
                            batch.temperatures)
            scale = prep.kernels.scale_logits if prep.kernels else scale_logits
            prep.z = scale(x, m, t, out=self._buf("z", x))
        return prep.z

    @staticmethod
    def _rows(z: torch.Tensor, rows: list[int], ri: torch.Tensor) -> torch.Tensor:
        """z restricted to ``rows`` (``ri``: the same rows as an int64 index tensor,
        built once by the caller); z itself when rows is every row."""
        if rows == list(range(z.shape[0])):
            return z
        return z[ri]

    def _route(self, batch: SamplingBatch, rows: list[int]) -> tuple[list[int], list[int], list[int], int]:
        """Split sampling rows into (bounded topk, full sort, no sort) groups.

        A host-side decision from each row's OWN parameters: it selects how work is
        done, never what the result is (all routes give the same bits).
        """
        V = batch.vocab_size
        cand, sort_rows, plain = [], [], []
        k_max = 0
        for r in rows:
            p = batch.requests[r].params
            has_k = p.top_k != -1 and p.top_k < V
            if has_k and self.filter_impl == "auto" and p.top_k * 8 <= V:
                cand.append(r)
                k_max = max(k_max, p.top_k)
            elif has_k or p.top_p < 1.0:
                sort_rows.append(r)
            else:
                plain.append(r)
        return cand, sort_rows, plain, k_max

    def _analyse(self, prep: _Prepared, batch: SamplingBatch, rows: list[int],
                 u: torch.Tensor | None) -> torch.Tensor | None:
        """Step 8 (and step 9 when ``u`` is given) for the sampling ``rows``.

        Sets prep.tau (kept threshold) and prep.total (exact kept mass) for those rows;
        returns the drawn tokens (B,) when drawing.
        """
        z = self._scaled(prep, batch)
        B, V = z.shape
        frac = filter_ops.frac_bits(V)
        dev = z.device
        if prep.kernels:
            rows_t = torch.tensor(rows, dtype=torch.int64, device=dev)
            prep.tau, prep.total, tokens = prep.kernels.thresholds_and_draw(
                z, rows_t, batch.top_ks, batch.top_ps, batch.min_ps, u, frac,
                sort_only=self.filter_impl == "sort")
            return tokens if u is not None else None
        tau = torch.full((B,), float("-inf"), dtype=torch.float32, device=dev)
        total = torch.zeros((B,), dtype=torch.int64, device=dev)
        tokens = torch.full((B,), -1, dtype=torch.int64, device=dev)
        cand, sort_rows, plain, k_max = self._route(batch, rows)
        if cand:
            ci = torch.tensor(cand, dtype=torch.int64, device=dev)
            vals, ids, fits = filter_ops.topk_candidates(self._rows(z, cand, ci),
                                                         batch.top_ks[ci], k_max)
            if not self.deterministic:  # fast mode: no fallback when ties spill past k_max
                fits = torch.ones_like(fits)
            n = filter_ops.kept_prefix_length(vals, batch.top_ks[ci], batch.top_ps[ci],
                                              batch.min_ps[ci], frac)
            ok = fits.nonzero().flatten()
            okr = ci[ok]
            tau[okr] = vals.gather(1, (n - 1).unsqueeze(1)).squeeze(1)[ok]
            if ok.numel():  # without u (rescoring), the same code gives the kept mass
                uk = u[okr] if u is not None else torch.full(okr.shape, 0.5, dtype=torch.float64,
                                                              device=dev)
                tok, total[okr] = draw_ops.draw_compact(vals[ok], ids[ok], n[ok], uk, frac)
                if u is not None:
                    tokens[okr] = tok
            sort_rows.extend(ci[(~fits).nonzero().flatten()].tolist())
        if sort_rows:
            sort_rows.sort()
            si = torch.tensor(sort_rows, dtype=torch.int64, device=dev)
            tau[si] = filter_ops.thresholds_by_sort(
                self._rows(z, sort_rows, si), batch.top_ks[si], batch.top_ps[si],
                batch.min_ps[si], frac)
            plain.extend(sort_rows)
        if plain:
            plain.sort()
            fi = torch.tensor(plain, dtype=torch.int64, device=dev)
            zf = self._rows(z, plain, fi)
            w_buf, q_buf = self._buf("w", zf), self._buf("q", zf, torch.int64)
            if u is not None:
                tokens[fi], total[fi] = draw_ops.draw_full(
                    zf, tau[fi], batch.min_ps[fi], u[fi], frac, out=w_buf, q_out=q_buf)
            else:
                total[fi] = draw_ops.to_mass(draw_ops.kept_mass(
                    zf, tau[fi], batch.min_ps[fi], frac, out=w_buf), q_buf).sum(-1)
        prep.tau, prep.total = tau, total
        return tokens if u is not None else None

    # -- step 10 ---------------------------------------------------------------------
    def _mode_rows(self, prep: _Prepared, batch: SamplingBatch, mode: str,
                   rows: list[int], ri: torch.Tensor, greedy_tok: torch.Tensor) -> torch.Tensor:
        """(len(rows), V) float32 logprobs of ``rows`` (index ``ri``) in ``mode``."""
        log_softmax = prep.kernels.log_softmax_rows if prep.kernels else lp_ops.log_softmax_rows
        if mode == "raw":
            return log_softmax(self._rows(prep.raw, rows, ri))
        z = self._rows(self._scaled(prep, batch), rows, ri)
        if mode == "scaled":
            return log_softmax(z)
        ids = torch.arange(batch.vocab_size, device=z.device).unsqueeze(0)
        return self._processed(prep, batch, ri, z, ids, greedy_tok)

    def _processed(self, prep: _Prepared, batch: SamplingBatch, ri: torch.Tensor,
                   z: torch.Tensor, ids: torch.Tensor, greedy_tok: torch.Tensor) -> torch.Tensor:
        """The "processed" logprob of scaled logits ``z`` with token ids ``ids`` of rows
        ``ri``: either (n,) picked tokens, or (n, V) full rows with ``ids`` (1, V).
        Kept entries get the renormalised logprob of the draw, others -inf; a greedy row
        is one-hot on its greedy token."""
        self._no_sampling_rows(prep, len(batch))
        col = (lambda t: t.unsqueeze(1)) if z.dim() == 2 else (lambda t: t)  # noqa: E731
        frac = filter_ops.frac_bits(batch.vocab_size)
        exp = prep.kernels.exp if prep.kernels else torch.exp
        keep = (z >= col(prep.tau[ri])) & (exp(z) >= col(batch.min_ps[ri]))
        lp = lp_ops.processed_logprob(z, col(prep.total[ri].clamp(min=1)), frac)
        lp = lp.masked_fill(~keep, float("-inf"))
        onehot = torch.where(ids == col(greedy_tok[ri]), torch.zeros_like(lp),
                             torch.full_like(lp, float("-inf")))
        return torch.where(col(batch.greedy[ri]), onehot, lp)

    @staticmethod
    def _no_sampling_rows(prep: _Prepared, B: int) -> None:
        """Without sampling rows step 8 never ran; processed mode is then one-hot only."""
        if prep.tau is None:
            prep.tau = torch.full((B,), float("-inf"), device=prep.x.device)
            prep.total = torch.ones((B,), dtype=torch.int64, device=prep.x.device)

    def _token_logprobs(self, prep: _Prepared, batch: SamplingBatch, tokens: torch.Tensor,
                        greedy_tok: torch.Tensor) -> torch.Tensor:
        """(B,) float32 logprob of ``tokens`` (-1 = none: -inf) in each row's mode."""
        B = len(batch)
        out = torch.full((B,), float("-inf"), dtype=torch.float32, device=tokens.device)
        safe = tokens.clamp(min=0)
        for mode in sorted(batch.flags.modes):
            rows = batch.rows_with_mode(mode)
            ri = torch.tensor(rows, dtype=torch.int64, device=tokens.device)
            if mode in ("raw", "scaled"):
                src = prep.raw if mode == "raw" else self._scaled(prep, batch)
                sub = self._rows(src, rows, ri)
                if prep.kernels:
                    lsm = prep.kernels.log_softmax_rows(sub, out=self._buf("lsm", sub))
                else:
                    lsm = torch.log_softmax(sub, dim=-1, out=self._buf("lsm", sub))
                vals = lp_ops.gather_rows(lsm, safe[ri])
            else:
                ztok = lp_ops.gather_rows(self._rows(self._scaled(prep, batch), rows, ri), safe[ri])
                vals = self._processed(prep, batch, ri, ztok, safe[ri], greedy_tok)
            out[ri] = vals
        return out.masked_fill(tokens < 0, float("-inf"))

    def _top_logprobs(self, prep: _Prepared, batch: SamplingBatch, greedy_tok: torch.Tensor
                      ) -> tuple[torch.Tensor, torch.Tensor] | None:
        n = batch.flags.max_top_logprobs
        if n == 0:
            return None
        B, dev = len(batch), batch.device
        vals = torch.full((B, n), float("-inf"), dtype=torch.float32, device=dev)
        ids = torch.full((B, n), -1, dtype=torch.int64, device=dev)
        params = batch.params
        live = ((prep.status & STATUS_NO_VALID_TOKEN) == 0).tolist()
        for mode in sorted(batch.flags.modes):
            rows = [i for i in batch.rows_with_mode(mode) if params[i].logprobs > 0
                    and live[i]]
            if not rows:
                continue
            ri = torch.tensor(rows, dtype=torch.int64, device=dev)
            v, i = lp_ops.topn(self._mode_rows(prep, batch, mode, rows, ri, greedy_tok), n)
            vals[ri] = v
            ids[ri] = i
        want = torch.tensor([p.logprobs if ok else 0 for p, ok in zip(params, live)],
                            dtype=torch.int64, device=dev)  # dead rows: none
        beyond = torch.arange(n, device=dev).unsqueeze(0) >= want.unsqueeze(1)
        return vals.masked_fill(beyond, float("-inf")), ids.masked_fill(beyond, -1)

    def _greedy_tokens(self, prep: _Prepared, batch: SamplingBatch) -> torch.Tensor:
        """(B,) argmax of x on greedy rows (and on every row if a mode needs it), else -1."""
        B = len(batch)
        need_all = "processed" in batch.flags.modes
        rows = list(range(B)) if need_all else [i for i, p in enumerate(batch.params) if p.is_greedy]
        out = torch.full((B,), -1, dtype=torch.int64, device=batch.device)
        if rows:
            gi = torch.tensor(rows, dtype=torch.int64, device=batch.device)
            out[gi] = draw_ops.greedy_argmax(self._rows(prep.x, rows, gi))
        return out

    def _decide(self, prep: _Prepared, batch: SamplingBatch
                ) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
        """Shared by :meth:`sample` and :meth:`compute_logprobs`: ``(valid (B,) bool,
        greedy tokens (B,) int64, sampling rows)``; a sampling row is a non-greedy row
        with an admissible token."""
        valid = (prep.status & STATUS_NO_VALID_TOKEN) == 0
        greedy_tok = self._greedy_tokens(prep, batch)
        valid_l = valid.tolist()
        sampling = [i for i, p in enumerate(batch.params) if not p.is_greedy and valid_l[i]]
        return valid, greedy_tok, sampling

    # -- public API ------------------------------------------------------------------
    @torch.no_grad()  # not differentiable; logits may come from a training model
    def sample(self, logits: torch.Tensor, batch: SamplingBatch,
               positions: torch.Tensor) -> SampleOutput:
        """Sample one token per row.

        logits: (B, V) float32 on the batch's device (never modified).
        positions: (B,) int64, the position of each row's last input token; the row's
        random stream is keyed by (seed, position) only.
        Deterministic mode: bitwise batch-invariant and run-to-run reproducible.
        """
        positions = self._check_ids("positions", positions, batch, vocab=False)
        prep = self._prepare(logits, batch)
        B = len(batch)
        valid, greedy_tok, sampling = self._decide(prep, batch)
        tokens = torch.where(batch.greedy, greedy_tok, torch.full_like(greedy_tok, -1))
        if sampling:
            u = (prep.kernels.row_uniforms if prep.kernels else row_uniforms)(batch.seeds,
                                                                              positions)
            drawn = self._analyse(prep, batch, sampling, u)
            tokens = torch.where(batch.greedy, tokens, drawn)
        tokens = tokens.masked_fill(~valid, -1)
        if B == 0:
            return SampleOutput(tokens, torch.empty((0,), dtype=torch.float32, device=batch.device),
                                None, batch.seeds.clone(), prep.status)
        logprobs = self._token_logprobs(prep, batch, tokens, greedy_tok)
        top = self._top_logprobs(prep, batch, greedy_tok)
        return SampleOutput(token_ids=tokens, logprobs=logprobs, top_logprobs=top,
                            seeds=batch.seeds.clone(), status=prep.status)

    @torch.no_grad()  # not differentiable; logits may come from a training model
    def compute_logprobs(self, logits: torch.Tensor, batch: SamplingBatch,
                         token_ids: torch.Tensor) -> torch.Tensor:
        """The rescoring (prefill) path: logprob of ``token_ids`` per row, in each row's
        ``logprobs_mode``, through the same steps 1-8 as :meth:`sample`.

        logits: (B, V) float32; token_ids: (B,) int64, -1 meaning "no token" (what
        :meth:`sample` reports for a row without an admissible token; its logprob is
        -inf). Returns (B,) float32, bitwise equal to the ``logprobs`` that
        :meth:`sample` reported for the same inputs.
        """
        token_ids = self._check_ids("token_ids", token_ids, batch, vocab=True, lowest=-1)
        prep = self._prepare(logits, batch)
        if len(batch) == 0:
            return torch.empty((0,), dtype=torch.float32, device=batch.device)
        valid, greedy_tok, sampling = self._decide(prep, batch)
        if "processed" in batch.flags.modes and sampling:
            self._analyse(prep, batch, sampling, None)
        return self._token_logprobs(prep, batch, token_ids.masked_fill(~valid, -1), greedy_tok)
