"""log_softmax row invariance on this platform and deterministic top-n ordering."""

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from detsample import arith
from detsample.ops import logprobs as L
from detsample.ops.logprobs import topn
from tests.helpers import num_threads

# the row ops the sampler relies on to give a row the same bits at any batch size:
# torch's exact ones (selections, integer and exact-order scans) and detsample's exp and
# log_softmax (constructed: a function of each element / row; measured here too)
ROW_OPS = [
    ("log_softmax", lambda x: arith.log_softmax(x)),
    ("log_softmax_at", lambda x: L.log_softmax(x, at=torch.zeros(x.shape[0], dtype=torch.int64))),
    ("amax", lambda x: torch.amax(x, -1, keepdim=True)),
    ("argmax", lambda x: torch.argmax(x, -1, keepdim=True)),
    ("topk", lambda x: torch.topk(x, 50).values),
    ("sort", lambda x: torch.sort(x, dim=-1, descending=True, stable=True).values),
    ("cumsum", lambda x: torch.cumsum(x, -1)),
    ("exp", lambda x: arith.exp(x)),
]


@pytest.mark.parametrize("name,op", ROW_OPS)
@pytest.mark.parametrize("threads", [1, 2])
def test_row_ops_batch_invariant(name, op, threads):
    """Measured guarantee the sampler builds on: a row's bits do not depend on the batch
    (1 vs 64 rows) or the thread count. (`sum(dim=-1)` fails this at 2 threads, which is
    why masses are summed as exact integers instead.)"""
    rng = np.random.default_rng(0)
    x = torch.from_numpy((rng.standard_normal((64, 152064)) * 4).astype(np.float32))
    with num_threads(threads):
        full = op(x)
        for i in (0, 31, 63):
            assert torch.equal(op(x[i : i + 1]).view(-1), full[i].view(-1)), (name, i)


@given(st.integers(0, 2**32 - 1), st.sampled_from([1, 3, 8]))
def test_topn_orders_by_value_then_id(seed, n):
    rng = np.random.default_rng(seed)
    v = torch.from_numpy(np.round(rng.standard_normal((5, 40))).astype(np.float32))
    v[0, 10:] = float("-inf")
    vals, ids = topn(v, n)
    for r in range(5):
        ref = sorted(range(40), key=lambda i: (-float(v[r, i]), i))[:n]
        assert ids[r].tolist() == ref
        assert torch.equal(vals[r], v[r, ref])


def test_gather_rows_of_one_row_in_range_equals_gather():
    """A single row with ids known to be in range is picked by one ``take``: the same
    value as ``gather`` for every id, first and last included; without the flag a
    negative id still raises (``take`` would wrap it to the last token)."""
    x = torch.from_numpy(np.random.default_rng(3).standard_normal((1, 50)).astype(np.float32))
    for t in (0, 7, 49):
        ids = torch.tensor([t])
        want = x.gather(1, ids.unsqueeze(1)).squeeze(1)
        got = L.gather_rows(x, ids, in_range=True)
        assert got.shape == (1,) and torch.equal(got.view(torch.int32), want.view(torch.int32))
    with pytest.raises(RuntimeError):
        L.gather_rows(x, torch.tensor([-1]))
