"""detsample.kernels.matmul: fixed tiles, no split-K: a row's bits never depend on M.

Bounds against the float64 product: ``|C - ref| <= ATOL[dtype] * sqrt(K) * max|A| max|B|``
(float32 accumulation of K products, then one rounding to the output dtype).
"""

import pytest
import torch

DTYPES = [torch.float32, torch.bfloat16, pytest.param(torch.float16, marks=pytest.mark.triton_full)]
#: per-dtype relative bound, in units of sqrt(K) * max|a| * max|b| (output rounding)
ATOL = {torch.float32: 2e-7, torch.float16: 1e-3, torch.bfloat16: 8e-3}
SHAPES = [
    pytest.param((21, 70, 70), id="21x70x70"),
    pytest.param((37, 100, 70), id="37x100x70", marks=pytest.mark.triton_full),
    pytest.param((64, 256, 256), id="64x256x256", marks=pytest.mark.triton_full),
    pytest.param((5, 33, 130), id="5x33x130", marks=pytest.mark.triton_full),
]


def inputs(M, K, N, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(M, K, generator=g).to(dtype)
    b = torch.randn(K, N, generator=g).to(dtype)
    bias = torch.randn(N, generator=g).to(dtype)
    return a, b, bias


def run_mm(a, b, bias, subsets):
    """mm / addmm on the whole a and on row subsets (contiguous slices and gathers)."""
    from detsample.kernels import matmul

    full = matmul.mm(a, b)
    fadd = matmul.addmm(bias, a, b)
    scaled = matmul.addmm(bias, a, b, beta=0.5, alpha=2.0)
    subs = [(matmul.mm(a[s], b), matmul.addmm(bias, a[s], b)) for s in subsets]
    return full, fadd, scaled, subs


def run_bmm(a, b, subsets):
    from detsample.kernels import matmul

    return matmul.bmm(a, b), [matmul.bmm(a[:, s], b) for s in subsets]


def bound(a, b, dtype):
    K = a.shape[-1]
    return ATOL[dtype] * K**0.5 * float(a.abs().max()) * float(b.abs().max())


def subsets_of(M):
    return [slice(3, M - 1), slice(M - 1, M), torch.tensor([M - 1, 0, M // 2]), torch.arange(M).flip(0)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_mm_addmm_rows_invariant_and_accurate(interp, dtype, shape):
    """Row m of mm/addmm is bitwise the same for any set of rows around it (alone, a
    slice, a gather, reversed). Bug it pins: tiles or a split-K chosen from M, or a
    padded tile edge that changes a row's reduction."""
    M, K, N = shape
    a, b, bias = inputs(M, K, N, dtype, seed=M)
    subsets = subsets_of(M)
    full, fadd, scaled, subs = interp(run_mm, a, b, bias, subsets)
    for s, (mm_s, add_s) in zip(subsets, subs):
        assert torch.equal(mm_s, full[s]) and torch.equal(add_s, fadd[s])
    ref = a.double() @ b.double()
    tol = bound(a, b, dtype)
    assert full.dtype == dtype and full.shape == (M, N)
    assert float((full.double() - ref).abs().max()) <= tol
    rounding = 0.0 if dtype == torch.float32 else 1e-2  # bias added before the output cast
    assert float((fadd.double() - ref - bias.double()).abs().max()) <= tol + rounding
    assert float((scaled.double() - 2 * ref - 0.5 * bias.double()).abs().max()) <= 2 * tol + rounding


def test_addmm_beta_zero_ignores_the_bias(interp):
    """aten semantics: with beta == 0 the bias is not read (a NaN bias gives no NaN)."""
    a, b, _ = inputs(4, 32, 16, torch.float32)
    bias = torch.full((16,), float("nan"))
    full, fadd, scaled, subs = interp(run_mm, a, b, bias, [])
    from_kernel = interp(_addmm_beta0, bias, a, b)
    assert torch.equal(from_kernel, full * 3)


def _addmm_beta0(bias, a, b):
    from detsample.kernels import matmul

    return matmul.addmm(bias, a, b, beta=0, alpha=3)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_bmm_rows_invariant(interp, dtype):
    g = torch.Generator().manual_seed(1)
    a = torch.randn(3, 40, 64, generator=g).to(dtype)
    b = torch.randn(3, 64, 48, generator=g).to(dtype)
    subsets = subsets_of(40)
    full, subs = interp(run_bmm, a, b, subsets)
    for s, got in zip(subsets, subs):
        assert torch.equal(got, full[:, s])
    assert float((full.double() - a.double() @ b.double()).abs().max()) <= bound(a, b, dtype)


def test_shape_and_dtype_errors_name_the_values(interp):
    msgs = interp(_errors)
    assert "(2, 3) @ (4, 5)" in msgs[0]
    assert "torch.float32 and torch.float16" in msgs[1]
    assert "(M, K) @ (K, N)" in msgs[2] and "(2, 3, 1)" in msgs[2]


def _errors():
    from detsample.kernels import matmul

    out = []
    for f in (
        lambda: matmul.mm(torch.zeros(2, 3), torch.zeros(4, 5)),
        lambda: matmul.mm(torch.zeros(2, 3), torch.zeros(3, 5, dtype=torch.float16)),
        lambda: matmul.mm(torch.zeros(2, 3, 1), torch.zeros(3, 5)),
    ):
        try:
            f()
            out.append("")
        except ValueError as e:
            out.append(str(e))
    return out


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("M", [1, 8, 64, 512])
def test_rows_invariant_on_cuda(cuda, dtype, M):
    """On the GPU at K = N = 4096: each M's rows equal the same rows computed inside
    M = 1024, bitwise."""
    from detsample.kernels import matmul

    g = torch.Generator(device=cuda).manual_seed(0)
    a = torch.randn(1024, 4096, generator=g, device=cuda).to(dtype)
    b = torch.randn(4096, 4096, generator=g, device=cuda).to(dtype)
    full = matmul.mm(a, b)
    assert torch.equal(matmul.mm(a[:M], b), full[:M])
    assert torch.equal(matmul.mm(a[-M:], b), full[-M:])
    ref = a[:M].double() @ b.double()
    assert float((full[:M].double() - ref).abs().max()) <= bound(a, b, dtype)
