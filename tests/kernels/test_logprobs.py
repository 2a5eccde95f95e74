"""detsample.kernels.logprobs: log_softmax, the normalisers and exp ARE detsample.arith's,
bit for bit (interpreter), and a row's bits do not depend on its batch.

Bugs it pins: the sampler's Triton log_softmax drifting from the definition (a float32
sum, ``tl.log`` of a float32 sum, ``x - m`` in float32, a NaN row that is not NaN32 or a
-inf row that is not), and a block size or a reduction split chosen from the batch.
"""

import math

import numpy as np
import pytest
import torch

from detsample import arith
from detsample.arith import spec
from tests.helpers import logits_rows
from tests.kernels.test_arith import IMPLS, float32_inputs

SHAPES = [(4, 1000), (3, 4096), (2, 3)]


def special_rows(n: int) -> torch.Tensor:
    """(15, n) float32 rows with every case of the definition: random, ties, -inf
    entries, all -inf, a NaN (canonical and x86's negative pattern), a +inf, huge and
    tiny magnitudes, one-hot, flat (+-0 mixed), the lowest float32, shifted exps at the
    edge of float32 (-87 .. -104 below the max) and the extremes of both signs."""
    g = torch.Generator().manual_seed(n)
    x = torch.randn(15, n, generator=g) * 3
    x[1] = torch.round(x[1])
    x[2, ::2] = -math.inf
    x[3] = -math.inf
    x[4, n // 2] = math.nan
    x[5, n - 1] = math.inf
    x[6] *= 1e30
    x[7] *= 1e-30
    x[8, n // 3] = 1e4
    x[9] = 0.0
    x[9, ::3] = -0.0
    x[10] = -3.0e38
    x[11] = -torch.rand(n, generator=g) * 20 - 87
    x[11, 0] = 0.0
    x[12, ::2] = 3e38
    x[12, 1::2] = -3e38
    x[13, 0] = torch.tensor([-4194304], dtype=torch.int32).view(torch.float32)  # 0xffc00000
    x[14] = -torch.rand(n, generator=g) * 1e-3
    return x


def run_rows(x: torch.Tensor, alone_rows):
    from detsample.kernels.logprobs import exp, log_softmax_rows, normalisers_rows

    out = log_softmax_rows(x)
    into = torch.full_like(x, 7.0)
    log_softmax_rows(x, out=into)
    return (
        out,
        into,
        normalisers_rows(x),
        exp(x),
        {i: log_softmax_rows(x[i : i + 1]) for i in alone_rows},
        log_softmax_rows(x.flip(0)).flip(0),
        log_softmax_rows(x.t().contiguous().t()),
    )


@pytest.mark.parametrize(
    "n", [pytest.param(1, marks=pytest.mark.triton_full), 3, pytest.param(1000, marks=pytest.mark.triton_full), 2500]
)
def test_log_softmax_normalisers_exp_are_arith_bit_for_bit(interp, n, request):
    """Every row of :func:`special_rows` through the kernels, compared with
    detsample.arith's numba kernels and its torch composition: log_softmax, the
    normalisers ``(m, G)`` and exp, bit for bit; a row alone (three rows; every row in
    the full run), in the batch, in the reversed batch and read through a strided view
    gives the same bits."""
    x = special_rows(n)
    full = request.node.get_closest_marker("triton_full") is not None
    out, into, (m, G), e, alone, flipped, strided = interp(run_rows, x, range(x.shape[0]) if full else [0, 4, 11])
    assert torch.equal(out.view(torch.int32), into.view(torch.int32))
    for impl in IMPLS:
        assert torch.equal(out.view(torch.int32), arith.log_softmax(x, impl=impl).view(torch.int32))
        wm, wG = arith.normalisers(x, impl=impl)
        assert torch.equal(G.view(torch.int64), wG.view(torch.int64))
        assert torch.equal(torch.isnan(m), torch.isnan(wm))
        assert torch.equal(m[~torch.isnan(m)], wm[~torch.isnan(wm)])
        assert torch.equal(e.view(torch.int32), arith.exp(x, impl=impl).view(torch.int32))
    for i, row in alone.items():
        assert torch.equal(row.view(torch.int32), out[i : i + 1].view(torch.int32))
    assert torch.equal(flipped.view(torch.int32), out.view(torch.int32))
    assert torch.equal(strided.view(torch.int32), out.view(torch.int32))
    nan_rows = [3, 4, 5, 13] + ([2] if n == 1 else [])  # no finite value, NaN, +inf
    assert bool((out[nan_rows].view(torch.int32) == spec.NAN32_BITS).all())
    assert bool(torch.isnan(G[nan_rows]).all()) and bool(torch.isnan(m[[4, 13]]).all())
    if n > 1:
        assert bool(torch.isneginf(out[2, ::2]).all()) and bool(torch.isfinite(out[2, 1::2]).all())
    picked = arith.picked(x, m.unsqueeze(1), G.unsqueeze(1))  # the normalisers' meaning
    assert torch.equal(picked.view(torch.int32), out.view(torch.int32))


@pytest.mark.triton_full
@pytest.mark.parametrize("family", ["random", "ties", "neginf", "huge"])
@pytest.mark.parametrize("shape", SHAPES)
def test_log_softmax_rows_of_logit_families_are_arith(interp, family, shape):
    """The test-suite's logit families (tests/helpers.logits_rows) at the sampler's
    shapes: arith's bits, and the same bits alone and in the reversed batch."""
    B, V = shape
    x = torch.from_numpy(logits_rows(np.random.default_rng(V + B), B, V, family))
    out, _, _, _, alone, flipped, _ = interp(run_rows, x, range(B))
    assert torch.equal(out.view(torch.int32), arith.log_softmax(x).view(torch.int32))
    for i, row in alone.items():
        assert torch.equal(row.view(torch.int32), out[i : i + 1].view(torch.int32))
    assert torch.equal(flipped.view(torch.int32), out.view(torch.int32))


def run_exp(z: torch.Tensor) -> torch.Tensor:
    from detsample.kernels.logprobs import exp

    return exp(z)


def test_exp_kernel_is_arith_exp(interp):
    """``kernels.logprobs.exp`` (the Triton backend's ``exp``: the min-p test of the
    "processed" logprobs) is arith.exp on float32 inputs with specials, any shape."""
    z = float32_inputs()
    for t in (z, z[:9_000].reshape(100, 90), z[1::7]):
        assert torch.equal(interp(run_exp, t).view(torch.int32), arith.exp(t).view(torch.int32))


def test_bad_arguments_are_refused(interp):
    msg = interp(_bad_calls)
    assert msg == ["float32", "float32", "not x", "length 0"]


def _bad_calls():
    from detsample.kernels.logprobs import exp, log_softmax_rows, normalisers_rows

    out = []
    for f in (
        lambda: log_softmax_rows(torch.zeros(2, 3, dtype=torch.float64)),
        lambda: exp(torch.zeros(2, dtype=torch.float64)),
        lambda: log_softmax_rows(x := torch.zeros(2, 3), out=x),
        lambda: normalisers_rows(torch.zeros(2, 0)),
    ):
        try:
            f()
            out.append(None)
        except ValueError as e:
            out.append(next(k for k in ("not x", "length 0", "float32") if k in str(e)))
    return out


@pytest.mark.gpu
def test_log_softmax_and_exp_on_cuda_are_the_cpus_bits(cuda):
    """On a GPU: the kernels give detsample.arith's CPU bits (the aim of the definition:
    IEEE float64 + - * / and conversions, no contraction), on the special rows and at
    the sampler's size."""
    from detsample.kernels.logprobs import exp, log_softmax_rows, normalisers_rows

    for x in (special_rows(1000), special_rows(3), torch.randn(64, 152064) * 4):
        got = log_softmax_rows(x.to(cuda)).cpu()
        assert torch.equal(got.view(torch.int32), arith.log_softmax(x).view(torch.int32))
        m, G = normalisers_rows(x.to(cuda))
        wm, wG = arith.normalisers(x)
        assert torch.equal(G.cpu().view(torch.int64), wG.view(torch.int64))
        assert torch.equal(exp(x.to(cuda)).cpu().view(torch.int32), arith.exp(x).view(torch.int32))
    z = float32_inputs()
    assert torch.equal(exp(z.to(cuda)).cpu().view(torch.int32), arith.exp(z).view(torch.int32))
