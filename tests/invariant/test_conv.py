"""The mode's depthwise causal convolution (detsample/invariant/conv.py): a position's bits
are its own window's, whether the sequence is convolved whole, in chunks with the cached
window, one step at a time by the recurrent form ``(window * w).sum(-1) + b`` (Mamba's
``causal_conv1d_update``), or as a row of a bigger batch; both variants, 1 and 2 threads.

Pins: a short convolution (LFM2, Mamba's conv1d) whose prefill kernel rounds otherwise
than its decode step (torch's depthwise kernel does, against the recurrent form: negative
control); another convolution run silently on torch's kernel under the mode.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from detsample.invariant import batch_invariant
from detsample.invariant.verify import NotInvariantError
from detsample.probe.threads import torch_threads

SHAPES = [(1, 64, 40, 3), (2, 160, 19, 4), (3, 1024, 70, 3)]  # (B, C, T, K)


def _inputs(B: int, C: int, T: int, K: int, dtype=torch.float32):
    g = torch.Generator().manual_seed(B * 1000 + C + T + K)
    x = torch.randn(B, C, T, generator=g).to(dtype)
    return x, torch.randn(C, 1, K, generator=g).to(dtype), torch.randn(C, generator=g).to(dtype)


def _prefill(x, w, b):
    K = w.shape[-1]
    return F.conv1d(x, w, b, padding=K - 1, groups=x.shape[1])[:, :, : x.shape[2]]


def _recurrent(x, w, b):
    """One position at a time from its zero-started window, as a decode step computes it."""
    K = w.shape[-1]
    xp = F.pad(x, (K - 1, 0))
    return torch.stack([(xp[:, :, t : t + K] * w[:, 0]).sum(-1) + b for t in range(x.shape[2])], dim=-1)


def _chunked(x, w, b, cut: int):
    """The first ``cut`` positions, then the rest convolved with the cached window
    (padding 0), as a chunked prefill does."""
    K = w.shape[-1]
    head = _prefill(x[:, :, :cut], w, b)
    window = F.pad(x, (K - 1, 0))[:, :, cut:]
    tail = F.conv1d(window, w, b, groups=x.shape[1])
    return torch.cat([head, tail], dim=-1)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("portable", [False, True], ids=["verified", "portable"])
@pytest.mark.parametrize("shape", SHAPES, ids=[str(s) for s in SHAPES])
def test_a_positions_bits_are_its_windows(shape, portable, threads):
    x, w, b = _inputs(*shape)
    with torch_threads(threads), batch_invariant(portable=portable):
        whole = _prefill(x, w, b)
        assert torch.equal(_recurrent(x, w, b), whole)
        assert torch.equal(_chunked(x, w, b, cut=shape[2] // 3), whole)
        wider = torch.cat([torch.randn(2, *x.shape[1:]), x])
        assert torch.equal(_prefill(wider, w, b)[2:], whole)
    exact = _prefill(x.double(), w.double(), b.double())
    assert torch.allclose(whole.double(), exact, atol=1e-5, rtol=1e-5)


def test_torchs_kernel_rounds_otherwise_than_the_recurrent_form():
    """Negative control: without the mode, a decode step by the recurrent form gives
    other bits than torch's prefill convolution."""
    x, w, b = _inputs(*SHAPES[0])
    assert not torch.equal(_recurrent(x, w, b), _prefill(x, w, b))


def test_reduced_precision_keeps_its_dtype():
    x, w, b = _inputs(1, 32, 9, 3, torch.bfloat16)
    with batch_invariant():
        out = _prefill(x, w, b)
        assert out.dtype == torch.bfloat16
        assert torch.equal(out, _chunked(x, w, b, cut=4))


CONVS = [
    ("dense 1-D", lambda: F.conv1d(torch.randn(1, 4, 9), torch.randn(4, 4, 3))),
    ("2-D", lambda: F.conv2d(torch.randn(1, 2, 5, 5), torch.randn(2, 1, 3, 3), groups=2)),
    ("strided", lambda: F.conv1d(torch.randn(1, 4, 9), torch.randn(4, 1, 3), stride=2, groups=4)),
]


@pytest.mark.parametrize("name,call", CONVS, ids=[c[0] for c in CONVS])
def test_other_convolutions_are_a_named_error(name, call):
    with batch_invariant(), pytest.raises(NotInvariantError, match=r"convolution of input \(1, "):
        call()
