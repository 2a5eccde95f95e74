"""detsample's defined arithmetic (detsample/arith): the numba kernels, the torch
composition and the numpy oracle give the same bits; the bits are accurate.

Pins: an implementation that drifts from the definition (an FMA contracted by a compiler,
a Horner order where the definition says Estrin, a float32 subtraction where it says
float64, an order-dependent float sum, a special value mapped to the platform's NaN),
and a definition that loses accuracy (a truncated series, a wrong ln 2 split).
"""

from __future__ import annotations

import functools
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from detsample import arith
from detsample.arith import cpu, spec
from oracles import arith as oracle

SPECIALS = [
    0.0,
    -0.0,
    float("inf"),
    float("-inf"),
    float("nan"),
    88.72,
    88.73,
    89.0,
    89.5,
    -87.0,
    -87.4,
    -103.9,
    -104.0,
    -104.5,
    -150.0,
    1e-40,
    -1e-40,
    1e-30,
    -1e-8,
    3e38,
    -3e38,
    1.0,
    -1.0,
    0.5,
    -0.34657359,
    0.34657359,
]
IMPLS = ["numba", "torch"]


def bits(t: torch.Tensor) -> np.ndarray:
    a = t.numpy() if isinstance(t, torch.Tensor) else np.asarray(t)
    return a.view(np.int32 if a.dtype == np.float32 else np.int64)


def _exp_inputs() -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    return torch.cat(
        [
            torch.randn(300_000, generator=g) * 30,
            torch.randn(50_000, generator=g) * 1e-3,
            -torch.rand(50_000, generator=g) * 110,
            torch.tensor(SPECIALS),
        ]
    )


@pytest.mark.parametrize("impl", IMPLS)
def test_exp_is_the_oracles_bits(impl):
    z = _exp_inputs()
    assert np.array_equal(bits(arith.exp(z, impl=impl)), bits(oracle.exp32(z.numpy())))


def test_exp_is_correctly_rounded_but_at_rare_ties_and_specials_exact():
    z = _exp_inputs()
    got = arith.exp(z).numpy()
    with np.errstate(over="ignore"):
        want = np.exp(z.double().numpy()).astype(np.float32)
    nan = np.isnan(z.numpy())
    ulp = np.abs(bits(got).astype(np.int64) - bits(want).astype(np.int64))[~nan]
    assert ulp.max() <= 1 and (ulp != 0).sum() <= 2
    assert np.all(bits(got)[nan] == spec.NAN32_BITS)  # one NaN pattern, x86 or not
    s = dict(zip(SPECIALS, got[-len(SPECIALS) :].tolist()))
    assert s[0.0] == 1.0 and s[-0.0] == 1.0 and s[float("inf")] == float("inf")
    assert s[float("-inf")] == 0.0 and s[-104.0] == 0.0 and s[89.0] == float("inf")
    assert 0 < s[-103.9] < 1e-44  # float32 subnormals are produced, not flushed


def test_exp_of_float64_inputs_and_out_in_place():
    g = torch.Generator().manual_seed(3)
    x = torch.randn(100_000, generator=g, dtype=torch.float64) * 20
    a, b = arith.exp64(x, impl="numba"), arith.exp64(x, impl="torch")
    assert torch.equal(a.view(torch.int32), b.view(torch.int32))
    assert np.array_equal(bits(a), bits(oracle.exp64(x.numpy())))
    z = x.float()
    want = arith.exp(z.clone())
    for impl in IMPLS:
        w = z.clone()
        assert arith.exp(w, out=w, impl=impl) is w and torch.equal(w, want)


@given(st.lists(st.floats(width=32, allow_nan=True, allow_infinity=True), min_size=1, max_size=300))
def test_exp_property_every_float32_is_the_oracles(vals):
    z = torch.tensor(vals, dtype=torch.float32)
    want = bits(oracle.exp32(z.numpy()))
    for impl in IMPLS:
        assert np.array_equal(bits(arith.exp(z, impl=impl)), want)


@functools.cache
def _nonpos_loop():
    """A loop of ``jit.exp64_nonpos`` over a float64 array (compiled once, here)."""
    import numba

    k = cpu.jit()

    @numba.njit(cache=False, fastmath=False, error_model="numpy")
    def loop(d, out):
        for i in range(d.size):
            out[i] = k.exp64_nonpos(d[i])

    return loop


def _nonpos_exp(d: np.ndarray) -> np.ndarray:
    out = np.empty(d.size, dtype=np.float32)
    _nonpos_loop()(d, out)
    return out


EDGE = [-0.0, 0.0, -np.inf, spec.EXP_LO, np.nextafter(spec.EXP_LO, 0.0), np.nextafter(spec.EXP_LO, -1.0), -1e300]


@given(
    st.lists(st.floats(max_value=0.0, allow_nan=False, width=32), min_size=1, max_size=200),
    st.floats(-1e4, 1e4, width=32),
)
def test_nonpositive_exp_is_exp_where_its_contract_holds(vals, m):
    """The normalisers' exp (no upper clamp, no NaN select: ``x - m`` with ``m`` the
    row's finite maximum) has exp's bits on every such input: -inf, -0.0, the clamp's
    edge and below it, differences of float32s in float64. Pins dropping its lower clamp
    too (-inf and values below EXP_LO then give garbage)."""
    row = np.asarray(vals, dtype=np.float32) + np.float32(m)
    parts = [np.asarray(vals, np.float64), np.asarray(EDGE)]
    if np.isfinite(row.max()):
        parts.append(row.astype(np.float64) - np.float64(row.max()))
    d = np.concatenate(parts)
    assert np.array_equal(bits(_nonpos_exp(d)), bits(oracle.exp64(d)))


def _log_inputs() -> torch.Tensor:
    g = torch.Generator().manual_seed(1)
    x = torch.rand(200_000, generator=g, dtype=torch.float64)
    return torch.cat(
        [
            x * 1e3,
            x[:50_000] + 0.5,
            torch.exp(x[:50_000] * 1400 - 700),
            torch.tensor(
                [
                    0.0,
                    -0.0,
                    -1.0,
                    float("inf"),
                    float("nan"),
                    1.0,
                    5e-324,
                    2.2250738585072014e-308,
                    1.0000000000000002,
                    0.9999999999999999,
                    2.0**0.5,
                    0.5**0.5,
                ],
                dtype=torch.float64,
            ),
        ]
    )


@pytest.mark.parametrize("impl", IMPLS)
def test_log_is_the_oracles_bits_and_within_two_ulps(impl):
    import math

    x = _log_inputs()
    got = arith.log64(x, impl=impl).tolist()
    want = [oracle.log64(v) for v in x.tolist()]
    assert np.array_equal(np.array(got).view(np.int64), np.array(want).view(np.int64))
    fin = [(g, math.log(v)) for g, v in zip(got, x.tolist()) if 0 < v < math.inf]
    a = np.array(fin)
    ulp = np.abs(a[:, 0].view(np.int64) - a[:, 1].view(np.int64))
    assert ulp.max() <= 2, "log64 lost accuracy"
    assert got[-12] == -np.inf and got[-11] == -np.inf and np.isnan(got[-10])
    assert got[-9] == np.inf and np.isnan(got[-8]) and got[-7] == 0.0


def _rows() -> torch.Tensor:
    g = torch.Generator().manual_seed(2)
    x = torch.randn(9, 5003, generator=g) * 3
    x[0, 5] = float("nan")
    x[1, :] = float("-inf")
    x[2, 7] = float("inf")
    x[3, :100] = float("-inf")
    x[4] = 0.0  # a flat row
    x[5, 17] = 1e4  # one huge logit: a one-hot row
    x[6] *= 1e6  # huge magnitudes
    x[7, :] = -3.0e38
    return x


@pytest.mark.parametrize("impl", IMPLS)
def test_log_softmax_is_the_oracles_bits(impl):
    x = _rows()
    got = arith.log_softmax(x, impl=impl)
    for r in range(x.shape[0]):
        assert np.array_equal(bits(got[r]), bits(oracle.log_softmax(x[r].numpy()))), r
    assert np.all(bits(got[:3]) == spec.NAN32_BITS)
    assert torch.all(got[3, :100] == float("-inf"))


def test_log_softmax_within_one_ulp_of_float64_where_torchs_kernel_is_not():
    g = torch.Generator().manual_seed(4)
    x = torch.randn(8, 32000, generator=g) * 3
    want = torch.log_softmax(x.double(), -1).float()
    ulp = (bits(arith.log_softmax(x)).astype(np.int64) - bits(want)).__abs__()
    assert ulp.max() <= 1 and (ulp != 0).mean() < 0.01


def test_normalisers_and_picked_are_log_softmax_at_the_entries():
    x = _rows()
    full = arith.log_softmax(x)
    ids = torch.tensor([[0, 5, 4999]] * x.shape[0])
    for impl in IMPLS:
        m, G = arith.normalisers(x, impl=impl)
        got = arith.picked(x.gather(1, ids), m.unsqueeze(1), G.unsqueeze(1))
        assert torch.equal(got.view(torch.int32), full.gather(1, ids).view(torch.int32))


@given(
    st.integers(1, 6),
    st.integers(1, 400),
    st.integers(0, 2**31 - 1),
    st.sampled_from(["randn", "ties", "neginf", "huge", "tiny"]),
)
def test_log_softmax_property_row_alone_equals_row_in_batch(rows, n, seed, family):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows, n)).astype(np.float32) * 3
    if family == "ties":
        x = np.round(x)
    elif family == "neginf":
        x[rng.random((rows, n)) < 0.5] = -np.inf
    elif family == "huge":
        x *= np.float32(1e30)
    elif family == "tiny":
        x *= np.float32(1e-30)
    t = torch.from_numpy(x)
    whole = arith.log_softmax(t)
    for impl in IMPLS:
        for r in range(rows):
            alone = arith.log_softmax(t[r : r + 1].clone(), impl=impl)
            assert torch.equal(alone.view(torch.int32), whole[r : r + 1].view(torch.int32))
            assert np.array_equal(bits(alone[0]), bits(oracle.log_softmax(x[r])))


def test_threads_and_chunking_change_no_bit():
    x = torch.randn(64, 3000, generator=torch.Generator().manual_seed(5)) * 4
    prev = torch.get_num_threads()
    outs = []
    try:
        for n in (1, 2, 3, 4):
            torch.set_num_threads(n)
            outs.append((arith.log_softmax(x), arith.exp(x), arith.normalisers(x)[1]))
    finally:
        torch.set_num_threads(prev)
    for o in outs[1:]:
        for a, b in zip(o, outs[0]):
            assert torch.equal(a, b)


#: x86 (vfmadd231pd, vfnmsub...) and aarch64 (fmla, fmls, fmadd, fnmsub...) fused ops
FMA = re.compile(r"\bv?fn?m(add|sub)[0-9]*[ps][sd]\b|\bfn?m(la|ls|add|sub)\b")


def _asm(fastmath: bool) -> str:
    """The x86 / aarch64 assembly of the exp kernel and of the normalisers' kernel (its
    exp without the upper clamp and the NaN select, then the exact sum and log) compiled
    afresh (cached code cannot be inspected) with the project's flags, or with fast-math."""
    import numba

    k = cpu.jit()
    flags = dict(nogil=True, cache=False, fastmath=fastmath, error_model="numpy")
    exp_loop = numba.njit(**flags)(k.exp_into.py_func)
    norm_loop = numba.njit(**flags)(k.normalisers.py_func)
    z = np.zeros(4, np.float32)
    exp_loop(z, z.copy())
    x = np.zeros((2, 8), np.float32)
    norm_loop(x, x.max(axis=1), np.empty(2), spec.frac_bits(8), 0, 2)
    return "\n".join(f.inspect_asm(sig) for f in (exp_loop, norm_loop) for sig in f.signatures)


def test_numba_kernels_contain_no_fused_multiply_add():
    """The exp kernel compiled as detsample compiles it has no FMA instruction (LLVM
    contracts ``a * b + c`` only under fast-math flags; a contraction changes bits),
    where the same source under fast-math has them (the pattern finds what it looks for
    on a CPU with FMA)."""
    assert not FMA.search(_asm(fastmath=False))
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists() and re.search(r"\b(fma|asimd)\b", cpuinfo.read_text()):
        assert FMA.search(_asm(fastmath=True))


def test_errors_name_the_argument():
    with pytest.raises(TypeError, match="float32"):
        arith.exp(torch.zeros(2, dtype=torch.float64))
    with pytest.raises(ValueError, match="impl must be one of"):
        arith.exp(torch.zeros(2), impl="mkl")
    with pytest.raises(ValueError, match="not x"):
        x = torch.zeros(2, 3)
        arith.log_softmax(x, out=x)


def test_flush_to_zero_is_refused():
    arith.check_environment()
    prev = torch.set_flush_denormal(True)
    try:
        if prev or torch.set_flush_denormal(True):  # the CPU supports it
            with pytest.raises(RuntimeError, match="flushed to zero"):
                arith.check_environment()
    finally:
        torch.set_flush_denormal(False)


@given(
    st.integers(1, 5),
    st.integers(1, 100),
    st.integers(0, 2**31 - 1),
    st.sampled_from(["randn", "nan", "posinf", "neginf", "ties", "zeros"]),
)
def test_row_max_is_torchs_amax(rows, n, seed, family):
    """Bug it would catch: a NaN lost by the select-based max, a group of 8 over the
    wrong stride, the tail of a row shorter than 8 skipped."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows, n)).astype(np.float32)
    if family == "nan":
        x[rng.random((rows, n)) < 0.1] = np.nan
    elif family == "posinf":
        x[:, rng.integers(0, n)] = np.inf
    elif family == "neginf":
        x[rng.random((rows, n)) < 0.7] = -np.inf
    elif family == "ties":
        x = np.round(x)
    elif family == "zeros":
        x = np.where(rng.random((rows, n)) < 0.5, np.float32(-0.0), np.float32(0.0))
    t = torch.from_numpy(x)
    got, want = arith.row_max(t), torch.amax(t, -1)
    assert torch.equal(torch.isnan(got), torch.isnan(want))
    ok = ~torch.isnan(want)
    assert torch.equal(got[ok], want[ok])  # values (+0.0 / -0.0 ties are one value)


@pytest.mark.parametrize("impl", IMPLS)
def test_log_softmax_at_is_log_softmax_at_the_entries(impl):
    x = _rows()
    ids = torch.tensor([0, 5, 4999, 17, 3, 100, 2, 4000, 1])
    got = arith.log_softmax_at(x, ids, impl=impl)
    want = arith.log_softmax(x).gather(1, ids.view(-1, 1)).view(-1)
    assert torch.equal(got.view(torch.int32), want.view(torch.int32))
