"""Checks over engine results: bitwise alignment with rescoring and batch invariance.

Each function returns a list of :class:`Mismatch` (empty = the guarantee held), naming
the request, the generated position and the token, so a report can point at the first
divergence. Comparisons are on bits (float32 viewed as int32): -0.0 vs 0.0 and NaN
payloads count as differences.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from detsample.params import Request
from detsample.refmodel.engine import Engine, EngineResult, RequestResult, rescore, with_mode
from detsample.refmodel.schedule import Schedule
from detsample.sampler import Sampler


@dataclass(frozen=True)
class Mismatch:
    """One broken guarantee: ``check`` is "alignment" or "invariance"."""

    check: str
    rid: str
    position: int | None
    token: int | None
    detail: str

    def __str__(self) -> str:
        at = "" if self.position is None else f" at generated position {self.position}"
        tok = "" if self.token is None else f" (token {self.token})"
        return f"{self.check}: request {self.rid!r}{at}{tok}: {self.detail}"


def float_bits(t: torch.Tensor) -> torch.Tensor:
    """float32 tensor -> its int32 bit patterns (other dtypes unchanged)."""
    t = t.contiguous()
    return t.view(torch.int32) if t.dtype == torch.float32 else t


def _first_bit_diff(a: torch.Tensor, b: torch.Tensor) -> int | None:
    if a.shape != b.shape:
        return 0
    ne = float_bits(a) != float_bits(b)
    if ne.dim() > 1:
        ne = ne.flatten(1).any(1)
    idx = ne.nonzero().flatten()
    return int(idx[0]) if idx.numel() else None


def result_diff(a: RequestResult, b: RequestResult) -> Mismatch | None:
    """First difference between two results of the same request (tokens, bits, seed...)."""
    for name in ("rid", "prompt_ids", "seed"):
        if getattr(a, name) != getattr(b, name):
            return Mismatch("invariance", a.rid, None, None, f"{name} {getattr(a, name)!r} != {getattr(b, name)!r}")
    n = min(len(a.token_ids), len(b.token_ids))
    for i in range(n):
        if a.token_ids[i] != b.token_ids[i]:
            return Mismatch("invariance", a.rid, i, a.token_ids[i], f"token {a.token_ids[i]} != {b.token_ids[i]}")
    if len(a.token_ids) != len(b.token_ids) or a.finish_reason != b.finish_reason:
        return Mismatch(
            "invariance",
            a.rid,
            n,
            None,
            f"{len(a.token_ids)} tokens ({a.finish_reason}) != {len(b.token_ids)} tokens ({b.finish_reason})",
        )
    if a.logprobs.keys() != b.logprobs.keys():
        return Mismatch("invariance", a.rid, None, None, f"logprob modes {sorted(a.logprobs)} != {sorted(b.logprobs)}")
    for mode in sorted(a.logprobs):
        i = _first_bit_diff(a.logprobs[mode], b.logprobs[mode])
        if i is not None:
            return Mismatch(
                "invariance",
                a.rid,
                i,
                a.token_ids[i] if a.token_ids else None,
                f"{mode} logprob {float(a.logprobs[mode][i])!r} != {float(b.logprobs[mode][i])!r} (bits differ)",
            )
    if (a.top_logprobs is None) != (b.top_logprobs is None):
        return Mismatch("invariance", a.rid, None, None, "top_logprobs present in one only")
    if a.top_logprobs is not None:
        for part, x, y in zip(("values", "ids"), a.top_logprobs, b.top_logprobs):
            i = _first_bit_diff(x, y)
            if i is not None:
                return Mismatch("invariance", a.rid, i, a.token_ids[i], f"top_logprobs {part} differ")
    return None


def alignment_mismatches(
    model: Any, sampler: Sampler, requests: Sequence[Request], result: EngineResult, vocab: Any = None
) -> list[Mismatch]:
    """Every mode each result reports == :func:`rescore` of its tokens, at every position.

    ``vocab``: the grammar vocabulary the engine used (None: the default one)."""
    out = []
    for r in requests:
        res = result[r.rid]
        prompt = list(r.prompt_ids)
        output = list(r.output_ids) + list(res.token_ids)
        skip = len(r.output_ids)
        for mode, got in sorted(res.logprobs.items()):
            p = r.params if mode == r.params.logprobs_mode else with_mode(r.params, mode)
            want = rescore(model, sampler, p, prompt, output, vocab=vocab)[skip:]
            i = _first_bit_diff(got, want)
            if i is not None:
                out.append(
                    Mismatch(
                        "alignment",
                        r.rid,
                        i,
                        res.token_ids[i],
                        f"{mode} logprob at sampling {float(got[i])!r} != rescored {float(want[i])!r}",
                    )
                )
    return out


def invariance_mismatches(engine: Engine, schedule: Schedule, result: EngineResult | None = None) -> list[Mismatch]:
    """Each request of ``schedule`` run alone == its result inside ``schedule``."""
    result = result if result is not None else engine.run(schedule)
    out = []
    for a in schedule.arrivals:
        alone = engine.run(Schedule.of([(0, a.request)]))[a.request.rid]
        d = result_diff(result[a.request.rid], alone)
        if d is not None:
            out.append(d)
    return out
