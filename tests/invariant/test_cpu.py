"""The batch-invariant CPU kernels: a row's bits depend on that row only.

Pins: a kernel that rounds a row differently in a 1-3-row batch than in a 16-row one
(MKL's small-M path), a product whose bits follow the input's address (few output
columns), a reduction that two threads split differently for one row than for two, a
pointwise op whose last ``numel % 16`` elements take a scalar formula (silu), and a
bias added before instead of after the product. Each test compares row r computed
alone with row r inside batches of many sizes, positions and thread counts, bitwise.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from detsample.invariant import cpu
from detsample.threads import torch_threads

THREADS = [1, 2]
MM_SHAPES = [(256, 688), (688, 256), (37, 53), (160, 7), (33, 1), (5, 3), (64, 11), (1, 40)]
ROW_COUNTS = [1, 2, 3, 4, 5, 6, 8, 9, 11, 12, 13, 17, 40]
DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _misaligned(x: torch.Tensor, offset: int) -> torch.Tensor:
    """``x`` copied to a buffer starting ``offset`` elements past an aligned address."""
    buf = torch.empty(x.numel() + offset, dtype=x.dtype)
    out = buf[offset:].view(x.shape)
    out.copy_(x)
    return out


def _rows_alone_equal(fn, x: torch.Tensor, counts=ROW_COUNTS) -> None:
    """Row r of ``fn(x[:m])`` equals ``fn(x[r:r+1])`` for every m and r < m."""
    alone = [fn(x[r: r + 1]) for r in range(max(counts))]
    for m in counts:
        full = fn(x[:m])
        for r in range(m):
            assert torch.equal(full[r: r + 1], alone[r]), f"row {r} of {m} differs"


@pytest.mark.parametrize("threads", THREADS)
@pytest.mark.parametrize("k,n", MM_SHAPES)
def test_mm_rows_do_not_depend_on_the_batch(k, n, threads):
    g = _gen(k * 1000 + n)
    x = torch.randn(max(ROW_COUNTS), k, generator=g)
    w = torch.randn(n, k, generator=g) * k ** -0.5
    with torch_threads(threads):
        _rows_alone_equal(lambda a: cpu.mm(a, w.t()), x)                 # F.linear's layout
        _rows_alone_equal(lambda a: cpu.mm(a, w.t().contiguous()), x)    # a (K, N) matrix
        # the row's address does not matter either (MKL's narrow-output path it avoids)
        for off in (1, 3, 5):
            _rows_alone_equal(lambda a: cpu.mm(_misaligned(a, off), w.t()), x, counts=[5, 17])


def test_padded_rows_skip_the_row_counts_mkl_splits():
    """1-3 rows take MKL's small kernel; 2 threads split 5-7 and 9-11 rows into a part of
    1-3; every other count gives a row the same bits (the sweep above)."""
    assert [cpu.padded_rows(m) for m in range(1, 15)] == [4, 4, 4, 4, 8, 8, 8, 8, 12, 12, 12, 12, 13, 14]


@pytest.mark.parametrize("dtype", DTYPES)
def test_mm_reduced_precision_rounds_once_from_float32(dtype):
    g = _gen(1)
    x = torch.randn(9, 48, generator=g).to(dtype)
    w = torch.randn(48, 33, generator=g).to(dtype)
    with torch_threads(2):
        _rows_alone_equal(lambda a: cpu.mm(a, w), x, counts=[1, 3, 9])
        expect = cpu.mm(x.float(), w.float()).to(dtype)
        assert torch.equal(cpu.mm(x, w), expect)


def test_mm_column_depends_only_on_its_own_column():
    """The attention relies on it: a key block's other columns (future keys, padding)
    never move a score."""
    g = _gen(2)
    x = torch.randn(20, 64, generator=g)
    w = torch.randn(64, 64, generator=g)
    other = torch.randn(64, 64, generator=g)
    for j in (0, 17, 63):
        w2 = other.clone()
        w2[:, j] = w[:, j]
        assert torch.equal(cpu.mm(x, w)[:, j], cpu.mm(x, w2)[:, j])


def test_native_mm_is_not_batch_invariant_here():
    """Negative control: the sweep above would see torch's own kernel fail."""
    g = _gen(3)
    x = torch.randn(16, 256, generator=g)
    w = torch.randn(688, 256, generator=g)
    with torch_threads(1):
        alone = F.linear(x[:1], w)
        if all(torch.equal(F.linear(x[:m], w)[:1], alone) for m in (2, 3, 4, 5, 16)):
            pytest.skip("torch's mm is already batch-invariant on this CPU")


@pytest.mark.parametrize("threads", THREADS)
def test_bmm_rows_do_not_depend_on_the_batch_or_other_matrices(threads):
    g = _gen(4)
    a = torch.randn(6, 20, 24, generator=g)
    b = torch.randn(6, 24, 30, generator=g)
    with torch_threads(threads):
        alone = [[cpu.bmm(a[i: i + 1, r: r + 1], b[i: i + 1]) for r in range(20)] for i in range(6)]
        for nb, m in [(1, 1), (2, 3), (6, 5), (6, 20), (3, 17)]:
            full = cpu.bmm(a[:nb, :m], b[:nb])
            for i in range(nb):
                for r in range(m):
                    assert torch.equal(full[i: i + 1, r: r + 1], alone[i][r])
            # each matrix equals its own mm
            for i in range(nb):
                assert torch.equal(full[i], cpu.mm(a[i, :m], b[i]))


def test_addmm_adds_the_bias_once_after_the_product():
    g = _gen(5)
    x, w, bias = torch.randn(7, 40, generator=g), torch.randn(40, 24, generator=g), torch.randn(24, generator=g)
    prod = cpu.mm(x, w)
    assert torch.equal(cpu.addmm(bias, x, w), bias + prod)
    assert torch.equal(cpu.addmm(bias, x, w, beta=0.5, alpha=2.0), bias * 0.5 + prod * 2.0)
    assert torch.equal(cpu.addmm(torch.full((24,), float("nan")), x, w, beta=0), prod)
    _rows_alone_equal(lambda a: cpu.addmm(bias, a, w), torch.randn(9, 40, generator=g), counts=[1, 4, 9])
    b1, b2 = torch.randn(3, 5, 40, generator=g), torch.randn(3, 40, 24, generator=g)
    assert torch.equal(cpu.baddbmm(bias, b1, b2), bias + cpu.bmm(b1, b2))


def test_mv_and_dot_are_one_column_products():
    g = _gen(6)
    a, v = torch.randn(9, 70, generator=g), torch.randn(70, generator=g)
    assert torch.equal(cpu.mv(a, v), cpu.mm(a, v[:, None])[:, 0])
    assert torch.equal(cpu.mv(a[:1], v), cpu.mv(a, v)[:1])
    assert torch.equal(cpu.dot(a[0], v), cpu.mv(a[:1], v)[0])


def test_integer_matmul_and_sum_take_the_native_exact_kernel():
    a = torch.arange(12, dtype=torch.int64).reshape(3, 4)
    assert torch.equal(cpu.mm(a, a.t()), torch.ops.aten.mm.out(a, a.t(), out=a.new_empty(3, 3)))
    assert cpu.sum_dim(a, [1]).tolist() == [6, 22, 38]
    assert cpu.sum_dim(a.bool(), [1]).dtype == torch.int64


# -- reductions ----------------------------------------------------------------------------

WIDTHS = [1, 7, 100, 4096, 8193, 40000, 70000]


@pytest.mark.parametrize("threads", THREADS)
@pytest.mark.parametrize("n", WIDTHS)
def test_row_sums_do_not_depend_on_the_batch(n, threads):
    x = torch.randn(5, n, generator=_gen(n))
    with torch_threads(threads):
        _rows_alone_equal(lambda a: cpu.sum_dim(a, [-1]), x, counts=[1, 2, 3, 5])
        _rows_alone_equal(lambda a: cpu.mean_dim(a, [-1], True), x, counts=[1, 2, 5])


def test_row_sum_equals_torchs_serial_sum_up_to_the_chunk_width():
    """Same model, same bits: rows up to CHUNK wide reduce exactly as torch's own
    serial loop does (mean = sum / count, as torch's CPU mean)."""
    x = torch.randn(3, cpu.CHUNK, generator=_gen(7))
    with torch_threads(1):
        assert torch.equal(cpu.sum_dim(x, [-1]), x.sum(-1))
        assert torch.equal(cpu.mean_dim(x[:, :256], [-1], True), x[:, :256].mean(-1, keepdim=True))


def test_native_sum_splits_a_long_row_at_two_threads():
    """Negative control: the long-row case above is a real hazard of torch's kernel."""
    x = torch.randn(2, 65536, generator=_gen(8))
    with torch_threads(2):
        if torch.equal(x[:1].sum(-1), x.sum(-1)[:1]):
            pytest.skip("torch's sum does not split this row here")


def test_sum_over_other_dims_and_dtypes():
    x = torch.randn(4, 6, 5, generator=_gen(9))
    assert torch.allclose(cpu.sum_dim(x, [0, 2]), x.sum((0, 2)), atol=1e-5)
    assert cpu.sum_dim(x, [1], True).shape == (4, 1, 5)
    assert torch.allclose(cpu.sum_all(x), x.sum(), atol=1e-4)
    assert torch.allclose(cpu.mean_all(x), x.mean(), atol=1e-6)
    assert cpu.mean_dim(x.bfloat16(), [-1]).dtype == torch.bfloat16
    assert cpu.sum_dim(x, [-1], dtype=torch.float64).dtype == torch.float64
    with pytest.raises(RuntimeError, match="dtype"):
        cpu.mean_dim(torch.ones(3, dtype=torch.int64), [0])


# -- pointwise ----------------------------------------------------------------------------

POINTWISE = [
    ("silu", cpu.silu, F.silu),
    ("sigmoid", cpu.sigmoid, torch.sigmoid),
    ("gelu_tanh", lambda x: cpu.gelu(x, approximate="tanh"), lambda x: F.gelu(x, approximate="tanh")),
    ("exp", cpu.exp, torch.exp),
    ("cos", cpu.cos, torch.cos),
    ("rsqrt", lambda x: cpu.rsqrt(x.abs() + 0.1), lambda x: torch.rsqrt(x.abs() + 0.1)),
    ("pow1.5", lambda x: cpu.pow_scalar(x.abs(), 1.5), lambda x: x.abs().pow(1.5)),
]


@pytest.mark.parametrize("threads", THREADS)
@pytest.mark.parametrize("name,fn,native", POINTWISE, ids=[p[0] for p in POINTWISE])
def test_pointwise_rows_do_not_depend_on_the_batch(name, fn, native, threads):
    x = torch.randn(40, 23, generator=_gen(10)) * 3
    big = torch.randn(3, 20001, generator=_gen(11)) * 3      # > GRAIN elements: threads split
    with torch_threads(threads):
        _rows_alone_equal(fn, x, counts=[1, 2, 3, 7, 40])
        _rows_alone_equal(fn, big, counts=[1, 2, 3])
        # the same formula as torch's vector loop (only the scalar tail is avoided)
        assert torch.equal(fn(x[:16].reshape(-1)[:368]), native(x[:16].reshape(-1)[:368]))


def test_native_silu_rounds_its_scalar_tail_differently():
    """Negative control: torch's silu gives an element different bits in a 15-element
    tensor (scalar loop) than in a 64-element one (vector loop)."""
    x = torch.randn(4096, generator=_gen(12)) * 3
    tails = torch.cat([F.silu(x[s: s + 15]) for s in range(0, 4095, 15)])
    assert not torch.equal(tails, F.silu(x)[:4095])
    assert torch.equal(torch.cat([cpu.silu(x[s: s + 15]) for s in range(0, 4095, 15)]),
                       cpu.silu(x)[:4095])


def test_pointwise_keeps_shape_dtype_and_promotes_integers():
    x = torch.randn(3, 5, 7, generator=_gen(13)).transpose(0, 2)
    assert cpu.silu(x).shape == x.shape and torch.equal(cpu.silu(x), cpu.silu(x.contiguous()))
    assert cpu.exp(x.bfloat16()).dtype == torch.bfloat16
    assert cpu.exp(torch.arange(3)).dtype == torch.float32
    assert cpu.pow_scalar(torch.arange(3), 2).tolist() == [0, 1, 4]


# -- softmax and normalisation -------------------------------------------------------------

@pytest.mark.parametrize("threads", THREADS)
@pytest.mark.parametrize("n", [1, 17, 512, 40000])
def test_softmax_rows_do_not_depend_on_the_batch(n, threads):
    x = torch.randn(5, n, generator=_gen(n + 1)) * 4
    with torch_threads(threads):
        _rows_alone_equal(lambda a: cpu.softmax(a, -1, False), x, counts=[1, 2, 5])
        _rows_alone_equal(lambda a: cpu.log_softmax(a, 1, False), x, counts=[1, 2, 5])
    assert torch.allclose(cpu.softmax(x, -1, False), torch.softmax(x, -1), atol=1e-6)
    assert torch.allclose(cpu.log_softmax(x, -1, False), torch.log_softmax(x, -1), atol=1e-5)


def test_softmax_other_dims_and_half_to_float():
    x = torch.randn(4, 6, 3, generator=_gen(14))
    assert torch.allclose(cpu.softmax(x, 1, False), torch.softmax(x, 1), atol=1e-6)
    assert torch.allclose(cpu.log_softmax(x, 0, False), torch.log_softmax(x, 0), atol=1e-5)
    y = cpu.softmax(x.half(), -1, True)
    assert y.dtype == torch.float32 and torch.allclose(y, torch.softmax(x.half().float(), -1), atol=1e-6)
    assert cpu.softmax(torch.empty(0, 3), -1, False).shape == (0, 3)


@pytest.mark.parametrize("threads", THREADS)
def test_layer_norm_rows_do_not_depend_on_the_batch(threads):
    g = _gen(15)
    x = torch.randn(9, 100, generator=g)
    w, b = torch.randn(100, generator=g), torch.randn(100, generator=g)
    with torch_threads(threads):
        _rows_alone_equal(lambda a: cpu.native_layer_norm(a, [100], w, b, 1e-5)[0], x, counts=[1, 3, 9])
    out, mean, rstd = cpu.native_layer_norm(x, [100], w, b, 1e-5)
    ref, rmean, rrstd = torch.native_layer_norm(x, [100], w, b, 1e-5)
    assert torch.allclose(out, ref, atol=1e-5)
    assert mean.shape == rmean.shape and rstd.shape == rrstd.shape
    assert torch.allclose(rstd, rrstd, rtol=1e-5)
    with pytest.raises(RuntimeError, match="normalized_shape"):
        cpu.native_layer_norm(x, [99], None, None, 1e-5)


def test_safe_softmax_zeroes_fully_masked_rows():
    x = torch.randn(3, 5, generator=_gen(16))
    x[1] = float("-inf")
    y = cpu.safe_softmax(x, -1)
    assert torch.equal(y[1], torch.zeros(5)) and torch.equal(y[0], cpu.softmax(x[:1], -1, False)[0])
