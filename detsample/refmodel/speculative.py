"""Speculative decoding that changes no bit: draft proposers and the acceptance rule.

A proposer guesses up to ``k`` next tokens of each running row; the engine feeds the
row's last token and the drafts in ONE forward of the target (a chunk of ``k + 1``
tokens on the row's KV cache) and samples each position with the target's own sampler,
batch state and ``(seed, position)``, in order. A draft is accepted while it equals the
token that draw gives; the first draw that differs is kept in its place (or, when every
draft was accepted, the draw after the last one), and the batch state of the rejected
positions is rolled back (:meth:`SamplingBatch.rollback`). Every kept token is therefore
the token the plain run draws at that position from the same state.

What it rests on: the target gives a position the same logits bits whether it is
computed by decode (one token) or inside a chunk of ``k + 1`` tokens (the reference
model by its integer arithmetic; a float model under the batch-invariant mode); a model
without that property gives other bits, and the run's tokens or logprobs then differ from
the plain run's (tests/refmodel/test_speculative.py shows it).

Proposers: :class:`NGram` (prompt lookup: the tokens that followed the latest earlier
occurrence of the row's last ``n`` tokens) and :class:`DraftModel` (any model adapter
with the target's vocabulary size, sampling each row with the row's own parameters and
seed, so a draft close to the target agrees often).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from detsample.batch import SamplingBatch
from detsample.errors import InvalidSamplingParams
from detsample.params import Request
from detsample.refmodel.tokenizer import EOS_ID
from detsample.sampler import Sampler
from detsample.vocab import DEFAULT_VOCAB_SIZE, Vocabulary


@dataclass(frozen=True)
class DraftRow:
    """One running row as a proposer sees it: ``sequence`` is the prompt (with the
    request's initial output) followed by the generated tokens; ``generated`` the
    tokens the engine sampled so far; ``limit`` the most drafts the row can take."""

    request: Request
    sequence: tuple[int, ...]
    generated: tuple[int, ...]
    limit: int


class Proposer(Protocol):
    """Guesses the next tokens of rows: ``propose(rows)`` returns, per row, at most
    ``rows[i].limit`` token ids (fewer, or none, when it has no guess)."""

    def propose(self, rows: Sequence[DraftRow]) -> list[list[int]]: ...


@dataclass(frozen=True)
class Speculative:
    """Speculative decoding of an engine: ``proposer`` and the drafts per step ``k``."""

    proposer: Any
    num_speculative_tokens: int

    def __post_init__(self) -> None:
        k = self.num_speculative_tokens
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise InvalidSamplingParams(f"num_speculative_tokens must be an int >= 1, got {k!r}")
        if not callable(getattr(self.proposer, "propose", None)):
            raise InvalidSamplingParams(
                f"proposer must have a propose(rows) method, got {type(self.proposer).__name__}"
            )


@dataclass
class SpecStats:
    """Counts of one run: verification steps, drafted tokens and accepted ones."""

    steps: int = 0
    proposed: int = 0
    accepted: int = 0
    emitted: int = 0

    @property
    def acceptance_rate(self) -> float:
        """Accepted drafts / proposed drafts (0.0 when nothing was proposed)."""
        return self.accepted / self.proposed if self.proposed else 0.0

    def as_dict(self) -> dict[str, float]:
        return {
            "steps": self.steps,
            "proposed": self.proposed,
            "accepted": self.accepted,
            "emitted": self.emitted,
            "acceptance_rate": self.acceptance_rate,
        }


def check_drafts(drafts: Sequence[Sequence[int]], rows: Sequence[DraftRow], vocab_size: int) -> list[list[int]]:
    """The proposer's answer as lists of ints, checked (errors name the row)."""
    if len(drafts) != len(rows):
        raise InvalidSamplingParams(f"proposer returned {len(drafts)} draft lists for {len(rows)} rows")
    out = []
    for i, (d, row) in enumerate(zip(drafts, rows)):
        ids = [int(t) for t in d]
        if len(ids) > row.limit:
            raise InvalidSamplingParams(
                f"proposer: row {i} ({row.request.rid!r}) got {len(ids)} drafts, more than its limit {row.limit}"
            )
        bad = [t for t in ids if not 0 <= t < vocab_size]
        if bad:
            raise InvalidSamplingParams(
                f"proposer: row {i} ({row.request.rid!r}) draft token {bad[0]} outside [0, {vocab_size})"
            )
        out.append(ids)
    return out


@dataclass(frozen=True)
class NGram:
    """Prompt-lookup proposer: for n from ``max_n`` down to ``min_n``, the tokens that
    followed the latest earlier occurrence of the sequence's last n tokens."""

    max_n: int = 3
    min_n: int = 1

    def __post_init__(self) -> None:
        for name in ("max_n", "min_n"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise InvalidSamplingParams(f"{name} must be an int >= 1, got {v!r}")
        if self.min_n > self.max_n:
            raise InvalidSamplingParams(f"min_n must be <= max_n, got {self.min_n} > {self.max_n}")

    def propose(self, rows: Sequence[DraftRow]) -> list[list[int]]:
        return [self._one(list(r.sequence), r.limit) if r.limit else [] for r in rows]

    def _one(self, seq: list[int], k: int) -> list[int]:
        for n in range(min(self.max_n, len(seq) - 1), self.min_n - 1, -1):
            tail = seq[-n:]
            for start in range(len(seq) - n - 1, -1, -1):
                if seq[start : start + n] == tail:
                    return seq[start + n : start + n + k]
        return []


@dataclass
class _DraftState:
    cache: Any
    batch: SamplingBatch


@dataclass
class DraftModel:
    """A draft model (any model adapter whose vocabulary size is the target's): each row
    is sampled with its own request's parameters and seed on a one-row batch that follows
    the row's generated tokens (rolled back to them before each proposal). ``vocab``
    (grammar rows) defaults to the default vocabulary when the model has its 512 tokens;
    ``eos_token_ids`` and ``think_end_token_id`` should be the engine's (min_new_tokens;
    ``require_reasoning`` grammars). None of them can change a kept token: they only make
    the drafts agree more or less often."""

    model: Any
    sampler: Sampler = field(default_factory=Sampler)
    eos_token_ids: tuple[int, ...] = (EOS_ID,)
    vocab: Any = None
    think_end_token_id: int | None = None
    _states: dict[str, _DraftState] = field(default_factory=dict, repr=False)

    def propose(self, rows: Sequence[DraftRow]) -> list[list[int]]:
        live = {r.request.rid for r in rows}
        for rid in [rid for rid in self._states if rid not in live]:
            del self._states[rid]  # finished rows
        states = [self._sync(r) for r in rows]
        drafts: list[list[int]] = [[] for _ in rows]
        for j in range(max((r.limit for r in rows), default=0)):
            act = [
                i
                for i, r in enumerate(rows)
                if r.limit > j and (j == 0 or drafts[i][-1:] != [-1]) and len(drafts[i]) == j
            ]
            if not act:
                break
            feeds = [list(rows[i].sequence[len(states[i].cache) :]) if j == 0 else [drafts[i][-1]] for i in act]
            outs = self.model.forward([states[i].cache for i in act], feeds)
            for i, o in zip(act, outs):
                self._draw(states[i], o[-1:], drafts[i])
        return [[t for t in d if t >= 0] for d in drafts]

    def _draw(self, state: _DraftState, logits, draft: list[int]) -> None:
        import torch

        pos = torch.tensor([len(state.cache) - 1], dtype=torch.int64)
        t = int(self.sampler.sample(logits.contiguous(), state.batch, pos).token_ids[0])
        if t >= 0 and state.batch.finished[0] is None:
            state.batch.advance([t])
        draft.append(t if t >= 0 else -1)

    def _sync(self, row: DraftRow) -> _DraftState:
        """The row's draft state, rolled back to the engine's tokens and fed the rest."""
        st = self._states.get(row.request.rid)
        if st is None:
            if self.vocab is None and self.model.vocab_size == DEFAULT_VOCAB_SIZE:
                self.vocab = Vocabulary.default()
            batch = SamplingBatch.from_requests(
                [row.request],
                vocab_size=self.model.vocab_size,
                eos_token_ids=self.eos_token_ids,
                vocab=self.vocab,
                think_end_token_id=self.think_end_token_id,
            )
            st = self._states[row.request.rid] = _DraftState(self.model.new_cache(), batch)
        seq = list(row.sequence)
        st.cache.truncate(min(_common(st.cache.token_ids, seq), len(seq) - 1))
        journal = [t for t, _, _ in st.batch.journal[0]]
        c = _common(journal, list(row.generated))
        st.batch.rollback([len(journal) - c])
        for t in row.generated[c:]:
            st.batch.advance([t])
        return st


def _common(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def check_draft_model(target: Any, draft: Any) -> None:
    """InvalidSamplingParams unless the draft can propose for the target."""
    if draft.vocab_size != target.vocab_size:
        raise InvalidSamplingParams(
            f"draft model has vocab_size={draft.vocab_size}, the target {target.vocab_size}: they must be equal"
        )
    check_truncatable(draft, "draft model")


def check_truncatable(model: Any, what: str) -> None:
    """Speculative decoding drops rejected tokens from caches: ``cache.truncate(n)``."""
    cache = model.new_cache()
    why = (
        ""
        if not callable(getattr(cache, "truncate", None))
        else "; its caches keep state beside keys and values (a hybrid's recurrent states), which cannot go back"
        if not getattr(cache, "truncatable", True)
        else None
    )
    if why is not None:
        raise InvalidSamplingParams(
            f"{what} {getattr(model, 'name', type(model).__name__)!r}: "
            f"speculative decoding needs caches with truncate(n){why}"
        )
