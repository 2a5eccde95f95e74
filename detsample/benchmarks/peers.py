"""The peers' CPU sampling algorithms, re-created in plain torch for side-by-side timings.

For comparison only: nothing in detsample calls these. Each function samples one token
per row from ``(B, V)`` float32 logits and returns ``(token_ids (B,) int64, logprob of
the chosen token (B,) float32)``, the work detsample's ``Sampler.sample`` does; none is
batch-invariant. The algorithms follow the peers' code paths (read from their sources):

* **SGLang deterministic** (``enable_deterministic_inference``, the PyTorch sampling
  backend): ``softmax(logits / T)``; without filters, Gumbel-max over ``log(probs)`` with
  a MurmurHash3 of ``(seed, position, column)`` turned into float64 Gumbel noise
  (``multinomial_with_seed``, which SGLang wraps in ``torch.compile``); with top-k / top-p
  / min-p, a full descending sort of the probabilities, cumsum masks, then the same
  seeded Gumbel-max over the sorted, masked ``log`` probabilities. Logprob: ``log`` of the
  chosen token's probability.
* **SGLang shortcut** (not reproducible; the FlashInfer-style path re-created on CPU):
  when every row has a top-k, a bounded ``topk`` of ``max(top_k)`` probabilities then the
  top-p / min-p masks inside it (the "top-k shortcut"), else the full sort; unseeded
  ``torch.multinomial``.
* **vLLM seeded** (v1 ``TopKTopPSampler.forward_native`` with per-request generators):
  raw logprobs by ``log_softmax`` first; ``logits / T``; min-p on the softmax; top-k only
  by a bounded ``topk`` threshold (``apply_top_k_only``), any top-p by a full ascending
  sort, cumsum mask and scatter back; ``softmax``; exponential race
  ``argmax(probs / q)`` with ``q`` drawn row by row from each request's own
  ``torch.Generator``.
* **vLLM unseeded** (not reproducible): the same filters, one ``exponential_()`` draw for
  the whole batch (the exponential race).
* **greedy**: ``argmax`` plus the ``log_softmax`` of the chosen token (both peers).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

MASK32 = 0xFFFFFFFF
UINT32_MAX = float(2**32 - 1)


@dataclass
class PeerBatch:
    """The per-row state a peer keeps for a batch (built once, like their batch info).

    temperatures: (B, 1) float32 (0 = greedy); top_ks: (B,) int64 (V = disabled);
    top_ps: (B,) float32 (1 = disabled); min_ps: (B,) float32; seeds: (B,) int64;
    positions: (B,) int64; generators: one ``torch.Generator`` per row (vLLM seeded).
    """

    temperatures: torch.Tensor
    top_ks: torch.Tensor
    top_ps: torch.Tensor
    min_ps: torch.Tensor
    seeds: torch.Tensor
    positions: torch.Tensor
    generators: list[torch.Generator] = field(default_factory=list)

    @staticmethod
    def of(params: list, positions: torch.Tensor, vocab_size: int) -> PeerBatch:
        t = torch.tensor([[p.temperature] for p in params], dtype=torch.float32)
        ks = torch.tensor(
            [vocab_size if p.top_k == -1 else min(p.top_k, vocab_size) for p in params], dtype=torch.int64
        )
        gens = [torch.Generator().manual_seed(int(p.seed)) for p in params]
        return PeerBatch(
            t,
            ks,
            torch.tensor([p.top_p for p in params], dtype=torch.float32),
            torch.tensor([p.min_p for p in params], dtype=torch.float32),
            torch.tensor([p.seed for p in params], dtype=torch.int64),
            positions.to(torch.int64),
            gens,
        )

    @property
    def all_greedy(self) -> bool:
        return bool((self.temperatures == 0).all())

    def need(self, vocab_size: int) -> tuple[bool, bool, bool]:
        """(top-k, top-p, min-p) needed by some row."""
        return (bool((self.top_ks < vocab_size).any()), bool((self.top_ps < 1).any()), bool((self.min_ps > 0).any()))


# -- greedy -------------------------------------------------------------------------


def greedy(logits: torch.Tensor, batch: PeerBatch) -> tuple[torch.Tensor, torch.Tensor]:
    """Both peers' all-greedy batch: argmax and the log_softmax of the chosen token."""
    tok = torch.argmax(logits, -1)
    lp = torch.log_softmax(logits, -1).gather(1, tok.unsqueeze(1)).squeeze(1)
    return tok, lp


# -- SGLang ---------------------------------------------------------------------------


def _rotl(x: torch.Tensor, r: int) -> torch.Tensor:
    return ((x << r) | (x >> (32 - r))) & MASK32


def _murmur3_mix(h: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    k = (k * 0xCC9E2D51) & MASK32
    k = _rotl(k, 15)
    k = (k * 0x1B873593) & MASK32
    h = h ^ k
    h = _rotl(h, 13)
    return (h * 5 + 0xE6546B64) & MASK32


def murmur_hash32(seeds: torch.Tensor, positions: torch.Tensor, cols: int) -> torch.Tensor:
    """SGLang's MurmurHash3 of (seed low, seed high, position, column): (B, cols) uint32
    values held in int64 (products of uint32 values wrap exactly in int64)."""
    s = seeds.to(torch.int64).unsqueeze(1)
    h = torch.zeros_like(s)
    h = _murmur3_mix(h, s & MASK32)
    h = _murmur3_mix(h, (s >> 32) & MASK32)
    h = _murmur3_mix(h, positions.to(torch.int64).unsqueeze(1) & MASK32)
    h = _murmur3_mix(h, torch.arange(cols, dtype=torch.int64).unsqueeze(0))
    h = h ^ 16
    h = h ^ (h >> 16)
    h = (h * 0x85EBCA6B) & MASK32
    h = h ^ (h >> 13)
    h = (h * 0xC2B2AE35) & MASK32
    return h ^ (h >> 16)


def multinomial_with_seed(logprobs: torch.Tensor, seeds: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """Seeded Gumbel-max in float64 (SGLang's ``multinomial_with_seed``): (B, 1) index."""
    x = murmur_hash32(seeds, positions, logprobs.shape[1]).to(torch.float64) / UINT32_MAX
    x.log_().clamp_(min=torch.finfo(x.dtype).min).neg_()
    x.log_().neg_()
    x.add_(logprobs.to(torch.float64))
    return torch.argmax(x, dim=1, keepdim=True)


def _sorted_masked(probs: torch.Tensor, b: PeerBatch, min_p: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """SGLang's top_k_top_p_min_p_sampling_from_probs_torch masks on a full sort."""
    probs_sort, probs_idx = probs.sort(dim=-1, descending=True)
    probs_sum = torch.cumsum(probs_sort, dim=-1)
    probs_sort[torch.arange(probs.shape[-1]).view(1, -1) >= b.top_ks.view(-1, 1)] = 0.0
    probs_sort[(probs_sum - probs_sort) > b.top_ps.view(-1, 1)] = 0.0
    if min_p:
        probs_sort[probs_sort < (probs_sort[:, 0] * b.min_ps).view(-1, 1)] = 0.0
    return probs_sort, probs_idx


def _sglang(logits: torch.Tensor, b: PeerBatch, draw: Callable) -> tuple[torch.Tensor, torch.Tensor]:
    """SGLang's sampling step: greedy batches apart, ``softmax(logits / T)``, then
    ``draw(probs, V, (need top-k, top-p, min-p))``; logprob = log of the chosen prob."""
    if b.all_greedy:
        return greedy(logits, b)
    V = logits.shape[1]
    probs = torch.softmax(logits / b.temperatures, dim=-1)
    tok = draw(probs, V, b.need(V))
    return tok, torch.log(probs.gather(1, tok.unsqueeze(1)).squeeze(1))


def sglang_deterministic(
    logits: torch.Tensor, b: PeerBatch, multinomial: Callable = multinomial_with_seed
) -> tuple[torch.Tensor, torch.Tensor]:
    """SGLang with ``enable_deterministic_inference`` (PyTorch backend); ``multinomial``
    may be a ``torch.compile``-d :func:`multinomial_with_seed`, as SGLang runs it."""
    return _sglang(logits, b, lambda probs, V, need: _seeded_draw(probs, b, need, multinomial))


def _seeded_draw(
    probs: torch.Tensor, b: PeerBatch, need: tuple[bool, bool, bool], multinomial: Callable
) -> torch.Tensor:
    k, p, m = need
    if not (k or p or m):
        tok = multinomial(torch.log(probs), b.seeds, b.positions).view(-1)
    else:
        # (SGLang asserts that min-p is not combined with a seed; the algorithm is run
        # anyway so that the min-p configuration has a timing)
        probs_sort, probs_idx = _sorted_masked(probs, b, m)
        idx = multinomial(probs_sort.to(torch.float64).log_(), b.seeds, b.positions)
        tok = probs_idx.gather(1, idx).view(-1)
    return tok


def sglang_shortcut(logits: torch.Tensor, b: PeerBatch) -> tuple[torch.Tensor, torch.Tensor]:
    """SGLang without a seed: the top-k shortcut when every row has a top-k, else the
    full sort; unseeded ``torch.multinomial`` (not reproducible)."""
    return _sglang(logits, b, lambda probs, V, need: _unseeded_draw(probs, b, V, need))


def _unseeded_draw(probs: torch.Tensor, b: PeerBatch, V: int, need: tuple[bool, bool, bool]) -> torch.Tensor:
    k, p, m = need
    if not (k or p or m):
        tok = torch.multinomial(probs, num_samples=1).view(-1)
    elif bool((b.top_ks < V).all()):
        kmax = int(b.top_ks.max())
        vals, ids = torch.topk(probs, kmax, dim=-1)
        vals = vals.masked_fill(torch.arange(kmax).view(1, -1) >= b.top_ks.view(-1, 1), 0.0)
        vals = vals.masked_fill((vals.cumsum(-1) - vals) > b.top_ps.view(-1, 1), 0.0)
        if m:
            vals = vals.masked_fill(vals < (vals[:, :1] * b.min_ps.view(-1, 1)), 0.0)
        tok = ids.gather(1, torch.multinomial(vals, num_samples=1)).view(-1)
    else:
        probs_sort, probs_idx = _sorted_masked(probs, b, m)
        tok = probs_idx.gather(1, torch.multinomial(probs_sort, num_samples=1)).view(-1)
    return tok


# -- vLLM -----------------------------------------------------------------------------


def _vllm_filters(logits: torch.Tensor, b: PeerBatch) -> torch.Tensor:
    """Temperature, min-p, then top-k / top-p as vLLM v1 applies them (new tensor)."""
    V = logits.shape[1]
    temp = torch.where(b.temperatures < 1e-5, torch.ones_like(b.temperatures), b.temperatures)
    logits = logits / temp
    k, p, m = b.need(V)
    if m:  # vLLM's min-p processor: relative to the max probability
        probs = torch.softmax(logits, dim=-1)
        thr = probs.amax(dim=-1, keepdim=True) * b.min_ps.unsqueeze(1)
        logits.masked_fill_(probs < thr, float("-inf"))
    if k and not p:  # apply_top_k_only: no sort
        no_k = b.top_ks == V
        ks = b.top_ks.masked_fill(no_k, 1)
        thr = logits.topk(int(ks.max()), dim=1).values.gather(1, (ks - 1).unsqueeze(1))
        thr.masked_fill_(no_k.unsqueeze(1), float("-inf"))
        return logits.masked_fill_(logits < thr, float("-inf"))
    if p:
        logits_sort, logits_idx = logits.sort(dim=-1, descending=False)
        if k:
            thr = logits_sort.gather(1, (V - b.top_ks).unsqueeze(1))
            logits_sort.masked_fill_(logits_sort < thr, float("-inf"))
        probs_sort = logits_sort.softmax(dim=-1)
        probs_sum = torch.cumsum(probs_sort, dim=-1, out=probs_sort)
        mask = probs_sum <= 1 - b.top_ps.unsqueeze(1)
        mask[:, -1] = False
        logits_sort.masked_fill_(mask, float("-inf"))
        logits = logits.scatter_(dim=-1, index=logits_idx, src=logits_sort)
    return logits


def _vllm(logits: torch.Tensor, b: PeerBatch, seeded: bool) -> tuple[torch.Tensor, torch.Tensor]:
    raw = torch.log_softmax(logits, dim=-1)  # raw logprobs are taken before any processing
    if b.all_greedy:
        tok = logits.argmax(dim=-1)
    else:
        probs = _vllm_filters(logits, b).softmax(dim=-1)
        q = torch.empty_like(probs)
        if seeded:  # one generator per request, row by row
            for i, g in enumerate(b.generators):
                q[i].exponential_(generator=g)
        else:
            q.exponential_()
        tok = probs.div_(q).argmax(dim=-1)
        greedy_rows = b.temperatures.squeeze(1) < 1e-5
        if bool(greedy_rows.any()):
            tok = torch.where(greedy_rows, logits.argmax(dim=-1), tok)
    return tok, raw.gather(1, tok.unsqueeze(1)).squeeze(1)


def vllm_seeded(logits: torch.Tensor, b: PeerBatch) -> tuple[torch.Tensor, torch.Tensor]:
    """vLLM v1 native sampling, every request seeded (per-row generators)."""
    return _vllm(logits, b, seeded=True)


def vllm_unseeded(logits: torch.Tensor, b: PeerBatch) -> tuple[torch.Tensor, torch.Tensor]:
    """vLLM v1 native sampling without seeds: one exponential race for the batch."""
    return _vllm(logits, b, seeded=False)


def compiled_multinomial() -> tuple[Callable, str]:
    """``(multinomial_with_seed compiled by torch.compile, "compiled")`` as SGLang runs
    it, or ``(the eager function, "eager")`` when this platform cannot compile."""
    try:
        fn = torch.compile(multinomial_with_seed, dynamic=True)
        fn(torch.zeros(2, 8, dtype=torch.float64), torch.zeros(2, dtype=torch.int64), torch.zeros(2, dtype=torch.int64))
        return fn, "compiled"
    except Exception:  # noqa: BLE001 - no compiler: the eager twin, labelled as such
        return multinomial_with_seed, "eager"
