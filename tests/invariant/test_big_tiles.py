"""Long 2-D products in big tiles (``tiles.BIG``): the same bits as the ladder, by check.

A prefill of hundreds of rows may run in 128/256/512-row calls where the mode has checked
(at the first call with that many rows, at the process's thread count) that every row of
such a call gives the canonical bits -- the ladder's at 1 thread. Pins: a big tile used
without that check (under MKL at 2 threads a 128-row call splits K >= 1024 across the
threads and rounds unlike 1 thread, measured on an AVX-512 Xeon), a big split that pads,
and a tail after the big tiles that takes other tiles than the ladder.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from detsample.invariant import batch_invariant, tiles
from detsample.invariant.state import plans
from detsample.probe.threads import torch_threads

#: (K, N) like a wide Llama's projections (K >= 1024: where short tiles run at 1 thread)
SHAPES = [(1024, 1024), (1024, 2752), (256, 688)]
ROWS = [128, 300, 512, 777, 1100]


@pytest.mark.parametrize(
    "m,big,want",
    [
        (0, (128, 256, 512), ([], 0)),
        (127, (128, 256, 512), ([], 127)),
        (128, (128, 256, 512), ([128], 0)),
        (777, (128, 256, 512), ([512, 256], 9)),
        (1100, (512,), ([512, 512], 76)),
        (1100, (256,), ([256] * 4, 76)),
        (300, (), ([], 300)),
    ],
)
def test_big_split_never_pads(m, big, want):
    assert tiles.big_split(m, big) == want


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("k,n", SHAPES)
def test_long_prefill_rows_equal_rows_alone(k, n, threads):
    g = torch.Generator().manual_seed(k + n)
    w = torch.randn(n, k, generator=g) / k**0.5
    x = torch.randn(max(ROWS), k, generator=g)
    with torch_threads(threads), batch_invariant():
        alone = {r: F.linear(x[r : r + 1], w) for r in (0, 5, 127, 128, 300, 511, 512, 776, 1099)}
        for m in ROWS:
            out = F.linear(x[:m], w)
            for r, want in alone.items():
                if r < m:
                    assert torch.equal(out[r : r + 1], want), (m, r)
        assert any(key[0] == "big" for key, _ in plans().items())


@pytest.mark.parametrize("k,n", SHAPES[:2])
def test_long_prefill_bits_do_not_follow_the_thread_count(k, n):
    g = torch.Generator().manual_seed(7)
    w = torch.randn(n, k, generator=g)
    x = torch.randn(600, k, generator=g)
    outs = []
    for t in (1, 2):
        with torch_threads(t), batch_invariant():
            outs.append(F.linear(x, w))
    assert torch.equal(outs[0], outs[1])


def test_a_big_tile_that_fails_its_check_is_not_taken(monkeypatch):
    """A BLAS whose 512-row calls round differently: the check drops the size, and the
    product keeps the canonical bits."""
    real = tiles.run_sizes

    def skewed(a, b, sizes):
        out = real(a, b, sizes)
        return out.nextafter(torch.full_like(out, float("inf"))) if sizes == [512] else out

    monkeypatch.setattr(tiles, "run_sizes", skewed)
    g = torch.Generator().manual_seed(3)
    w = torch.randn(96, 80, generator=g)
    x = torch.randn(520, 80, generator=g)
    with torch_threads(1), batch_invariant():
        out = F.linear(x, w)
        rows = [F.linear(x[r : r + 1], w) for r in (0, 300, 519)]
        big = [p for key, p in plans().items() if key[0] == "big" and key[1:3] == (80, 96)]
    assert big and 512 not in big[0].data and 256 in big[0].data
    for r, want in zip((0, 300, 519), rows):
        assert torch.equal(out[r : r + 1], want)
