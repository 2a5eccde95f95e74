"""Batch-invariant kernels of mixture-of-experts layers: routing and grouped expert products.

An MoE layer routes each token to ``k`` of ``E`` experts and runs each expert on the
tokens routed to it, so the row count of an expert's product is whatever the batch sent
it: the products must be row-invariant (they are: :func:`detsample.invariant.products.product`
tiles every group). What else the mode needs:

* ``topk`` (``aten::topk``): the router's selection. torch leaves the order of equal
  values unspecified; here ties go to the lowest index (a stable sort), so a token's
  experts are a function of its scores alone, ties included (bfloat16 routers tie).
* ``_grouped_mm`` (``aten::_grouped_mm``, what transformers' ``grouped_mm`` experts and
  ``torch.nn.functional.grouped_mm`` reach): rows ``offs[i-1]:offs[i]`` of the 2-D input
  times expert ``i``'s matrix, each group one invariant product; 3-D x 3-D is a batched
  product. Other variants raise :class:`~detsample.invariant.verify.NotInvariantError`.

The combine (``reshape(T, k, H).sum(dim=1)`` or ``index_add_`` in expert order) is the
mode's invariant sum, or exact single additions per call.
"""

from __future__ import annotations

import torch

from detsample.invariant.products import product
from detsample.invariant.state import config
from detsample.invariant.verify import NotInvariantError
from detsample.invariant.weights import owner

aten = torch.ops.aten


def topk(
    self: torch.Tensor, k: int, dim: int = -1, largest: bool = True, sorted: bool = True
) -> tuple[torch.Tensor, torch.Tensor]:
    """aten ``topk``: the ``k`` largest (``largest=False``: smallest) values along ``dim``
    and their indices, ordered by value, **ties by lowest index** (a stable sort; torch's
    own order of ties is unspecified). NaN counts as the largest value, as in torch."""
    if self.dim() == 0:
        return self.clone(), torch.zeros((), dtype=torch.int64, device=self.device)
    n = self.shape[dim]
    if not 0 <= k <= n:
        raise RuntimeError(f"selected index k out of range: k={k}, size {n} along dim {dim}")
    vals = self.new_empty(self.shape)
    idx = torch.empty(self.shape, dtype=torch.int64, device=self.device)
    aten.sort.values_stable(self, stable=True, dim=dim, descending=largest, values=vals, indices=idx)
    return vals.narrow(dim, 0, k).contiguous(), idx.narrow(dim, 0, k).contiguous()


def grouped_mm(
    self: torch.Tensor,
    mat2: torch.Tensor,
    offs: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    out_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """aten ``_grouped_mm``: 2-D ``self (S, K)`` with 3-D ``mat2 (G, K, N)`` and ``offs``
    (G,) cumulative row ends: rows of group ``i`` times ``mat2[i]`` (rows past ``offs[-1]``
    are zero); 3-D x 3-D without ``offs``: the batched product. Each group is one product
    of the mode, so a token's expert output depends on its row and the expert only."""
    if not (self.dtype.is_floating_point and mat2.dtype.is_floating_point):
        raise NotInvariantError(f"batch-invariant mode: _grouped_mm of {self.dtype} x {mat2.dtype} is not covered")
    dtype = out_dtype or self.dtype
    portable = config().portable
    of = owner(mat2)  # the experts' parameter: its slices' forms are cached
    if self.dim() == 2 and mat2.dim() == 3 and offs is not None:
        ends = [int(e) for e in offs.tolist()]
        out = torch.zeros((self.shape[0], mat2.shape[2]), dtype=dtype, device=self.device)
        start = 0
        for i, end in enumerate(ends):
            if end > start:
                out[start:end] = product(self[start:end], mat2[i], portable, of=of).to(dtype)
            start = max(start, end)
    elif self.dim() == 3 and mat2.dim() == 3 and offs is None:
        out = product(self, mat2, portable, of=of).to(dtype)
    else:
        raise NotInvariantError(
            f"batch-invariant mode: _grouped_mm of a {self.dim()}-D by a {mat2.dim()}-D operand "
            f"{'with' if offs is not None else 'without'} offs is not covered (the 2-D x 3-D "
            f"grouped and the 3-D x 3-D batched forms are)"
        )
    if bias is not None:
        raise NotInvariantError("batch-invariant mode: _grouped_mm with a bias is not covered")
    return out
