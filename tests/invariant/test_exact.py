"""The portable product: the float32 nearest to the exact dot product, bit for bit the oracle.

Pins: a float64 GEMM rounded to float32 without its error bound (double rounding: 2**24
for 2**24 + 1 + 2**-30), a stage that settles an element otherwise than the others
would, ties not to even, an exact zero as -0.0, a row that depends on its neighbours,
non-finite values leaking into other rows, a zero-weight key (the attention's future and
padded keys) that moves a weighted sum, and the precision loss of the fixed-point product
this replaced on rows with massive activations.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from detsample.invariant import exact as ex
from detsample.invariant import exact_jit
from detsample.probe.threads import torch_threads
from oracles import invariant as oracle
from tests.arith.fma import FMA, cpu_has_fma, fresh_asm


def _rand(shape, seed: int, family: str) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g)
    if family == "spread":  # exponents spread over 2**-40 .. 2**40 within a row
        x = x * torch.exp2(torch.randint(-40, 41, shape, generator=g).float())
    elif family == "huge":
        x = x * 1e30
    elif family == "tiny":
        x = x * 1e-30
    elif family == "ties":  # few distinct values: exact ties and cancellations
        x = torch.randint(-3, 4, shape, generator=g).float() * 0.5
    elif family == "sparse":
        x = x * (torch.rand(shape, generator=g) < 0.2)
    elif family == "massive":  # massive activations: every 97th channel 10**4 x the rest
        x[..., ::97] *= 1e4
    elif family == "cancel":  # pairs that cancel exactly, and a small remainder
        x[..., 1::2] = -x[..., 0::2][..., : x[..., 1::2].shape[-1]]
        x[..., -1:] *= 2.0**-20
    return x


FAMILIES = ["normal", "spread", "huge", "tiny", "ties", "sparse", "massive", "cancel"]


def _bits_equal(x: torch.Tensor, y: np.ndarray) -> bool:
    return np.array_equal(x.numpy().view(np.int32), np.asarray(y, np.float32).view(np.int32))


@settings(max_examples=40, deadline=None)
@given(
    m=st.integers(1, 5),
    k=st.integers(1, 600),
    n=st.integers(1, 5),
    fa=st.sampled_from(FAMILIES),
    fb=st.sampled_from(FAMILIES),
    seed=st.integers(0, 2**16),
)
def test_matmul_is_the_oracle_bit_for_bit(m, k, n, fa, fb, seed):
    a, b = _rand((m, k), seed, fa), _rand((k, n), seed + 1, fb)
    assert _bits_equal(ex.matmul(a, b), oracle.matmul(a.numpy(), b.numpy()))


@settings(max_examples=25, deadline=None)
@given(
    m=st.integers(1, 4),
    k=st.integers(1, 300),
    n=st.integers(1, 4),
    fp_=st.sampled_from(FAMILIES),
    fv=st.sampled_from(FAMILIES),
    seed=st.integers(0, 2**16),
)
def test_weighted_sum_is_the_oracle_bit_for_bit(m, k, n, fp_, fv, seed):
    p, v = _rand((m, k), seed, fp_).abs(), _rand((k, n), seed + 1, fv)
    assert _bits_equal(ex.weighted_sum(p, v), oracle.weighted_sum(p.numpy(), v.numpy()))


DOUBLE_ROUNDING = [
    # S = 2**24 + 1 + 2**-30: float64 rounds it to the float32 midpoint 2**24 + 1, which
    # ties to even (2**24); S itself rounds up to 2**24 + 2
    ([2.0**24, 1.0, 2.0**-30], 2.0**24 + 2),
    ([2.0**24, 1.0, -(2.0**-30)], 2.0**24),
    ([2.0**24, 1.0], 2.0**24),  # an exact tie: to even
    ([2.0**24, 3.0], 2.0**24 + 4),  # an exact tie: to even (upwards)
    ([1.0, -1.0, 2.0**-149], 2.0**-149),  # cancellation to the smallest subnormal
    ([1.0, -1.0], 0.0),
]


@pytest.fixture(params=["numba", "torch"])
def stages(request, monkeypatch):
    """The numba kernels, or the torch stages (what runs without numba)."""
    if request.param == "torch":
        monkeypatch.setattr(ex, "_jit_for", lambda *tensors: None)
    return request.param


@pytest.mark.parametrize("terms, want", DOUBLE_ROUNDING)
def test_double_rounding_and_ties_give_the_nearest_float32(terms, want, stages):
    """The trap of a float64 GEMM rounded to float32: rounding twice. Pinned: stage 1
    without its error bound returns 2**24 for the first case -- by the float64 GEMM (B
    by rows), by the decode kernel (B's columns contiguous: its bound, or the norms it
    computes for B, set to zero fails here) and by the keyed kernel of the value
    product (its magnitude set to zero fails here)."""
    a = torch.tensor([terms], dtype=torch.float32)
    for b in (torch.ones(len(terms), 2)[:, :1], torch.ones(len(terms), 1)):
        for got in (ex.matmul(a, b), ex.weighted_sum(a, b)):
            assert got.item() == want and not torch.signbit(got).item()
            assert _bits_equal(got, oracle.matmul(a.numpy(), b.numpy()))


def test_a_one_term_product_on_a_midpoint_rounds_to_even(stages):
    """(1 + 2**-23) * 1.5 is a float32 midpoint: it rounds to even, 1.5 + 2**-22, on
    either side of zero. Pinned: the torch stage 2 added its error sum into its input in
    place, which for one term is a view of the products stage 3 then read (1 ulp low)."""
    a = torch.tensor([[1.0 + 2.0**-23], [-(1.0 + 2.0**-23)]])
    got = ex.matmul(a, torch.tensor([[1.5]]))
    assert got[:, 0].tolist() == [1.5 + 2.0**-22, -(1.5 + 2.0**-22)]
    assert torch.equal(ex.weighted_sum(a.abs(), torch.tensor([[1.5]]))[:, 0], got[0].expand(2))


def test_a_bound_of_zero_would_round_twice(monkeypatch):
    """Negative control: stage 1 trusting the float64 GEMM (no error bound) is wrong."""
    monkeypatch.setattr(ex, "gamma", lambda k: 0.0)
    monkeypatch.setattr(ex, "_ULP", 0.0)
    a = torch.tensor([DOUBLE_ROUNDING[0][0]], dtype=torch.float32)
    assert ex.matmul(a, torch.ones(3, 1)).item() == 2.0**24


@pytest.mark.parametrize("family", ["normal", "massive", "cancel", "ties"])
def test_every_stage_gives_the_same_bits(family, monkeypatch):
    """Stage 1 settles most elements, stage 2 (TwoSum) the rest, stage 3 (fsum) what
    stage 2 cannot, in numba kernels or in torch stages: forcing every element past the
    numba stages 1 and 2 (into the numba fsum), then through the torch stage 2 (a TwoSum
    tree), then through the torch stage 3, changes no bit."""
    a, b = _rand((6, 700), 21, family), _rand((700, 7), 22, "normal")
    want = ex.matmul(a, b)
    monkeypatch.setattr(ex, "gamma", lambda k: 1e300)  # no error bound settles anything
    assert torch.equal(ex.matmul(a, b).view(torch.int32), want.view(torch.int32))
    monkeypatch.setattr(ex, "_jit_for", lambda *tensors: None)  # the torch stages
    assert torch.equal(ex.matmul(a, b).view(torch.int32), want.view(torch.int32))
    real = ex._second_pass
    monkeypatch.setattr(ex, "_second_pass", lambda p: (real(p)[0], torch.ones(p.shape[0], dtype=torch.bool)))
    assert torch.equal(ex.matmul(a, b).view(torch.int32), want.view(torch.int32))


def test_a_row_depends_on_itself_only():
    a, b = _rand((12, 300), 5, "spread"), _rand((300, 40), 6, "normal")
    full = ex.matmul(a, b)
    for i in range(12):
        assert torch.equal(ex.matmul(a[i : i + 1], b), full[i : i + 1])
    batched = ex.matmul(torch.stack([a, a.flip(0)]), torch.stack([b, b]))
    assert torch.equal(batched[0], full) and torch.equal(batched[1], full.flip(0))


def test_a_zero_weight_key_changes_nothing_in_weighted_sum():
    """The attention relies on it: future and padded keys have weight 0, whatever they
    hold (a non-finite value included); the plain product makes such a column NaN."""
    p, v = _rand((4, 128), 7, "normal").abs(), _rand((128, 65), 8, "spread")
    p[:, 100:] = 0
    other = v.clone()
    other[100:] = _rand((28, 65), 9, "huge")
    other[120, 3] = float("inf")
    assert torch.equal(ex.weighted_sum(p, v), ex.weighted_sum(p, other))
    assert torch.isnan(ex.matmul(p, other)[:, 3]).all()


def test_non_finite_values_poison_only_their_row_and_column():
    a, b = _rand((4, 50), 10, "normal"), _rand((50, 5), 11, "normal")
    a[1, 3] = float("nan")
    b[7, 2] = float("inf")
    c = ex.matmul(a, b)
    assert torch.isnan(c[1]).all() and torch.isnan(c[:, 2]).all()
    ok = torch.ones(4, 5, dtype=torch.bool)
    ok[1], ok[:, 2] = False, False
    clean = ex.matmul(torch.where(torch.isfinite(a), a, 0.0), torch.where(torch.isfinite(b), b, 0.0))
    assert torch.equal(c[ok], clean[ok])
    v = _rand((50, 5), 12, "normal")
    v[9, 0] = float("nan")
    p = _rand((3, 50), 13, "normal").abs()
    p[0, 9] = 0.0
    w = ex.weighted_sum(p, v)
    assert not torch.isnan(w[0]).any() and torch.isnan(w[1:]).all()


@pytest.mark.parametrize("family", ["normal", "spread", "massive", "cancel"])
def test_at_least_as_accurate_as_float32_blas_element_by_element(family):
    """Every element within half a float32 ulp of the exact product, hence never further
    from it than float32 BLAS's. Massive activations (a row's largest magnitude 10**4 x
    its median, meeting small weights) are where a fixed-point product lost 10 bits."""
    a, b = _rand((32, 1024), 14, family), _rand((1024, 48), 15, "normal")
    b[::97] *= 1e-4  # the massive channels meet small weights
    exact = a.double() @ b.double()  # error ~2**-40 relative: far below
    got, blas = ex.matmul(a, b).double(), (a @ b).double()
    slack = exact.abs() * 2.0**-40 + 2.0**-140
    assert bool(((got - exact).abs() <= (blas - exact).abs() + slack).all())
    half_ulp = torch.where(exact == 0, 0.0, torch.exp2(torch.frexp(exact)[1].double() - 25))
    assert bool(((got - exact).abs() <= half_ulp + slack).all())


def test_reduced_precision_inputs_are_exact_in_float32_and_round_once():
    a, b = _rand((3, 70), 16, "normal").bfloat16(), _rand((70, 4), 17, "normal").bfloat16()
    assert torch.equal(ex.matmul(a, b), ex.matmul(a.float(), b.float()).bfloat16())
    assert ex.matmul(a, b).dtype == torch.bfloat16


LAYOUTS = ["contiguous", "transposed", "every-other", "transposed-every-other"]


def _laid_out(x: torch.Tensor, how: str) -> torch.Tensor:
    """``x``'s values in another memory layout: the transpose of a contiguous (.., C, R)
    tensor, and/or every other matrix of a buffer twice as long (the attention's key and
    value blocks)."""
    if how.startswith("transposed"):
        x = x.transpose(-1, -2).contiguous().transpose(-1, -2)
    if how.endswith("every-other") and x.dim() == 3:
        x = torch.stack([x, torch.full_like(x, float("nan"))], dim=1)[:, 0]
    return x


def _holes(x: torch.Tensor, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    where = torch.rand(x.shape, generator=g) < 0.01
    return x.masked_fill(where, float("nan")).masked_fill(where.roll(1, -1) & ~where, float("-inf"))


@settings(max_examples=20, deadline=None)
@given(
    nb=st.integers(0, 3),
    m=st.integers(1, 40),
    k=st.integers(1, 700),
    n=st.integers(1, 40),
    fa=st.sampled_from(FAMILIES),
    fb=st.sampled_from(FAMILIES),
    seed=st.integers(0, 2**16),
    holes=st.booleans(),
    lay_a=st.sampled_from(LAYOUTS),
    lay_b=st.sampled_from(LAYOUTS),
)
def test_the_numba_stages_give_the_torch_stages_bits(nb, m, k, n, fa, fb, seed, holes, lay_a, lay_b):
    """The numba kernels (stage 1 in one pass, stages 2 and 3 per element, the
    operands' preparation by rows and by columns) against the torch stages they replace,
    on batched and 2-D operands in the layouts the mode passes (transposed keys, blocks
    that are every other matrix of a buffer), with non-finite entries: the same bits, and
    the same for the attention's weighted sum."""
    lead = (nb,) if nb else ()
    a, b = _rand(lead + (m, k), seed, fa), _rand(lead + (k, n), seed + 1, fb)
    if holes:
        a, b = _holes(a, seed), _holes(b, seed + 1)
    a, b = _laid_out(a, lay_a), _laid_out(b, lay_b)
    p = _laid_out(_rand(lead + (m, k), seed + 2, fa).abs(), lay_a)
    got = (ex.matmul(a, b), ex.weighted_sum(p, b))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(ex, "_jit_for", lambda *tensors: None)
        want = (ex.matmul(a, b), ex.weighted_sum(p, b))
    for x, y in zip(got, want):
        assert torch.equal(x.view(torch.int32), y.view(torch.int32))


def _exact_norms(values: np.ndarray, along: int) -> np.ndarray:
    """The exact Euclidean norm of every 32-long K-block (``along``: the K axis), as
    float64 rounded down from fsum's correctly rounded sum of the exact squares."""
    import math

    v = np.moveaxis(values, along, -1)
    k = v.shape[-1]
    out = np.empty(v.shape[:-1] + (-(-k // ex.BLOCK),))
    for idx in np.ndindex(v.shape[:-1]):
        for b in range(out.shape[-1]):
            sq = math.fsum(float(x) * float(x) for x in v[idx][b * ex.BLOCK : (b + 1) * ex.BLOCK])
            out[idx + (b,)] = np.nextafter(math.sqrt(sq), 0.0)
    return np.moveaxis(out, -1, along)


@settings(max_examples=25, deadline=None)
@given(
    nb=st.integers(1, 4),
    m=st.integers(1, 9),
    k=st.integers(1, 100),
    family=st.sampled_from(FAMILIES),
    seed=st.integers(0, 2**16),
    holes=st.booleans(),
    sliced=st.booleans(),
)
def test_the_vectorised_preparation_is_the_checked_one(nb, m, k, family, seed, holes, sliced):
    """The operands' preparation on contiguous matrices (a batch, or slices of one as the
    attention's key blocks are: the vectorised kernels, with their block sums in any
    order) against the kernels that read any strides: the same float64 values, the same
    non-finite flags (rows; columns and keys), and block norms that still bound the exact
    ones from above."""
    x = _rand((nb, m + 3, k), seed, family)
    if holes:
        x = _holes(x, seed)
    x = x[:, 1 : m + 1] if sliced else x[:, :m].contiguous()  # rows: slices of each matrix
    mats = x.numpy()
    assert ex._dense(mats) is not None
    with pytest.MonkeyPatch.context() as mp:
        got_rows = ex._prepare_rows(exact_jit, x)
        got_cols = ex._prepare_cols(exact_jit, x)
        mp.setattr(ex, "_dense", lambda mats: None)
        want_rows = ex._prepare_rows(exact_jit, x)
        want_cols = ex._prepare_cols(exact_jit, x)
    for (got, got_keys), (want, want_keys), along in [
        ((got_rows, None), (want_rows, None), -1),
        (got_cols, want_cols, -2),
    ]:
        assert torch.equal(got.values, want.values)
        for f, g in [(got.bad, want.bad), (got_keys, want_keys)]:
            assert (f is None) == (g is None) and (f is None or torch.equal(f, g))
        exact = _exact_norms(got.values.numpy(), along)
        assert (got.blocks.numpy() >= exact).all()


def test_a_batch_of_slices_is_read_in_place():
    """The attention's key blocks (128-key slices of one tensor): one flat view of the
    buffer and the matrices' stride, no copy; a layout whose matrices are not contiguous
    takes the strided kernels."""
    kb = torch.randn(6, 384, 64)
    mats = kb[:, 128:256].numpy()
    flat, stride = ex._dense(mats)
    assert stride == 384 * 64 and np.shares_memory(flat, kb.numpy())
    for i in range(6):
        assert np.array_equal(flat[i * stride : i * stride + 128 * 64], mats[i].reshape(-1))
    assert ex._dense(kb[:, :, :32].numpy()) is None


@settings(max_examples=40, deadline=None)
@given(
    m=st.integers(1, ex.DECODE_ROWS),
    k=st.integers(1, 700),
    n=st.integers(1, 70),
    fa=st.sampled_from(FAMILIES),
    fb=st.sampled_from(FAMILIES),
    seed=st.integers(0, 2**16),
    holes=st.booleans(),
)
def test_a_decode_product_reads_the_float32_weight_and_gives_the_same_bits(m, k, n, fa, fb, seed, holes):
    """A product of a few rows with a weight (``F.linear``'s layout: B's columns
    contiguous) runs stage 1 over the float32 weight, no float64 GEMM (rows in fours
    and a tail, columns in pairs and tiles of 32, K in several 256-chunks): the oracle's
    bits (its first rows and columns: the exact rationals are slow), and the torch
    stages' everywhere, with non-finite entries too (NaN in their rows and columns only)."""
    a, w = _rand((m, k), seed, fa), _rand((n, k), seed + 1, fb)
    if holes:
        a, w = _holes(a, seed), _holes(w, seed + 1)
    b = w.t()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(ex, "dot64", lambda *args: pytest.fail("the float64 GEMM ran"))
        got = ex.matmul(a, b)
    if not holes:
        assert _bits_equal(got[:5, :5].contiguous(), oracle.matmul(a[:5].numpy(), b[:, :5].numpy()))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(ex, "_jit_for", lambda *tensors: None)
        want = ex.matmul(a, b)
    assert torch.equal(got.view(torch.int32), want.view(torch.int32))


@settings(max_examples=30, deadline=None)
@given(
    nb=st.integers(1, 5),
    m=st.integers(1, 9),
    k=st.integers(1, 300),
    n=st.integers(1, 40),
    fa=st.sampled_from(FAMILIES),
    fb=st.sampled_from(FAMILIES),
    seed=st.integers(0, 2**16),
    holes=st.booleans(),
    sliced=st.booleans(),
)
def test_the_attention_scores_read_the_float32_keys_and_give_the_same_bits(nb, m, k, n, fa, fb, seed, holes, sliced):
    """Batched ``q @ K^T`` with the keys as rows (the attention's key blocks: each
    matrix contiguous, or slices of one tensor): the decode kernel over the float32 keys,
    their block norms computed by the kernel as it reads each key (no float64 copy, no
    float64 GEMM; a non-finite key: the norms and flags prepared, then the kernel), rows
    in groups of 4 with a padded group of 2 or 3 (a 3-query group), stages 2-3 reading
    the float32 keys: the torch stages' bits, with non-finite keys and queries too, and
    the oracle's on a first matrix."""
    q, keys = _rand((nb, m, k), seed, fa), _rand((nb, n + 5, k), seed + 1, fb)
    if holes:
        q, keys = _holes(q, seed), _holes(keys, seed + 1)
    keys = keys[:, 2 : n + 2] if sliced else keys[:, :n].contiguous()
    b = keys.transpose(1, 2)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(ex, "dot64", lambda *args: pytest.fail("the float64 GEMM ran"))
        mp.setattr(ex, "prepare_b", lambda *args: pytest.fail("B's float64 copy was made"))
        got = ex.matmul(q, b)
    if not holes:
        assert _bits_equal(got[0, :4, :4].contiguous(), oracle.matmul(q[0, :4].numpy(), b[0, :, :4].numpy()))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(ex, "_jit_for", lambda *tensors: None)
        want = ex.matmul(q, b)
    assert torch.equal(got.view(torch.int32), want.view(torch.int32))


@settings(max_examples=30, deadline=None)
@given(
    nb=st.integers(1, 5),
    m=st.integers(1, 9),
    k=st.integers(1, 700),
    n=st.integers(1, 140),
    fp_=st.sampled_from(FAMILIES),
    fv=st.sampled_from(FAMILIES),
    seed=st.integers(0, 2**16),
    holes=st.booleans(),
    sliced=st.booleans(),
)
def test_the_value_product_reads_the_float32_values_and_gives_the_same_bits(nb, m, k, n, fp_, fv, seed, holes, sliced):
    """Batched ``p @ V`` of the attention (weights with zeros over value blocks, each
    matrix contiguous, or slices of one tensor): the keyed kernel over the float32
    values in their own layout -- K in several 256-chunks, keys in fours with a tail,
    columns in tiles (past 128: two) -- no float64 copy of V, no float64 GEMM; a
    non-finite value: the prepared path and its zero-weight rule. The torch stages'
    bits, and the oracle's on a first matrix."""
    p = _rand((nb, m, k), seed, fp_).abs() * (_rand((nb, m, k), seed + 2, "normal") > -0.5)
    v = _rand((nb, k + 5, n), seed + 1, fv)
    if holes:
        p, v = _holes(p, seed), _holes(v, seed + 1)
    v = v[:, 2 : k + 2] if sliced else v[:, :k].contiguous()
    finite = bool(torch.isfinite(v).all())
    assert (ex._keyed_first_pass(ex.prepare(p, -1), v) is not None) == finite
    with pytest.MonkeyPatch.context() as mp:
        if finite:  # else the prepared path, which runs the float64 GEMM
            mp.setattr(ex, "dot64", lambda *args: pytest.fail("the float64 GEMM ran"))
        got = ex.weighted_sum(p, v)
    if not holes:
        assert _bits_equal(got[0, :3, :4].contiguous(), oracle.weighted_sum(p[0, :3].numpy(), v[0, :, :4].numpy()))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(ex, "_jit_for", lambda *tensors: None)
        want = ex.weighted_sum(p, v)
    assert torch.equal(got.view(torch.int32), want.view(torch.int32))


def test_a_non_finite_value_leaves_the_keyed_kernel_for_the_zero_weight_rule():
    """The keyed kernel refuses V with a non-finite value wherever it lies (first or
    last key, a tail of keys past a multiple of four, a second tile of columns), so the
    prepared path's rule applies: a row that weighs the key 0 is unchanged."""
    p, v = _rand((2, 3, 130), 40, "normal").abs(), _rand((2, 130, 140), 41, "normal")
    fa = ex.prepare(p, -1)
    assert ex._keyed_first_pass(fa, v) is not None
    many = ex.prepare(_rand((2, ex.KEYED_ROWS + 1, 130), 42, "normal").abs(), -1)
    assert ex._keyed_first_pass(many, v) is None  # past its rows the prepared path is faster
    for key, col, value in [(0, 0, float("inf")), (129, 139, float("nan")), (128, 70, -float("inf"))]:
        bad = v.clone()
        bad[1, key, col] = value
        assert ex._keyed_first_pass(fa, bad) is None
        zero = p.clone()
        zero[1, 0, key] = 0.0
        got = ex.weighted_sum(zero, bad)
        assert torch.equal(got[1, 0], ex.weighted_sum(zero[1, :1], v[1])[0])
        assert torch.isnan(got[1, 1:]).all() and torch.equal(got[0], ex.weighted_sum(zero[0], v[0]))


@pytest.mark.parametrize(
    "shape", [(2, 0, 3), (0, 5, 3), (2, 5, 0), (2, 3, 0, 4), (0, 3, 5, 4), (2, 0, 5, 4), (2, 3, 5, 0)]
)
@pytest.mark.parametrize("weight", [False, True])
def test_an_empty_dimension_gives_the_empty_or_zero_product(shape, weight):
    """Pinned: a product with K = 0 or N = 0 and B in ``F.linear``'s layout crashed (the
    decode kernel's view of an empty weight), and a batched one with N = 0 in stage 1 (a
    row view of no element). Every empty case gives what the torch stages give: zeros
    for K = 0, an empty result otherwise, for the plain product and the value product."""
    *lead, m, k, n = shape
    a = _rand((*lead, m, k), 50, "normal")
    b = _rand((*lead, n, k), 51, "normal").mT if weight else _rand((*lead, k, n), 51, "normal")
    got, value = ex.matmul(a, b), ex.weighted_sum(a.abs(), b)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(ex, "_jit_for", lambda *tensors: None)
        want, value_want = ex.matmul(a, b), ex.weighted_sum(a.abs(), b)
    assert got.shape == want.shape == (*lead, m, n) and value.shape == value_want.shape
    assert torch.equal(got.view(torch.int32), want.view(torch.int32))
    assert torch.equal(value.view(torch.int32), value_want.view(torch.int32))
    assert not bool(got.any()) and not bool(value.any())  # K = 0: zeros; else empty


@pytest.mark.parametrize(
    "rows, layout",
    # the float64 GEMM; the decode kernel over a weight's columns; over keys (their norms
    # computed as read); the keyed kernel over values
    [(160, "plain"), (7, "weight"), (7, "keys"), (7, "values")],
)
def test_a_split_over_threads_changes_no_bit(monkeypatch, rows, layout):
    """Large enough that every kernel splits its rows or elements over two threads (and
    every element is forced into stages 2 and 3): the bits of one thread."""
    a, b = _rand((rows, 520), 31, "massive"), _rand((520, 400), 32, "cancel")
    if layout == "values":
        a, b = a.abs().expand(3, -1, -1), b.expand(3, -1, -1)
    if layout in ("weight", "keys"):
        b = b.t().contiguous().t()
    fb = ex.prepare_b(b) if layout == "weight" else None
    product = ex.weighted_sum if layout == "values" else lambda a, b: ex.matmul(a, b, fb)
    monkeypatch.setattr(ex, "gamma", lambda k: 1e300)
    with torch_threads(1):
        one = product(a, b)
    with torch_threads(2):
        two = product(a, b)
    assert torch.equal(one.view(torch.int32), two.view(torch.int32))
    a2, b2 = (a[0], b[0]) if layout == "values" else (a, b)
    want = (oracle.weighted_sum if layout == "values" else oracle.matmul)(a2[:3].numpy(), b2[:, :3].numpy())
    assert _bits_equal((two[0] if layout == "values" else two)[:3, :3].contiguous(), want)


_PREP = (32, 1.0, 1.0)  # block, pre, post


def _rows_out() -> tuple:
    return np.empty((1, 2, 64)), np.empty((1, 2, 2)), np.empty((1, 2), np.bool_)


def _cols_out() -> tuple:
    return np.empty((1, 64, 4)), np.empty((1, 2, 4)), np.empty((1, 4), np.bool_), np.empty((1, 64), np.bool_)


KERNELS = {
    "first_pass_flat": lambda: (
        np.ones(8),
        np.ones(8),
        1.0,
        1e-15,
        np.empty(8, np.float32),
        np.empty(8, np.bool_),
        0,
        8,
    ),
    "prepare_rows": lambda: (np.ones((1, 2, 64), np.float32), *_PREP, *_rows_out(), 0, 2),
    "prepare_rows_dense": lambda: (
        np.ones(128, np.float32),
        64,
        (2, 64),
        *_PREP,
        np.empty(128),
        *_rows_out()[1:],
        0,
        2,
    ),
    "prepare_cols": lambda: (np.ones((1, 64, 4), np.float32), *_PREP, *_cols_out(), 0, 1),
    "prepare_cols_dense": lambda: (np.ones(256, np.float32), 256, (64, 4), *_PREP, *_cols_out(), 0, 1),
    "settle_rows": lambda: (np.ones((2, 8)), 1e-15, 1e-16, np.empty(2, np.float32), 0, 2),
    "keyed_first_pass": lambda: (
        np.ones(2 * 64),
        np.ones(64 * 4, np.float32),
        np.ones(64 * 4, np.int32),
        256,
        (1, 2, 64, 4),
        (256, 1.0, 1e-15, (1e-14, 2e-16)),
        np.empty(8, np.float32),
        np.empty(8, np.bool_),
        0,
        2,
    ),
    "settle_pairs": lambda: (
        np.ones((1, 2, 8)),
        np.ones((1, 8, 2)),
        np.arange(4),
        1e-15,
        1e-16,
        np.empty(4, np.float32),
        0,
        4,
    ),
}


@pytest.mark.parametrize("name", sorted(KERNELS))
def test_the_kernels_have_no_fused_multiply_add(name):
    """TwoSum is error free and the bounds hold only for the operations as written: a
    compiler contracting ``a * b + c`` into an FMA would break them silently. Positive
    control where the kernel's own body has a multiply feeding one add (the sums of squares)."""
    kernel = getattr(exact_jit, name)
    assert not FMA.search(fresh_asm(kernel, KERNELS[name](), fastmath=False))
    if cpu_has_fma() and name in ("prepare_rows", "prepare_cols"):
        assert FMA.search(fresh_asm(kernel, KERNELS[name](), fastmath=True))


#: the only kernels compiled with a fast-math flag, and their flags (exact_jit's docstring)
FAST_MATH = {
    "_row_squares": {"reassoc"},
    "_dots4": {"reassoc", "contract"},
    "_dots4x2": {"reassoc", "contract"},
    "_dot": {"reassoc", "contract"},
}


def test_only_the_sums_whose_bound_holds_in_any_order_have_fast_math():
    """Every numba kernel of exact_jit is strict but the sums whose bound holds in any
    order (the block norms' squares, the decode kernel's dot products), and those carry
    reassociation (and contraction for the exact products) only: no finite-math or
    reciprocal flag that could change what a non-finite value or a division gives."""
    import numba

    kernels = {n: k for n, k in vars(exact_jit).items() if isinstance(k, numba.core.registry.CPUDispatcher)}
    assert set(FAST_MATH) <= set(kernels)
    for name, kernel in kernels.items():
        flags = kernel.targetoptions.get("fastmath", False)
        assert (set(flags) if flags else set()) == FAST_MATH.get(name, set()), name


def test_the_block_sums_reassociate_and_nothing_else():
    """The one loop compiled with a fast-math flag (the block norms' sums of squares,
    whose bound holds in any order) has reassociation alone: no contraction (a square
    is exact, so an FMA would not change a bit today, but the flag would reach any
    multiply-add added to the loop), no finite-math assumption (a non-finite block must
    sum to a non-finite value: the checked path depends on it)."""
    flags = exact_jit._row_squares.targetoptions["fastmath"]
    assert set(flags) == {"reassoc"}
    args = (np.ones(64, np.float32), 0, 64, 32, np.empty(64), np.empty(2), 0)
    assert not FMA.search(fresh_asm(exact_jit._row_squares, args, fastmath={"reassoc"}))
    sums = np.empty(2)
    x = np.ones(64, np.float32)
    x[40] = np.inf
    exact_jit._row_squares(x, 0, 64, 32, np.empty(64), sums, 0)
    assert sums[0] == 32.0 and sums[1] == np.inf
