"""The Sampler: composes the pure ops of :mod:`detsample.ops` in DESIGN.md's order.

1. user logits processors  2. non-finite sanitising  3. penalties  4. grammar mask
5. logit_bias  6. greedy rows  7. temperature  8. top-k, top-p, min-p
9. seeded draw  10. logprobs

``Sampler()`` (deterministic, the default) gives every row bitwise the same token and
logprobs whatever the batch around it, the thread count or the run. It never sorts the
full vocabulary when a bounded ``topk`` provably gives the same bits (see
:mod:`detsample.ops.filters`); ``Sampler(filter_impl="sort")`` forces the full stable
sort, the reference semantics. ``Sampler(deterministic=False)`` is the fast mode:
statistically correct, seeded per batch, NOT batch-invariant.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from detsample.batch import SamplingBatch
from detsample.errors import InvalidSamplingParams
from detsample.grammar import batching as grammar_hooks  # issue 4
from detsample.grammar.masker import GrammarMasker  # issue 4
from detsample.ops import draw as draw_ops
from detsample.ops import filters as filter_ops
from detsample.ops import logprobs as lp_ops
from detsample.ops.bias import apply_logit_bias_
from detsample.ops.sanitize import STATUS_NO_VALID_TOKEN, sanitize_rows
from detsample.ops.temperature import row_max, scale_logits
from detsample.rng import RNG_NAME, row_uniforms

FILTER_IMPLS = ("auto", "sort")
DRAW_METHOD = "inverse-cdf/token-id-order/fixed-point"


@dataclass
class SampleOutput:
    """Result of :meth:`Sampler.sample` for a batch of B rows.

    token_ids: (B,) int64; -1 where a row had no admissible token (``status`` bit 4).
    logprobs: (B,) float32, the chosen token's logprob in the row's ``logprobs_mode``.
    top_logprobs: ``((B, n) float32, (B, n) int64)`` with n the largest ``logprobs`` of
    the batch, or None; row i's first ``params.logprobs`` entries are its answer, the
    rest are ``-inf`` / ``-1``. seeds: (B,) int64 resolved seeds (for replay).
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
    z: torch.Tensor | None = None          # (B, V) scaled logits, rows in ``z_rows``
    tau: torch.Tensor | None = None        # (B,) float32 kept threshold (sampling rows)
    total: torch.Tensor | None = None      # (B,) int64 kept mass (sampling rows)


class Sampler:
    """Batched sampler. ``deterministic=True`` (default) is bitwise batch-invariant.

    filter_impl: "auto" (bounded ``topk`` where it provably equals the full sort) or
    "sort" (always the full stable sort: the reference semantics).
    processors: batch-level logits processors run at pipeline step 1.
    """

    def __init__(self, deterministic: bool = True, filter_impl: str = "auto",
                 processors: tuple = ()) -> None:
        if filter_impl not in FILTER_IMPLS:
            raise InvalidSamplingParams(
                f"filter_impl must be one of {FILTER_IMPLS}, got {filter_impl!r}")
        self.deterministic = bool(deterministic)
        self.filter_impl = filter_impl
        self.processors = tuple(processors)
        self.grammar_masker = GrammarMasker()  # issue 4: one reused bitmask buffer

    rng_name = RNG_NAME
    draw_method = DRAW_METHOD

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
    def _check_ids(name: str, t: torch.Tensor, batch: SamplingBatch, vocab: bool) -> torch.Tensor:
        if not isinstance(t, torch.Tensor):
            t = torch.as_tensor(t)
        if t.dtype not in (torch.int64, torch.int32) or tuple(t.shape) != (len(batch),):
            raise InvalidSamplingParams(
                f"{name} must be an int64 tensor of shape ({len(batch)},), got "
                f"{t.dtype} {tuple(t.shape)}")
        t = t.to(device=batch.device, dtype=torch.int64)
        lo = int(t.min()) if t.numel() else 0
        hi = int(t.max()) if t.numel() else 0
        if lo < 0 or (vocab and hi >= batch.vocab_size):
            bad = lo if lo < 0 else hi
            raise InvalidSamplingParams(f"{name} contains {bad}, outside the valid range")
        return t

    # -- pipeline steps 1-5 ----------------------------------------------------------
    def _prepare(self, logits: torch.Tensor, batch: SamplingBatch) -> _Prepared:
        self._check_logits(logits, batch)
        x = logits
        for proc in self.processors:  # step 1 (sees the model's logits)
            x = proc.apply(x if x is not logits else logits.clone())
        raw, status = sanitize_rows(logits)
        x, st = sanitize_rows(x) if x is not logits else (raw, status)  # step 2
        status = status | st
        owned = x is not logits and x is not raw
        # step 3: penalties -- see issue 3 (detsample.ops.penalties)
        x, owned, status = grammar_hooks.grammar_step(  # step 4: grammar mask (issue 4)
            self.grammar_masker, batch, x, owned, status)
        coo = batch.logit_bias_coo()  # step 5
        if coo is not None:
            if not owned:
                x = x.clone()
                owned = True
            apply_logit_bias_(x, *coo)
            x, st = sanitize_rows(x)  # a bias can overflow a finite logit to +inf
            status = status | st
        return _Prepared(raw=raw, x=x, status=status)

    # -- steps 7-8 -------------------------------------------------------------------
    def _scaled(self, prep: _Prepared, batch: SamplingBatch) -> torch.Tensor:
        """z = (x - max) / T_eff for every row (T_eff = 1 on greedy rows)."""
        if prep.z is None:
            x = prep.x
            m = row_max(x)
            m = torch.where(torch.isneginf(m), torch.zeros_like(m), m)  # all -inf rows
            t = torch.where(batch.greedy.unsqueeze(1), torch.ones_like(batch.temperatures),
                            batch.temperatures)
            prep.z = scale_logits(x, m, t)
        return prep.z

    def _analyse(self, prep: _Prepared, batch: SamplingBatch, rows: torch.Tensor,
                 u: torch.Tensor | None) -> torch.Tensor | None:
        """Steps 8 (and 9 when ``u`` is given) for sampling ``rows``.

        Fills prep.tau and prep.total for those rows; returns their tokens when drawing.
        """
        z = self._scaled(prep, batch)
        V = batch.vocab_size
        frac = filter_ops.frac_bits(V)
        B = len(batch)
        tau = torch.full((B,), float("-inf"), dtype=torch.float32, device=z.device)
        total = torch.zeros((B,), dtype=torch.int64, device=z.device)
        tokens = torch.full((B,), -1, dtype=torch.int64, device=z.device)
        params = batch.params
        rows_l = rows.tolist()
        cand, sort_rows, full_rows = [], [], []
        k_max = 0
        for r in rows_l:
            p = params[r]
            has_k = p.top_k != -1 and p.top_k < V
            if has_k and self.filter_impl == "auto" and p.top_k * 8 <= V:
                cand.append(r)
                k_max = max(k_max, p.top_k)
            elif has_k or p.top_p < 1.0:
                sort_rows.append(r)
            else:
                full_rows.append(r)
        if cand:
            ci = torch.tensor(cand, dtype=torch.int64, device=z.device)
            zc = z.index_select(0, ci)
            vals, ids, fits = filter_ops.topk_candidates(zc, batch.top_ks[ci], k_max)
            n = filter_ops.kept_prefix_length(vals, batch.top_ks[ci], batch.top_ps[ci],
                                              batch.min_ps[ci], frac)
            tau_c = vals.gather(1, (n - 1).unsqueeze(1)).squeeze(1)
            ok = fits.nonzero().flatten()
            if ok.numel():
                okr = ci[ok]
                tau[okr] = tau_c[ok]
                if u is not None:
                    tok, tot = draw_ops.draw_compact(vals[ok], ids[ok], n[ok], u[okr], frac)
                    tokens[okr] = tok
                    total[okr] = tot
                else:
                    total[okr] = self._kept_mass(z[okr], tau_c[ok], batch.min_ps[okr], frac)
            sort_rows.extend(ci[(~fits).nonzero().flatten()].tolist())
        if sort_rows:
            si = torch.tensor(sorted(sort_rows), dtype=torch.int64, device=z.device)
            tau[si] = filter_ops.thresholds_by_sort(
                z.index_select(0, si), batch.top_ks[si], batch.top_ps[si], batch.min_ps[si], frac)
            full_rows.extend(si.tolist())
        if full_rows:
            fi = torch.tensor(sorted(full_rows), dtype=torch.int64, device=z.device)
            zf = z if len(full_rows) == B else z.index_select(0, fi)
            if u is not None:
                tok, tot = draw_ops.draw_full(zf, tau[fi], batch.min_ps[fi], u[fi], frac)
                tokens[fi] = tok
                total[fi] = tot
            else:
                total[fi] = self._kept_mass(zf, tau[fi], batch.min_ps[fi], frac)
        prep.tau, prep.total = tau, total
        return tokens if u is not None else None

    @staticmethod
    def _kept_mass(z: torch.Tensor, tau: torch.Tensor, min_p: torch.Tensor, frac: int) -> torch.Tensor:
        e = torch.exp(z)
        keep = (z >= tau.unsqueeze(1)) & (e >= min_p.unsqueeze(1))
        return (filter_ops.quantize_mass(e, frac) * keep).sum(-1)

    # -- step 10 ---------------------------------------------------------------------
    def _mode_values(self, prep: _Prepared, batch: SamplingBatch, mode: str,
                     rows: torch.Tensor, greedy_tok: torch.Tensor) -> torch.Tensor:
        """(len(rows), V) float32 logprobs of ``rows`` in ``mode`` (full rows)."""
        if mode == "raw":
            return lp_ops.log_softmax_rows(prep.raw.index_select(0, rows))
        z = self._scaled(prep, batch).index_select(0, rows)
        if mode == "scaled":
            return lp_ops.log_softmax_rows(z)
        frac = filter_ops.frac_bits(batch.vocab_size)
        greedy = batch.greedy.index_select(0, rows)
        out = torch.full_like(z, float("-inf"))
        g = greedy.nonzero().flatten()
        if g.numel():
            out[g, greedy_tok.index_select(0, rows)[g]] = 0.0
        s = (~greedy).nonzero().flatten()
        if s.numel():
            rs = rows[s]
            zs = z[s]
            keep = (zs >= prep.tau[rs].unsqueeze(1)) & (torch.exp(zs) >= batch.min_ps[rs].unsqueeze(1))
            lp = lp_ops.processed_logprob(zs, prep.total[rs].unsqueeze(1), frac)
            out[s] = torch.where(keep, lp, torch.full_like(lp, float("-inf")))
        return out

    def _token_logprobs(self, prep: _Prepared, batch: SamplingBatch, tokens: torch.Tensor,
                        greedy_tok: torch.Tensor) -> torch.Tensor:
        B = len(batch)
        out = torch.full((B,), float("-inf"), dtype=torch.float32, device=tokens.device)
        safe = tokens.clamp(min=0)
        frac = filter_ops.frac_bits(batch.vocab_size)
        for mode in sorted(batch.flags.modes):
            rows = torch.tensor(batch.rows_with_mode(mode), dtype=torch.int64, device=tokens.device)
            if mode == "raw":
                vals = lp_ops.gather_rows(lp_ops.log_softmax_rows(
                    prep.raw if rows.numel() == B else prep.raw.index_select(0, rows)), safe[rows])
            elif mode == "scaled":
                z = self._scaled(prep, batch)
                vals = lp_ops.gather_rows(lp_ops.log_softmax_rows(
                    z if rows.numel() == B else z.index_select(0, rows)), safe[rows])
            else:
                greedy = batch.greedy[rows]
                z = self._scaled(prep, batch)
                if prep.tau is None:  # no sampling row: only greedy rows use this mode
                    prep.tau = torch.full((B,), float("-inf"), device=tokens.device)
                    prep.total = torch.ones((B,), dtype=torch.int64, device=tokens.device)
                ztok = lp_ops.gather_rows(z.index_select(0, rows), safe[rows])
                kept = ((ztok >= prep.tau[rows]) &
                        (torch.exp(ztok) >= batch.min_ps[rows]))
                lp = lp_ops.processed_logprob(ztok, prep.total[rows].clamp(min=1), frac)
                lp = torch.where(kept, lp, torch.full_like(lp, float("-inf")))
                gl = torch.where(tokens[rows] == greedy_tok[rows], torch.zeros_like(lp),
                                 torch.full_like(lp, float("-inf")))
                vals = torch.where(greedy, gl, lp)
            out[rows] = vals
        none = tokens < 0
        return torch.where(none, torch.full_like(out, float("-inf")), out)

    def _top_logprobs(self, prep: _Prepared, batch: SamplingBatch, greedy_tok: torch.Tensor
                      ) -> tuple[torch.Tensor, torch.Tensor] | None:
        n = batch.flags.max_top_logprobs
        if n == 0:
            return None
        B, dev = len(batch), batch.device
        vals = torch.full((B, n), float("-inf"), dtype=torch.float32, device=dev)
        ids = torch.full((B, n), -1, dtype=torch.int64, device=dev)
        params = batch.params
        for mode in sorted(batch.flags.modes):
            rl = [i for i in batch.rows_with_mode(mode) if params[i].logprobs > 0]
            if not rl:
                continue
            rows = torch.tensor(rl, dtype=torch.int64, device=dev)
            v, i = lp_ops.topn(self._mode_values(prep, batch, mode, rows, greedy_tok), n)
            vals[rows] = v
            ids[rows] = i
        want = torch.tensor([p.logprobs for p in params], dtype=torch.int64, device=dev)
        beyond = torch.arange(n, device=dev).unsqueeze(0) >= want.unsqueeze(1)
        vals = vals.masked_fill(beyond, float("-inf"))
        ids = ids.masked_fill(beyond, -1)
        return vals, ids

    # -- public API ------------------------------------------------------------------
    def sample(self, logits: torch.Tensor, batch: SamplingBatch,
               positions: torch.Tensor) -> SampleOutput:
        """Sample one token per row.

        logits: (B, V) float32 on the batch's device (never modified).
        positions: (B,) int64, the position of each row's last input token.
        Deterministic mode: bitwise batch-invariant and run-to-run reproducible.
        """
        positions = self._check_ids("positions", positions, batch, vocab=False)
        prep = self._prepare(logits, batch)
        if not self.deterministic:
            from detsample.fastpath import sample_fast
            return sample_fast(self, prep, batch, positions)
        B = len(batch)
        dev = batch.device
        valid = (prep.status & STATUS_NO_VALID_TOKEN) == 0
        greedy_tok = draw_ops.greedy_argmax(prep.x)
        tokens = torch.where(batch.greedy, greedy_tok, torch.full_like(greedy_tok, -1))
        sampling = ((~batch.greedy) & valid).nonzero().flatten()
        if sampling.numel():
            u = row_uniforms(batch.seeds, positions)
            drawn = self._analyse(prep, batch, sampling, u)
            tokens = torch.where(batch.greedy, tokens, drawn)
        tokens = torch.where(valid, tokens, torch.full_like(tokens, -1))
        logprobs = self._token_logprobs(prep, batch, tokens, greedy_tok) if B else \
            torch.empty((0,), dtype=torch.float32, device=dev)
        top = self._top_logprobs(prep, batch, greedy_tok) if B else None
        return SampleOutput(token_ids=tokens, logprobs=logprobs, top_logprobs=top,
                            seeds=batch.seeds.clone(), status=prep.status)

    def compute_logprobs(self, logits: torch.Tensor, batch: SamplingBatch,
                         token_ids: torch.Tensor) -> torch.Tensor:
        """The rescoring (prefill) path: logprob of ``token_ids`` per row, in each row's
        ``logprobs_mode``, through the same steps 1-8 as :meth:`sample`.

        logits: (B, V) float32; token_ids: (B,) int64. Returns (B,) float32, bitwise
        equal to the ``logprobs`` that :meth:`sample` reported for the same inputs.
        """
        token_ids = self._check_ids("token_ids", token_ids, batch, vocab=True)
        prep = self._prepare(logits, batch)
        B = len(batch)
        if B == 0:
            return torch.empty((0,), dtype=torch.float32, device=batch.device)
        valid = (prep.status & STATUS_NO_VALID_TOKEN) == 0
        greedy_tok = draw_ops.greedy_argmax(prep.x)
        sampling = ((~batch.greedy) & valid).nonzero().flatten()
        if "processed" in batch.flags.modes and sampling.numel():
            self._analyse(prep, batch, sampling, None)
        tokens = torch.where(valid, token_ids, torch.full_like(token_ids, -1))
        tokens = torch.where(valid, token_ids, torch.full_like(token_ids, -1))
        return self._token_logprobs(prep, batch, tokens, greedy_tok)
