"""``Sampler(deterministic=False)``: the fast mode. Statistically correct, NOT batch
invariant: one torch.Generator per call seeded from the batch's seeds and positions,
a bounded ``topk`` when every row has a top_k, float32 softmax, exponential race."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from detsample.ops import draw as draw_ops
from detsample.ops import logprobs as lp_ops
from detsample.ops.sanitize import STATUS_NO_VALID_TOKEN

if TYPE_CHECKING:  # pragma: no cover
    from detsample.batch import SamplingBatch
    from detsample.sampler import Sampler, SampleOutput, _Prepared


def _generator(batch: "SamplingBatch", positions: torch.Tensor) -> torch.Generator:
    mix = int(((batch.seeds * 1000003) ^ positions).sum()) & (2**63 - 1)
    g = torch.Generator(device=batch.device)
    g.manual_seed(mix)
    return g


def sample_fast(sampler: "Sampler", prep: "_Prepared", batch: "SamplingBatch",
                positions: torch.Tensor) -> "SampleOutput":
    from detsample.sampler import SampleOutput  # circular at import time

    x = prep.x
    valid = (prep.status & STATUS_NO_VALID_TOKEN) == 0
    greedy_tok = draw_ops.greedy_argmax(x)
    tokens = greedy_tok.clone()
    flags = batch.flags
    if not flags.is_all_greedy:
        z = sampler._scaled(prep, batch)
        if not (flags.need_top_k or flags.need_top_p):
            vals, ids = z, None  # no ranking filter: race over the whole vocabulary
        elif flags.max_top_k is not None:
            vals, ids = torch.topk(z, flags.max_top_k, dim=-1)
        else:
            vals, ids = torch.sort(z, dim=-1, descending=True)
        if ids is not None:
            pos = torch.arange(vals.shape[1], device=z.device).unsqueeze(0)
            vals = vals.masked_fill(pos >= batch.top_ks.unsqueeze(1).long(), float("-inf"))
        probs = torch.softmax(vals, dim=-1)
        if flags.need_top_p:
            excl = probs.cumsum(-1) - probs
            probs = probs.masked_fill(excl >= batch.top_ps.unsqueeze(1).float(), 0.0)
        if flags.need_min_p:
            pmax = probs.amax(-1, keepdim=True)
            probs = probs.masked_fill(probs < pmax * batch.min_ps.unsqueeze(1), 0.0)
        noise = torch.empty_like(probs).exponential_(generator=_generator(batch, positions))
        pick = (probs / noise).argmax(-1)
        if ids is not None:
            pick = ids.gather(1, pick.unsqueeze(1)).squeeze(1)
        tokens = torch.where(batch.greedy, greedy_tok, pick)
    tokens = torch.where(valid, tokens, torch.full_like(tokens, -1))
    lp = lp_ops.gather_rows(lp_ops.log_softmax_rows(prep.raw), tokens.clamp(min=0))
    lp = torch.where(valid, lp, torch.full_like(lp, float("-inf")))
    return SampleOutput(token_ids=tokens, logprobs=lp, top_logprobs=None,
                        seeds=batch.seeds.clone(), status=prep.status)
