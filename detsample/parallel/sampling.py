"""The sampler on vocab-sharded logits: the single-rank sampler's tokens and logprobs, bitwise.

Each rank of a vocab-parallel head holds the logits of its vocabulary rows ``[.., V/tp]``
(rank ``r``: tokens ``[r V/tp, (r+1) V/tp)``). :func:`gather_logits` concatenates the
shards in rank order (:func:`detsample.invariant.sharded.concat_last`: a copy, exact), so
every rank holds the bits of the full ``[B, V]`` logits; :func:`sample_sharded` and
:func:`compute_logprobs_sharded` then run the ordinary :class:`detsample.Sampler` on them,
on every rank.

How the log_softmax bits are obtained: by the sampler's own ``log_softmax`` on the full
row, the same function on the same bits as at TP=1, so token ids, logprobs and top
logprobs are TP=1's by construction (and the sampler's guarantees: batch invariance,
seeded draws keyed by (seed, position, token id), carry over unchanged). Every rank
computes the same outcome, so the ranks never need to agree on a token by message.

The cost is one all-gather of ``B x V`` floats per step; a reduction of per-rank
partial masses would move less data but would have to reproduce the sampler's exact
reductions across ranks, which this module does not attempt.
"""

from __future__ import annotations

from typing import Any

import torch

from detsample.invariant.sharded import concat_last
from detsample.parallel.comm import Comm


def gather_logits(shard: torch.Tensor, comm: Comm) -> torch.Tensor:
    """``[B, V/tp]`` on every rank -> the full ``[B, V]`` logits on every rank (exact)."""
    return concat_last(shard, comm.reduce)


def sample_sharded(sampler: Any, shard: torch.Tensor, batch: Any, positions: torch.Tensor, comm: Comm) -> Any:
    """``sampler.sample`` on the gathered logits: the single-rank output, on every rank."""
    return sampler.sample(gather_logits(shard, comm), batch, positions)


def compute_logprobs_sharded(
    sampler: Any, shard: torch.Tensor, batch: Any, token_ids: torch.Tensor, comm: Comm
) -> torch.Tensor:
    """``sampler.compute_logprobs`` (the rescoring path) on the gathered logits."""
    return sampler.compute_logprobs(gather_logits(shard, comm), batch, token_ids)
