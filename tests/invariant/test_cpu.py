"""The batch-invariant CPU kernels: a row's bits depend on that row only, in both variants.

Every test runs under the mode, verified (``batch_invariant()``) and portable
(``batch_invariant(portable=True)``), at 1 and 2 threads, and compares row r computed
alone with row r inside batches of many sizes (crossing the 64-row tiles), positions,
layouts and addresses, bitwise.

Pins: a product that rounds a row differently in a 1-row call than in a 16-row one
(MKL's small-M paths, the transposed-B kernel switch at K/N-dependent row counts), a
product whose bits follow the input's address or B's layout, a reduction that two
threads split differently for one row than for two, a pointwise op whose last
``numel % step`` elements take a scalar formula (silu), and a bias added before instead
of after the product. The negative controls show each hazard is real in torch's own
kernels on this machine.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from detsample.arith import pointwise as defined
from detsample.invariant import batch_invariant, cpu, tiles
from detsample.ops.vector import PAD
from detsample.probe.threads import torch_threads

THREADS = [1, 2]
VARIANTS = [False, True]
MM_SHAPES = [(256, 688), (688, 256), (96, 64), (37, 53), (160, 7), (33, 1), (5, 3), (1, 40)]
ROW_COUNTS = [1, 2, 3, 4, 5, 8, 9, 13, 17, 40, 64, 65, 100, 130]
DTYPES = [torch.float32, torch.bfloat16, torch.float16]


@pytest.fixture(params=VARIANTS, ids=["verified", "portable"])
def mode(request):
    with batch_invariant(portable=request.param):
        yield request.param


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _misaligned(x: torch.Tensor, offset: int) -> torch.Tensor:
    """``x`` copied to a buffer starting ``offset`` elements past an aligned address."""
    buf = torch.empty(x.numel() + offset, dtype=x.dtype)
    out = buf[offset:].view(x.shape)
    out.copy_(x)
    return out


def _np_softmax(x: torch.Tensor, dim: int, log: bool = False) -> torch.Tensor:
    """float64 numpy reference (torch's own kernels are the mode's inside these tests)."""
    a = x.double().numpy()
    z = a - a.max(axis=dim, keepdims=True)
    lse = np.log(np.exp(z).sum(axis=dim, keepdims=True))
    return torch.from_numpy(z - lse if log else np.exp(z - lse))


def _rows_alone_equal(fn, x: torch.Tensor, counts=ROW_COUNTS) -> None:
    """Row r of ``fn(x[:m])`` equals ``fn(x[r:r+1])`` for every m and r < m."""
    counts = [m for m in counts if m <= x.shape[0]]
    alone = [fn(x[r : r + 1]) for r in range(max(counts))]
    for m in counts:
        full = fn(x[:m])
        for r in range(m):
            assert torch.equal(full[r : r + 1], alone[r]), f"row {r} of {m} differs"


# -- matmul -------------------------------------------------------------------------------


@pytest.mark.parametrize("threads", THREADS)
@pytest.mark.parametrize("k,n", MM_SHAPES)
def test_linear_rows_do_not_depend_on_the_batch(k, n, threads, mode):
    g = _gen(k * 1000 + n)
    x = torch.randn(max(ROW_COUNTS), k, generator=g)
    w = torch.nn.Parameter(torch.randn(n, k, generator=g) * k**-0.5)
    with torch_threads(threads), torch.no_grad():
        _rows_alone_equal(lambda a: F.linear(a, w), x)  # mm(x, w.t()): nt
        _rows_alone_equal(lambda a: a @ w.t().contiguous(), x)  # a (K, N) matrix: nn
        _rows_alone_equal(lambda a: a @ w.t()[:, ::1][::1], x, counts=[1, 5, 64, 65])
        # the row's address does not matter either
        for off in (1, 3, 5):
            _rows_alone_equal(lambda a: F.linear(_misaligned(a, off), w), x, counts=[5, 17, 65])


def test_tile_sizes_and_the_ladder_cost():
    lad = (2, 4, 8, 16, 32, 64)
    assert tiles.tile_sizes(1, lad) == [2]
    assert tiles.tile_sizes(64, lad) == [64]
    assert tiles.tile_sizes(100, lad) == [64, 64]
    assert tiles.tile_sizes(130, lad) == [64, 64, 2]
    assert tiles.tile_sizes(13, (4, 16)) == [16]
    assert tiles.tile_sizes(40, (4, 16)) == [16, 16, 16]
    assert tiles.ladder_cost((1,)) > tiles.ladder_cost(lad) > tiles.ladder_cost((1,) + lad)
    assert tiles.col_blocks(10000) == [(0, 4096), (4096, 8192), (8192, 10000)]


@pytest.mark.parametrize("misaligned", [False, True])
@pytest.mark.parametrize(
    ("lead", "rows", "cols", "dtype"),
    [
        ((), 3, 5, torch.float32),
        ((4,), 2, 17, torch.float64),
        ((2, 3), 4, 16, torch.float32),
        ((), 1, 128, torch.bfloat16),
    ],
)
def test_aligned_scratch_starts_and_rows_on_64_byte_boundaries(lead, rows, cols, dtype, misaligned, monkeypatch):
    """Tiles' scratch: storage on a 64-byte boundary and (``pad``) rows 64-byte multiples
    apart, also where the allocator hands out a misaligned block (simulated: every
    ``new_empty`` 4 bytes off), which takes the over-allocated view. Pins a scratch that
    trusts the allocator's alignment unchecked (the misaligned case then fails)."""
    if misaligned:
        real = torch.Tensor.new_empty

        def off_by_one(self, size, **kw):
            n = int(np.prod(size)) if len(size) else 1
            return real(self, (n + 1,), **kw)[1:].view(size)

        monkeypatch.setattr(torch.Tensor, "new_empty", off_by_one)
    like = torch.zeros(1, dtype=dtype)
    for pad in (True, False):
        t = tiles.aligned_empty(lead, rows, cols, like, pad=pad)
        assert t.shape == lead + (rows, cols) and t.dtype == dtype
        assert t.data_ptr() % 64 == 0
        if pad:
            assert (t.stride(-2) * t.element_size()) % 64 == 0
        else:
            assert t.is_contiguous()


@pytest.mark.parametrize("dtype", DTYPES)
def test_mm_reduced_precision_rounds_once_from_float32(dtype, mode):
    g = _gen(1)
    x = torch.randn(9, 48, generator=g).to(dtype)
    w = torch.randn(48, 33, generator=g).to(dtype)
    with torch_threads(2):
        _rows_alone_equal(lambda a: cpu.mm(a, w), x, counts=[1, 3, 9])
        expect = cpu.mm(x.float(), w.float()).to(dtype)
        assert torch.equal(cpu.mm(x, w), expect)


def test_mm_column_depends_only_on_its_own_column(mode):
    """The attention relies on it for its key blocks: a block's other columns (future
    keys, padding) never move a score."""
    g = _gen(2)
    x = torch.randn(20, 64, generator=g)
    w = torch.randn(64, 128, generator=g)
    other = torch.randn(64, 128, generator=g)
    for j in (0, 17, 127):
        w2 = other.clone()
        w2[:, j] = w[:, j]
        assert torch.equal(cpu.mm(x, w)[:, j], cpu.mm(x, w2)[:, j])


def test_native_linear_is_not_batch_invariant_here():
    """Negative control: outside the mode, torch's F.linear gives row 0 other bits in a
    batch of some size below 64 than alone (MKL's kernel choice by row count)."""
    g = _gen(3)
    x = torch.randn(64, 256, generator=g)
    w = torch.randn(688, 256, generator=g)
    with torch_threads(1):
        alone = F.linear(x[:1], w)
        differ = [m for m in range(2, 65) if not torch.equal(F.linear(x[:m], w)[:1], alone)]
    assert differ, "torch's mm kept row 0's bits for every batch size 2..64"


@pytest.mark.parametrize("threads", THREADS)
def test_bmm_rows_do_not_depend_on_the_batch_or_other_matrices(threads, mode):
    g = _gen(4)
    a = torch.randn(6, 70, 24, generator=g)
    b = torch.randn(6, 24, 30, generator=g)
    with torch_threads(threads):
        alone = [[cpu.bmm(a[i : i + 1, r : r + 1], b[i : i + 1]) for r in range(70)] for i in range(6)]
        for nb, m in [(1, 1), (2, 3), (6, 5), (6, 20), (3, 17), (2, 70)]:
            full = cpu.bmm(a[:nb, :m], b[:nb])
            for i in range(nb):
                for r in range(m):
                    assert torch.equal(full[i : i + 1, r : r + 1], alone[i][r])
            for i in range(nb):  # each matrix equals its own mm
                assert torch.equal(full[i], cpu.mm(a[i, :m], b[i]))


def test_addmm_adds_the_bias_once_after_the_product(mode):
    g = _gen(5)
    x, w, bias = torch.randn(7, 40, generator=g), torch.randn(40, 24, generator=g), torch.randn(24, generator=g)
    prod = cpu.mm(x, w)
    assert torch.equal(cpu.addmm(bias, x, w), bias + prod)
    assert torch.equal(cpu.addmm(bias, x, w, beta=0.5, alpha=2.0), bias * 0.5 + prod * 2.0)
    assert torch.equal(cpu.addmm(torch.full((24,), float("nan")), x, w, beta=0), prod)
    _rows_alone_equal(lambda a: cpu.addmm(bias, a, w), torch.randn(9, 40, generator=g), counts=[1, 4, 9])
    b1, b2 = torch.randn(3, 5, 40, generator=g), torch.randn(3, 40, 24, generator=g)
    assert torch.equal(cpu.baddbmm(bias, b1, b2), bias + cpu.bmm(b1, b2))


def test_mv_and_dot_are_one_column_products(mode):
    g = _gen(6)
    a, v = torch.randn(9, 70, generator=g), torch.randn(70, generator=g)
    assert torch.equal(cpu.mv(a, v), cpu.mm(a, v[:, None])[:, 0])
    assert torch.equal(cpu.mv(a[:1], v), cpu.mv(a, v)[:1])
    assert torch.equal(cpu.dot(a[0], v), cpu.mv(a[:1], v)[0])


def test_integer_matmul_and_sum_take_the_native_exact_kernel(mode):
    a = torch.arange(12, dtype=torch.int64).reshape(3, 4)
    assert torch.equal(cpu.mm(a, a.t()), torch.ops.aten.mm.out(a, a.t(), out=a.new_empty(3, 3)))
    assert cpu.sum_dim(a, [1]).tolist() == [6, 22, 38]
    assert cpu.sum_dim(a.bool(), [1]).dtype == torch.int64


def test_the_portable_product_does_not_depend_on_the_blas():
    """Portable: the bits are the fixed-point definition, whatever torch's mm would do."""
    from detsample.invariant import exact

    g = _gen(7)
    x, w = torch.randn(5, 300, generator=g), torch.randn(300, 20, generator=g)
    with batch_invariant(portable=True):
        assert torch.equal(cpu.mm(x, w), exact.matmul(x, w))
    with batch_invariant():
        assert not torch.equal(cpu.mm(x, w), exact.matmul(x, w))  # the fast path is BLAS


# -- reductions ----------------------------------------------------------------------------

WIDTHS = [1, 7, 100, 4096, 8193, 40000, 70000]


@pytest.mark.parametrize("threads", THREADS)
@pytest.mark.parametrize("n", WIDTHS)
def test_row_sums_do_not_depend_on_the_batch(n, threads, mode):
    x = torch.randn(5, n, generator=_gen(n))
    with torch_threads(threads):
        _rows_alone_equal(lambda a: cpu.sum_dim(a, [-1]), x, counts=[1, 2, 3, 5])
        _rows_alone_equal(lambda a: cpu.mean_dim(a, [-1], True), x, counts=[1, 2, 5])


def test_verified_row_sum_is_torchs_serial_sum_and_portable_the_tree():
    """Same model, same bits: in the verified variant a row up to 8192 wide reduces as
    torch's own serial loop does (mean = sum / count, as torch's CPU mean); in the
    portable one by the fixed tree."""
    from detsample.invariant.tree import tree_sum

    x = torch.randn(3, 8192, generator=_gen(7))
    with torch_threads(1):
        with batch_invariant():
            assert torch.equal(cpu.sum_dim(x, [-1]), x.sum(-1))
            assert torch.equal(cpu.mean_dim(x[:, :256], [-1], True), x[:, :256].mean(-1, keepdim=True))
        with batch_invariant(portable=True):
            assert torch.equal(cpu.sum_dim(x, [-1]), tree_sum(x))


def test_native_sum_splits_a_long_row_at_two_threads():
    """Negative control: torch sums a 65536-element row alone with both threads (split
    in two) but one row per thread in a batch of two: other bits."""
    x = torch.randn(2, 65536, generator=_gen(8))
    with torch_threads(2):
        assert not torch.equal(x[:1].sum(-1), x.sum(-1)[:1])


def test_sum_over_other_dims_and_dtypes(mode):
    x = torch.randn(4, 6, 5, generator=_gen(9))
    a = x.double().numpy()
    assert np.allclose(cpu.sum_dim(x, [0, 2]).numpy(), a.sum((0, 2)), atol=1e-5)
    assert cpu.sum_dim(x, [1], True).shape == (4, 1, 5)
    assert np.allclose(cpu.sum_all(x).numpy(), a.sum(), atol=1e-4)
    assert np.allclose(cpu.mean_all(x).numpy(), a.mean(), atol=1e-6)
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
    ("expm1", cpu.expm1, torch.expm1),
    ("softplus", lambda x: cpu.softplus(x, 1, 20), F.softplus),
    ("tanh", cpu.tanh, torch.tanh),
    ("log", lambda x: cpu.log(x.abs() + 0.1), lambda x: torch.log(x.abs() + 0.1)),
    ("cos", cpu.cos, torch.cos),
    ("rsqrt", lambda x: cpu.rsqrt(x.abs() + 0.1), lambda x: torch.rsqrt(x.abs() + 0.1)),
    ("pow1.5", lambda x: cpu.pow_scalar(x.abs(), 1.5), lambda x: x.abs().pow(1.5)),
]


@pytest.mark.parametrize("threads", THREADS)
@pytest.mark.parametrize("name,fn,native", POINTWISE, ids=[p[0] for p in POINTWISE])
def test_pointwise_rows_do_not_depend_on_the_batch(name, fn, native, threads, mode):
    x = torch.randn(40, 23, generator=_gen(10)) * 3
    big = torch.randn(3, 20001, generator=_gen(11)) * 3  # > GRAIN elements: threads split
    with torch_threads(threads):
        _rows_alone_equal(fn, x, counts=[1, 2, 3, 7, 40])
        _rows_alone_equal(fn, big, counts=[1, 2, 3])


#: each POINTWISE op's defined function (detsample.arith.pointwise), on the same input
DEFINED = {
    "silu": defined.silu,
    "sigmoid": defined.sigmoid,
    "gelu_tanh": lambda x: defined.gelu(x, "tanh"),
    "exp": defined.exp,
    "expm1": defined.expm1,
    "softplus": defined.softplus,
    "tanh": defined.tanh,
    "log": lambda x: defined.log(x.abs() + 0.1),
    "cos": defined.cos,
    "rsqrt": lambda x: defined.rsqrt(x.abs() + 0.1),
    "pow1.5": lambda x: defined.pow_scalar(x.abs(), 1.5),
}


@pytest.mark.parametrize("name,fn,native", POINTWISE, ids=[p[0] for p in POINTWISE])
def test_pointwise_is_torchs_vector_loop_or_detsamples_definition(name, fn, native):
    """Verified: the same formula as torch's vector loop (only the scalar tail is
    avoided: a multiple of every vector step). Portable: detsample's defined function."""
    x = torch.randn(4 * PAD, generator=_gen(12)) * 3
    torchs = native(x)
    with batch_invariant():
        assert torch.equal(fn(x), torchs)
    with batch_invariant(portable=True):
        got = fn(x)
    assert torch.equal(got.view(torch.int32), DEFINED[name](x).view(torch.int32))
    if name == "silu":  # float32 arithmetic in torch's: some elements 1 ulp off
        assert not torch.equal(got, torchs), "the portable silu is torch's kernel"


def test_native_silu_rounds_its_scalar_tail_differently():
    """Negative control: torch's silu gives an element different bits in a 15-element
    tensor (scalar loop) than in a long one (vector loop)."""
    x = torch.randn(4096, generator=_gen(12)) * 3
    tails = torch.cat([F.silu(x[s : s + 15]) for s in range(0, 4095, 15)])
    assert not torch.equal(tails, F.silu(x)[:4095])
    with batch_invariant():
        assert torch.equal(torch.cat([cpu.silu(x[s : s + 15]) for s in range(0, 4095, 15)]), cpu.silu(x)[:4095])


def test_pointwise_keeps_shape_dtype_and_promotes_integers(mode):
    x = torch.randn(3, 5, 7, generator=_gen(13)).transpose(0, 2)
    assert cpu.silu(x).shape == x.shape and torch.equal(cpu.silu(x), cpu.silu(x.contiguous()))
    assert cpu.exp(x.bfloat16()).dtype == torch.bfloat16
    assert cpu.exp(torch.arange(3)).dtype == torch.float32
    assert cpu.pow_scalar(torch.arange(3), 2).tolist() == [0, 1, 4]


# -- softmax and normalisation -------------------------------------------------------------


@pytest.mark.parametrize("threads", THREADS)
@pytest.mark.parametrize("n", [1, 17, 512, 40000])
def test_softmax_rows_do_not_depend_on_the_batch(n, threads, mode):
    x = torch.randn(5, n, generator=_gen(n + 1)) * 4
    with torch_threads(threads):
        _rows_alone_equal(lambda a: cpu.softmax(a, -1, False), x, counts=[1, 2, 5])
        _rows_alone_equal(lambda a: cpu.log_softmax(a, 1, False), x, counts=[1, 2, 5])
    assert torch.allclose(cpu.softmax(x, -1, False).double(), _np_softmax(x, -1), atol=1e-6)
    assert torch.allclose(cpu.log_softmax(x, -1, False).double(), _np_softmax(x, -1, True), atol=1e-5)


def test_softmax_other_dims_and_half_to_float(mode):
    x = torch.randn(4, 6, 3, generator=_gen(14))
    assert torch.allclose(cpu.softmax(x, 1, False).double(), _np_softmax(x, 1), atol=1e-6)
    assert torch.allclose(cpu.log_softmax(x, 0, False).double(), _np_softmax(x, 0, True), atol=1e-5)
    y = cpu.softmax(x.half(), -1, True)
    assert y.dtype == torch.float32
    assert torch.allclose(y.double(), _np_softmax(x.half().float(), -1), atol=1e-6)
    assert cpu.softmax(torch.empty(0, 3), -1, False).shape == (0, 3)


@pytest.mark.parametrize("threads", THREADS)
def test_layer_norm_rows_do_not_depend_on_the_batch(threads, mode):
    g = _gen(15)
    x = torch.randn(9, 100, generator=g)
    w, b = torch.randn(100, generator=g), torch.randn(100, generator=g)
    with torch_threads(threads):
        _rows_alone_equal(lambda a: cpu.native_layer_norm(a, [100], w, b, 1e-5)[0], x, counts=[1, 3, 9])
    out, mean, rstd = cpu.native_layer_norm(x, [100], w, b, 1e-5)
    a = x.double().numpy()
    rmean = a.mean(1, keepdims=True)
    rrstd = 1 / np.sqrt(((a - rmean) ** 2).mean(1, keepdims=True) + 1e-5)
    ref = (a - rmean) * rrstd * w.double().numpy() + b.double().numpy()
    assert np.allclose(out.numpy(), ref, atol=1e-5)
    assert mean.shape == rmean.shape and rstd.shape == rrstd.shape
    assert np.allclose(rstd.numpy(), rrstd, rtol=1e-5)
    with pytest.raises(RuntimeError, match="normalized_shape"):
        cpu.native_layer_norm(x, [99], None, None, 1e-5)


def test_safe_softmax_zeroes_fully_masked_rows(mode):
    x = torch.randn(3, 5, generator=_gen(16))
    x[1] = float("-inf")
    y = cpu.safe_softmax(x, -1)
    assert torch.equal(y[1], torch.zeros(5)) and torch.equal(y[0], cpu.softmax(x[:1], -1, False)[0])


@pytest.mark.parametrize("layout", ["nt", "nn"])
def test_a_misaligned_b_is_copied_with_the_checked_strides(layout):
    """MKL's AMD path rounds by an operand's alignment: a B that does not start on a
    64-byte boundary is copied to one that does, keeping the strides the check's operand
    has (a padded leading dimension would be one more input the check never saw)."""
    g = torch.Generator().manual_seed(3)
    w = torch.randn(7, 200, generator=g)
    b = w.t() if layout == "nt" else w.t().contiguous()
    odd = _misaligned(b.t().contiguous() if layout == "nt" else b, 1)
    odd = odd.t() if layout == "nt" else odd
    assert odd.data_ptr() % 64 != 0 and odd.stride() == b.stride()
    got = tiles._aligned_b(odd)
    assert got.data_ptr() % 64 == 0 and got.stride() == b.stride() and torch.equal(got, b)
    x = torch.randn(9, 200, generator=g)
    with batch_invariant(), torch_threads(2):
        assert torch.equal(x @ odd, x @ b)
