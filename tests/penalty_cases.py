"""Shared builders for the penalty and constraint tests: random requests using penalties, token
constraints and processors, and deterministic per-(request, step) logits."""

from __future__ import annotations

import zlib

import torch
from hypothesis import strategies as st

from detsample import Request, SamplingParams
from detsample.processors.base import SlotProcessor

V = 40
EOS = (0,)


def logits_for(rid: str, step: int, vocab: int = V) -> torch.Tensor:
    """(V,) float32 logits that depend only on (request id, step index)."""
    g = torch.Generator().manual_seed(zlib.crc32(f"{rid}/{step}".encode()))
    return torch.randn((vocab,), generator=g) * 2.0


class ScaleEvenTokens:
    """A per-request processor (grouped by identity): halves even-token logits and
    counts its calls, so tests can check it runs once per step for all its rows."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, logits, rows):
        self.calls += 1
        out = logits.clone()
        out[:, 0::2] *= 0.5
        return out


class PenalizeLastToken(SlotProcessor):
    """A stateful batch-level test processor: subtracts 1.5 from the logit of the row's
    last output token (reads the live ``output_ids_ref``). Not argmax invariant."""

    def is_argmax_invariant(self) -> bool:
        return False

    def make_entry(self, added):
        return (added.params.seed, added.output_ids_ref)

    def apply(self, logits):
        for i, (_, out) in enumerate(self.slots):
            if out:
                logits[i, out[-1]] -= 1.5
        return logits


SHARED_PROC = ScaleEvenTokens()

token = st.integers(0, V - 1)


@st.composite
def params_st(draw, seed: int) -> SamplingParams:
    kw = {"seed": seed}
    if draw(st.booleans()):
        kw["temperature"] = 0.0
    else:
        kw["temperature"] = draw(st.sampled_from([0.5, 1.0, 1.7]))
        kw["top_k"] = draw(st.sampled_from([-1, 5]))
        kw["min_p"] = draw(st.sampled_from([0.0, 0.05]))
    if draw(st.booleans()):
        kw["frequency_penalty"] = draw(st.sampled_from([0.0, 0.4, -0.3]))
        kw["presence_penalty"] = draw(st.sampled_from([0.0, 0.8]))
        kw["repetition_penalty"] = draw(st.sampled_from([1.0, 1.3, 0.8]))
    if draw(st.booleans()):
        kw["min_new_tokens"] = draw(st.integers(0, 4))
        kw["stop_token_ids"] = tuple(draw(st.lists(token, max_size=2)))
    if draw(st.integers(0, 3)) == 0:
        kw["allowed_token_ids"] = tuple(draw(st.lists(token, min_size=1, max_size=8)))
    if draw(st.integers(0, 2)) == 0:
        kw["bad_words"] = tuple(
            tuple(s) for s in draw(st.lists(st.lists(token, min_size=1, max_size=3), min_size=1, max_size=3))
        )
    if draw(st.integers(0, 2)) == 0:
        kw["logits_processor"] = SHARED_PROC
    kw["logprobs_mode"] = draw(st.sampled_from(["raw", "scaled", "processed"]))
    return SamplingParams(**kw)


@st.composite
def request_st(draw, i: int) -> Request:
    return Request(
        rid=f"r{i}",
        params=draw(params_st(seed=1000 + i)),
        prompt_ids=draw(st.lists(token, max_size=6)),
        output_ids=draw(st.lists(token, max_size=3)),
    )


class LowerNonMax(SlotProcessor):
    """An argmax-invariant test processor that touches EVERY row: subtracts 0.25 from all
    but the maximal logits. Skipped when all rows are greedy, so the Sampler must keep
    it off greedy rows in mixed batches too, or greedy rows' logprobs would depend on
    their neighbours."""

    def is_argmax_invariant(self) -> bool:
        return True

    def make_entry(self, added):
        return added.params.seed

    def apply(self, logits):
        m = logits.amax(dim=-1, keepdim=True)
        return torch.where(logits == m, logits, logits - 0.25)
