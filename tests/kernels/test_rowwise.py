"""detsample.kernels.rowwise: softmax, mean, RMSNorm, one program per row (the
batch-invariant mode's log_softmax is detsample.arith's: tests/kernels/test_logprobs.py)."""

import pytest
import torch

from detsample import arith

DTYPES = [torch.float32, torch.bfloat16, torch.float16]
#: |out - float64 reference| <= TOL[dtype] * (1 + |ref|): float32 math, output rounding
TOL = {torch.float32: 2e-6, torch.bfloat16: 8e-3, torch.float16: 1e-3, torch.float64: 1e-12}
SHAPES = [
    pytest.param((6, 1000), id="6x1000"),
    pytest.param((4, 7), id="4x7"),
    pytest.param((3, 4096), id="3x4096", marks=pytest.mark.triton_full),
]


def run_rows(x, w):
    from detsample.kernels import rowwise

    outs = {
        "softmax": rowwise.softmax_rows(x),
        "softmax_f32": rowwise.softmax_rows(x, out_dtype=torch.float32),
        "mean": rowwise.mean_rows(x),
        "rms": rowwise.rms_norm_rows(x, w, 1e-6)[0],
        "rms_now": rowwise.rms_norm_rows(x, None, 1e-5)[0],
    }
    rev = torch.arange(x.shape[0]).flip(0)
    flipped = {
        "softmax": rowwise.softmax_rows(x[rev])[rev],
        "softmax_f32": rowwise.softmax_rows(x[rev], out_dtype=torch.float32)[rev],
        "mean": rowwise.mean_rows(x[rev])[rev],
        "rms": rowwise.rms_norm_rows(x[rev], w, 1e-6)[0][rev],
        "rms_now": rowwise.rms_norm_rows(x[rev], None, 1e-5)[0][rev],
    }
    last = x.shape[0] - 1
    alone = {
        "softmax": rowwise.softmax_rows(x[last:]),
        "softmax_f32": rowwise.softmax_rows(x[last:], out_dtype=torch.float32),
        "mean": rowwise.mean_rows(x[last:]),
        "rms": rowwise.rms_norm_rows(x[last:], w, 1e-6)[0],
        "rms_now": rowwise.rms_norm_rows(x[last:], None, 1e-5)[0],
    }
    return outs, flipped, alone


def references(x, w):
    xd = x.double()
    rms = xd * torch.rsqrt(xd.pow(2).mean(-1, keepdim=True) + 1e-6) * w.double()
    return {
        "softmax": torch.softmax(xd, -1),
        "softmax_f32": torch.softmax(xd, -1),
        "mean": xd.mean(-1),
        "rms": rms,
        "rms_now": xd * torch.rsqrt(xd.pow(2).mean(-1, keepdim=True) + 1e-5),
    }


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_rows_invariant_and_accurate(interp, dtype, shape):
    """Each op gives a row the same bits in the batch, in the reversed batch and alone;
    values agree with the float64 reference within TOL. Bug it pins: a reduction split
    or block size chosen from the number of rows."""
    R, N = shape
    g = torch.Generator().manual_seed(R * N)
    x = (torch.randn(R, N, generator=g) * 3).to(dtype)
    w = torch.randn(N, generator=g).to(dtype)
    outs, flipped, alone = interp(run_rows, x, w)
    refs = references(x, w)
    for name, out in outs.items():
        assert torch.equal(flipped[name], out), name
        assert torch.equal(alone[name], out[R - 1 :]), name
        want_dtype = torch.float32 if name == "softmax_f32" else dtype
        assert out.dtype == want_dtype, name
        ref = refs[name]
        err = (out.double() - ref).abs() / (1 + ref.abs())
        assert float(err.max()) <= TOL[want_dtype] * (4 if name.startswith("rms") else 1), (name, float(err.max()))


def run_softmax(x):
    from detsample.kernels import rowwise

    return rowwise.softmax_rows(x), rowwise.softmax_rows(x, safe=True)


def test_softmax_numerators_are_arith_exp(interp):
    """Rows whose sum is exactly 2 in any order (two entries at the max, the others so
    small that no partial sum moves it): each output is ``div_rn(e, 2)``, so twice it is
    ``e = arith.exp(x - max)`` bit for bit -- the softmax's exp is detsample's, not the
    GPU's ``ex2.approx`` or the interpreter's numpy (39% of float32 inputs differ by an
    ulp). Bug it pins: a ``tl.exp`` left in the batch-invariant softmax."""
    g = torch.Generator().manual_seed(9)
    x = -torch.rand(3, 1500, generator=g) * 10 - 30
    x[:, 7] = x[:, 1201] = 0.0
    x[1] += 5.0
    x[2, ::3] = float("-inf")
    y, safe = interp(run_softmax, x)
    want = arith.exp(x - x.amax(-1, keepdim=True))
    assert torch.equal((y * 2).view(torch.int32), want.view(torch.int32))
    assert torch.equal(safe.view(torch.int32), y.view(torch.int32))
    dead = torch.full((1, 8), float("-inf"))
    y, safe = interp(run_softmax, dead)
    assert bool(torch.isnan(y).all()) and bool((safe == 0).all())


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rows_invariant_on_cuda(cuda, dtype):
    from detsample.kernels import rowwise

    x = torch.randn(512, 4096, device=cuda).to(dtype)
    w = torch.randn(4096, device=cuda).to(dtype)
    for f in (rowwise.softmax_rows, rowwise.mean_rows, lambda t: rowwise.rms_norm_rows(t, w, 1e-6)[0]):
        full = f(x)
        for M in (1, 8, 64):
            assert torch.equal(f(x[:M]), full[:M])
