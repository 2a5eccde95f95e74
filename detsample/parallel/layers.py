"""The Megatron layers of a tensor-parallel model, one rank's part of each.

* column-parallel (q/k/v, gate/up): a plain ``nn.Linear`` holding this rank's rows of the
  weight (output features). No collective: its outputs stay sharded (heads, intermediate
  features). Under the portable mode each output element is a function of its row of the
  activations and its column of the weight only, so a shard's elements are TP=1's.
* :class:`RowParallelLinear` (o_proj, down_proj): this rank's columns (input features) of
  the weight, fed the matching shard of the activations; the partial products are combined
  into the full output on every rank. Under ``batch_invariant(portable=True)``: the exact
  split-K product (:func:`detsample.invariant.sharded.split_k_matmul`, global scales,
  int64 sum of the exact partial sums, one combine): TP=1's bits. With torch's default
  kernels: ``F.linear`` per rank and a floating-point all-reduce (the order of the
  backend): not TP=1's bits. Under the verified (non-portable) mode: refused
  (:class:`TensorParallelError`): its kernels' bits are a BLAS's, which depend on K.
* :class:`VocabParallelEmbedding`: this rank's rows of the (padded) table; a token's row
  comes from its owner exactly (:func:`~detsample.invariant.sharded.owner_rows`).
* :class:`VocabParallelHead`: this rank's rows of ``lm_head`` over the padded vocabulary
  (a column-parallel product), the logit shards concatenated in rank order on every rank
  (:func:`~detsample.invariant.sharded.concat_last`) and cut to the real vocabulary: the
  full ``[.., V]`` logits.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from detsample.invariant import is_enabled
from detsample.invariant.sharded import concat_last, owner_rows, split_k_fixed_b, split_k_matmul
from detsample.invariant.state import config
from detsample.models.base import ModelError
from detsample.parallel.comm import Comm


class TensorParallelError(ModelError):
    """A model or a configuration the tensor-parallel runner refuses (named, with why)."""


VERIFIED_REFUSED = (
    "tensor parallelism under the batch-invariant mode needs its portable "
    "kernels (portable=True, --portable): the verified kernels are a BLAS's, "
    "whose bits depend on the K a rank holds, so a row-parallel split cannot "
    "give TP=1's bits (docs/tensor-parallel.md)"
)


def padded_rows(t: torch.Tensor, rows: slice) -> torch.Tensor:
    """Rows ``rows`` of ``t`` (a copy); the rows of ``rows`` past ``len(t)`` (a padded
    vocabulary's) are zeros, as vLLM's weight loader leaves them."""
    part = t.detach()[rows].clone()
    missing = (rows.stop - rows.start) - part.shape[0]
    if missing <= 0:
        return part
    return torch.cat([part, part.new_zeros((missing,) + tuple(part.shape[1:]))])


def filled(module: torch.nn.Module, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.nn.Module:
    """``module`` (a new layer) with ``weight`` and ``bias`` copied in, frozen."""
    with torch.no_grad():
        module.weight.copy_(weight)
        if bias is not None:
            module.bias.copy_(bias)
    return module.requires_grad_(False)


def column_shard(linear: torch.nn.Linear, rows: slice | list[slice]) -> torch.nn.Linear:
    """A new ``nn.Linear`` holding ``rows`` of ``linear``'s output features (and bias) --
    one slice, or several concatenated in order; rows past its features (a padded
    vocabulary) are zeros."""
    parts = rows if isinstance(rows, list) else [rows]
    w = torch.cat([padded_rows(linear.weight, p) for p in parts])
    bias = None if linear.bias is None else torch.cat([padded_rows(linear.bias, p) for p in parts])
    out = torch.nn.Linear(w.shape[1], w.shape[0], bias=bias is not None, device=w.device, dtype=w.dtype)
    return filled(out, w, bias)


def _fused_bias(x: torch.Tensor) -> bool:
    """Whether ``F.linear(x, w, bias)`` adds the bias inside the product (aten ``addmm``:
    before the result is rounded to the model's dtype) rather than after (``matmul`` then
    ``add``): aten's rule for 2-D input and contiguous 3-D input."""
    return x.dim() == 2 or (x.dim() == 3 and x.is_contiguous())


class RowParallelLinear(torch.nn.Module):
    """This rank's ``cols`` (input features) of ``linear``; output: the full features on
    every rank (see the module docstring for the combine). ``in_features`` is the shard's."""

    def __init__(self, linear: torch.nn.Linear, cols: slice, comm: Comm) -> None:
        super().__init__()
        w = linear.weight.detach()[:, cols].clone()
        self.weight = torch.nn.Parameter(w, requires_grad=False)
        self.bias = (
            None if linear.bias is None else torch.nn.Parameter(linear.bias.detach().clone(), requires_grad=False)
        )
        self.in_features, self.out_features = w.shape[1], w.shape[0]
        self.comm = comm
        self._fixed: tuple | None = None

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features} (rank {self.comm.rank} of {self.comm.world}), "
            f"out_features={self.out_features}, bias={self.bias is not None}"
        )

    def _fixed_b(self):
        """This rank's weight prepared for the portable split product, with the whole
        weight's non-finite flags (a collective; kept until the weight changes)."""
        key = (self.weight._version, self.weight.dtype)
        if self._fixed is None or self._fixed[0] != key:
            b = self.weight.t().to(torch.float32)
            self._fixed = (key, split_k_fixed_b(b, self.comm.reduce))
        return self._fixed[1]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lead = x.shape[:-1]
        if is_enabled() and config().portable:
            a = x.reshape(-1, x.shape[-1])
            c = split_k_matmul(a, self._fixed_b(), self.comm.reduce)
            if self.bias is None:
                out = c.to(x.dtype)
            elif _fused_bias(x):
                out = torch.add(self.bias.to(torch.float32), c).to(x.dtype)
            else:
                out = c.to(x.dtype) + self.bias
            return out.reshape(*lead, self.out_features)
        if is_enabled():
            raise TensorParallelError(VERIFIED_REFUSED)
        part = F.linear(x, self.weight)
        self.comm.float_sum_(part)
        return part if self.bias is None else part + self.bias


class VocabParallelEmbedding(torch.nn.Module):
    """This rank's rows ``[lo, lo + n)`` of the padded embedding table (rows past the
    vocabulary: zeros, never looked up); output: every token's row (bitwise the
    table's), on every rank."""

    def __init__(self, embedding: torch.nn.Embedding, rows: slice, comm: Comm) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(padded_rows(embedding.weight, rows), requires_grad=False)
        self.lo = rows.start
        self.num_embeddings = embedding.num_embeddings
        self.embedding_dim = embedding.embedding_dim
        self.comm = comm

    def extra_repr(self) -> str:
        return f"rows [{self.lo}, {self.lo + self.weight.shape[0]}) of {self.num_embeddings}, dim {self.embedding_dim}"

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return owner_rows(ids, self.weight, self.lo, self.comm.reduce)


class VocabParallelHead(torch.nn.Module):
    """This rank's rows of ``lm_head`` over the padded vocabulary (a column-parallel
    product; padding rows are zeros); output: the full logits, the shards concatenated
    in rank order and **cut to the ``vocab`` real columns**, on every rank: a padded
    column never reaches the sampler or a logprob's normalisation."""

    def __init__(self, linear: torch.nn.Linear, rows: slice, comm: Comm, vocab: int) -> None:
        super().__init__()
        self.shard = column_shard(linear, rows)
        self.comm = comm
        self.vocab = vocab

    def extra_repr(self) -> str:
        return f"vocab={self.vocab} (rank {self.comm.rank} of {self.comm.world})"

    @property
    def weight(self) -> torch.nn.Parameter:
        return self.shard.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        full = concat_last(self.shard(x), self.comm.reduce)
        return full if full.shape[-1] == self.vocab else full[..., : self.vocab].contiguous()
