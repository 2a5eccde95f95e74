"""detsample's defined pointwise functions (detsample/arith/elementary.py, pointwise.py):
the numba kernels, the torch composition and the numpy oracle give the same bits; the
bits are accurate; the compiled kernels have no fused multiply-add.

Pins: an implementation that drifts from the definition (an FMA contracted by a compiler,
``k / t`` spelled as torch's ``reciprocal(t) * k``, torch's CPU ``sqrt`` where the
definition says IEEE's, a clamp that loses NaN, a special value mapped to the platform's
NaN), a definition that loses accuracy (expm1 near 0, gelu's tail, a truncated series),
and a function whose float32 bits are not ``arith.exp``'s.
"""

from __future__ import annotations

import math

import mpmath
import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from scipy import special

from detsample import arith
from detsample.arith import elementary, pointwise
from oracles import elementary as oracle
from tests.arith.fma import FMA, cpu_has_fma, fresh_asm, loop_args

SPECIALS = [
    0.0,
    -0.0,
    math.inf,
    -math.inf,
    math.nan,
    1e-45,
    -1e-45,
    1e-40,
    1e-30,
    -1e-8,
    88.72,
    88.73,
    89.5,
    -87.4,
    -103.9,
    -104.5,
    -745.5,
    709.9,
    710.5,
    -45.5,
    20.5,
    3e38,
    -3e38,
    1.0,
    -1.0,
    0.5,
    -2.0,
    2.0,
    -3.0,
    3.0,
    -40.0,
    40.0,
]

#: (name, the pointwise call, the oracle's float64 function)
CASES = [
    ("exp", pointwise.exp, oracle.exp),
    ("expm1", pointwise.expm1, oracle.expm1),
    ("tanh", pointwise.tanh, oracle.tanh),
    ("sigmoid", pointwise.sigmoid, oracle.sigmoid),
    ("silu", pointwise.silu, oracle.silu),
    ("softplus", pointwise.softplus, oracle.softplus),
    ("softplus(0.5, 3)", lambda x, **k: pointwise.softplus(x, 0.5, 3.0, **k), lambda x: oracle.softplus(x, 0.5, 3.0)),
    ("gelu", pointwise.gelu, oracle.gelu_erf),
    ("gelu_tanh", lambda x, **k: pointwise.gelu(x, "tanh", **k), oracle.gelu_tanh),
    ("sqrt", pointwise.sqrt, oracle.sqrt),
    ("rsqrt", pointwise.rsqrt, oracle.rsqrt),
] + [
    (f"pow{e}", lambda x, e=e, **k: pointwise.pow_scalar(x, e, **k), lambda x, e=e: oracle.pow_scalar(x, e))
    for e in (2, 3.0, -2, 0, 1, 0.5, -0.5, 2.5, -1.5, 1.0 / 3, 2.0**33 + 1, math.inf, math.nan)
]
IDS = [c[0] for c in CASES]
IMPLS = ["numba", "torch"]
INT = {torch.float32: np.int32, torch.float64: np.int64}


def bits(t) -> np.ndarray:
    a = t.numpy() if isinstance(t, torch.Tensor) else np.asarray(t)
    return a.view(np.int32 if a.dtype == np.float32 else np.int64)


def _inputs(dtype: torch.dtype) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    x = torch.cat(
        [
            torch.randn(60_000, generator=g, dtype=torch.float64) * 4,
            torch.randn(20_000, generator=g, dtype=torch.float64) * 40,
            torch.randn(10_000, generator=g, dtype=torch.float64) * 1e-4,
            -torch.rand(10_000, generator=g, dtype=torch.float64) * 800,
            torch.tensor(SPECIALS, dtype=torch.float64),
        ]
    )
    return x.to(dtype)


def _want(fn, x: torch.Tensor) -> np.ndarray:
    y = fn(x.numpy().astype(np.float64))
    return oracle.to32(y) if x.dtype == torch.float32 else np.where(np.isnan(y), np.nan, y)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("name,fn,ref", CASES, ids=IDS)
def test_numba_torch_and_the_oracle_give_one_set_of_bits(name, fn, ref, impl, dtype):
    x = _inputs(dtype)
    got = fn(x, impl=impl)
    assert got.dtype == dtype and got.shape == x.shape
    assert np.array_equal(bits(got), bits(_want(ref, x)))


@given(
    st.lists(st.floats(width=32, allow_nan=True, allow_infinity=True), min_size=1, max_size=200), st.sampled_from(CASES)
)
def test_property_every_float32_is_the_oracles(vals, case):
    _, fn, ref = case
    x = torch.tensor(vals, dtype=torch.float32)
    want = bits(_want(ref, x))
    for impl in IMPLS:
        assert np.array_equal(bits(fn(x, impl=impl)), want)


@given(st.lists(st.floats(allow_nan=True, allow_infinity=True), min_size=1, max_size=100), st.sampled_from(CASES))
def test_property_every_float64_is_the_oracles(vals, case):
    _, fn, ref = case
    x = torch.tensor(vals, dtype=torch.float64)
    want = bits(_want(ref, x))
    for impl in IMPLS:
        assert np.array_equal(bits(fn(x, impl=impl)), want)


def test_float32_exp_is_arith_exp_and_the_float64_form_rounded_once():
    x = _inputs(torch.float32)
    a = pointwise.exp(x)
    assert torch.equal(a.view(torch.int32), arith.exp(x).view(torch.int32))
    once = pointwise.exp(x.double(), impl="torch").float()
    assert np.array_equal(bits(a), bits(oracle.to32(once.numpy())))


def test_nans_are_canonical_and_half_precision_goes_through_float32():
    x = torch.tensor([math.nan, -math.nan, math.inf, -math.inf, -1.0])
    for f in (pointwise.exp, pointwise.silu, pointwise.sqrt, pointwise.gelu, pointwise.sin):
        y = f(x)
        assert torch.all(y[torch.isnan(y)].view(torch.int32) == 0x7FC00000)
        y64 = f(x.double())
        assert torch.all(y64[torch.isnan(y64)].view(torch.int64) == 0x7FF8000000000000)
    h = torch.randn(1000, generator=torch.Generator().manual_seed(1)).bfloat16()
    assert torch.equal(pointwise.silu(h), pointwise.silu(h.float()).bfloat16())
    assert pointwise.tanh(h.half()).dtype == torch.float16


def test_signed_zeros_and_specials():
    z = torch.tensor([0.0, -0.0])
    for f in (
        pointwise.expm1,
        pointwise.tanh,
        pointwise.silu,
        lambda t: pointwise.gelu(t, "tanh"),
        pointwise.sqrt,
        pointwise.sin,
    ):
        assert torch.equal(f(z).view(torch.int32), z.view(torch.int32))
    assert pointwise.expm1(torch.tensor([-math.inf])).item() == -1.0
    assert pointwise.rsqrt(z).tolist() == [math.inf, -math.inf]
    assert pointwise.sigmoid(torch.tensor([-math.inf, math.inf])).tolist() == [0.0, 1.0]
    assert torch.isnan(pointwise.silu(torch.tensor([-math.inf]))).all()  # as torch's
    assert pointwise.softplus(torch.tensor([-math.inf, 30.0])).tolist() == [0.0, 30.0]
    p = pointwise.pow_scalar(torch.tensor([-8.0, -0.0, 0.0, -math.inf, math.nan]), 1.0 / 3)
    assert math.isnan(p[0]) and p[1:4].tolist() == [0.0, 0.0, math.inf] and math.isnan(p[4])
    assert pointwise.pow_scalar(torch.tensor([-2.0, math.nan]), 0).tolist() == [1.0, 1.0]


def _ulps32(got: torch.Tensor, want: np.ndarray) -> np.ndarray:
    """ulps between float32 results, finite and signed alike (NaN pairs 0)."""
    g, w = got.numpy(), want.astype(np.float32)
    d = np.abs(g.view(np.int32).astype(np.int64) - w.view(np.int32).astype(np.int64))
    return np.where(np.isnan(g) & np.isnan(w), 0, d)


#: float64 references (numpy / scipy) of each function's value, and the inputs they hold at
REFERENCES = [
    ("exp", pointwise.exp, np.exp),
    ("expm1", pointwise.expm1, np.expm1),
    ("tanh", pointwise.tanh, np.tanh),
    ("sigmoid", pointwise.sigmoid, special.expit),
    ("silu", pointwise.silu, lambda x: x * special.expit(x)),
    ("softplus", pointwise.softplus, lambda x: np.where(x > 20, x, np.logaddexp(0.0, x))),
    ("gelu", pointwise.gelu, lambda x: x * special.ndtr(x)),
    (
        "gelu_tanh",
        lambda x: pointwise.gelu(x, "tanh"),
        lambda x: 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3))),
    ),
    ("sqrt", pointwise.sqrt, np.sqrt),
    ("rsqrt", pointwise.rsqrt, lambda x: 1 / np.sqrt(x)),
    ("pow2.5", lambda x: pointwise.pow_scalar(x, 2.5), lambda x: np.abs(x) ** 2.5),
    ("pow3", lambda x: pointwise.pow_scalar(x, 3), lambda x: x**3),
]


@pytest.mark.parametrize("name,fn,ref", REFERENCES, ids=[r[0] for r in REFERENCES])
def test_float32_results_are_correctly_rounded_but_at_rare_ties(name, fn, ref):
    g = torch.Generator().manual_seed(2)
    x = torch.cat([torch.randn(100_000, generator=g) * 5, torch.randn(20_000, generator=g) * 1e-3])
    if name in ("sqrt", "rsqrt", "pow2.5"):
        x = x.abs()
    with np.errstate(all="ignore"):
        want = ref(x.double().numpy())
    ulp = _ulps32(fn(x), want)
    if name == "gelu_tanh":  # numpy's reference cancels in 1 + tanh for x < 0
        ulp = ulp[x.numpy() > -1]
    assert ulp.max() <= 1 and (ulp != 0).sum() <= 3, (ulp.max(), (ulp != 0).sum())


#: float64 bounds in ulps against mpmath, as functions of x: a few ulps of rounding, plus
#: the function's own conditioning where an argument's rounding is magnified (exp of
#: -x**2/2 in gelu's tail, of -2y in its tanh form, of e log x in pow): the docstrings'
#: accuracy statements
F64_BOUNDS = {
    "exp": lambda v: 3,
    "expm1": lambda v: 2,
    "tanh": lambda v: 3,
    "sigmoid": lambda v: 4,
    "silu": lambda v: 4,
    "softplus": lambda v: 5,
    "gelu": lambda v: 80 + v * v,
    "gelu_tanh": lambda v: 8 + 4 * abs(v + 0.044715 * v**3),
    "pow2.5": lambda v: 4 + 2.5 * abs(math.log(v)),
    "pow3": lambda v: 2,
    "rsqrt": lambda v: 2,
}
MP_REFS = {
    "exp": mpmath.exp,
    "expm1": mpmath.expm1,
    "tanh": mpmath.tanh,
    "sigmoid": lambda v: 1 / (1 + mpmath.exp(-v)),
    "silu": lambda v: v / (1 + mpmath.exp(-v)),
    "softplus": lambda v: v if v > 20 else mpmath.log1p(mpmath.exp(v)),
    "gelu": lambda v: v * mpmath.ncdf(v),
    "gelu_tanh": lambda v: v / (1 + mpmath.exp(-2 * mpmath.sqrt(2 / mpmath.pi) * (v + mpmath.mpf(0.044715) * v**3))),
    "pow2.5": lambda v: abs(v) ** mpmath.mpf(2.5),
    "pow3": lambda v: v**3,
    "rsqrt": lambda v: 1 / mpmath.sqrt(abs(v)),
}


@pytest.mark.parametrize("name", sorted(F64_BOUNDS))
def test_float64_results_within_their_stated_ulps_of_mpmath(name):
    fn = dict((r[0], r[1]) for r in REFERENCES)[name]
    rng = np.random.default_rng(3)
    x = np.concatenate([rng.standard_normal(300) * 4, rng.uniform(-30, 30, 100)])
    if name in ("rsqrt", "pow2.5"):
        x = np.abs(x)
    got = fn(torch.from_numpy(x)).numpy()
    over = []
    with mpmath.workprec(200):
        for v, y in zip(x.tolist(), got.tolist()):
            r = MP_REFS[name](mpmath.mpf(v))
            if r == 0 or abs(r) < 1e-300:
                continue
            ulps = float(abs(mpmath.mpf(y) - r) / np.spacing(abs(float(r))))
            if ulps > F64_BOUNDS[name](v):
                over.append((v, ulps))
    assert not over, over[:5]


def test_constants_are_what_they_say():
    with mpmath.workprec(200):
        assert float(mpmath.sqrt(2 / mpmath.pi)) == elementary.SQRT_2_OVER_PI
        assert float(1 / mpmath.sqrt(2 * mpmath.pi)) == elementary.INV_SQRT_2PI
    with mpmath.workprec(300):  # Mills' ratio's Taylor coefficients from M' = a M - 1
        c = mpmath.mpf(elementary.MILLS_CENTER)
        d = [mpmath.ncdf(-c) / mpmath.npdf(c)]
        d.append(c * d[0] - 1)
        for n in range(1, elementary.PHI_DEGREE):
            d.append(c * d[n] + n * d[n - 1])
        assert tuple(float(v / mpmath.factorial(n)) for n, v in enumerate(d)) == elementary.MILLS_COEFS
    assert elementary.PHI_SERIES[:3] == (1.0, 1 / 3, 1 / 15) and len(elementary.PHI_SERIES) == 25
    assert elementary.EXPM1_COEFS[0] == 0.5 and elementary.EXPM1_COEFS[12] == 1 / math.factorial(14)
    assert math.expm1(elementary.EXPM1_LO) == -1.0 and math.tanh(elementary.TANH_BIG) == 1.0
    assert math.exp(elementary.EXP_LO) == 0.0
    with pytest.raises(OverflowError):
        math.exp(elementary.EXP_HI)


def test_threads_and_chunking_change_no_bit():
    x = torch.randn(300_000, generator=torch.Generator().manual_seed(4)) * 6
    prev = torch.get_num_threads()
    outs = []
    try:
        for n in (1, 2, 3):
            torch.set_num_threads(n)
            outs.append([pointwise.silu(x), pointwise.gelu(x), pointwise.cos(x * 1e3)])
    finally:
        torch.set_num_threads(prev)
    for o in outs[1:]:
        for a, b in zip(o, outs[0]):
            assert torch.equal(a, b)
    assert torch.equal(pointwise.silu(x[17:40]), pointwise.silu(x)[17:40])


#: every kernel (the loops and the functions they call that are not inlined): its
#: arguments, and whether its source has a product followed by a sum fast-math contracts
KERNELS = [
    (name, loop_args(), True)
    for name in ("exp_into", "expm1_into", "tanh_into", "sigmoid_into", "silu_into", "gelu_tanh_into")
] + [
    ("softplus_into", loop_args(1.0, 20.0), True),
    ("log_into", loop_args(), False),
    ("gelu_erf_into", loop_args(), True),
    ("gelu_erf_far", (5.0,), True),
    ("sqrt_into", loop_args(), False),
    ("rsqrt_into", loop_args(), False),
    ("pow_int_into", loop_args(3), False),
    ("pow_int", (0.5, 3), False),
    ("pow_general_into", loop_args(2.5, False), False),
    ("pow_general", (0.5, 2.5, False), True),
]


@pytest.mark.parametrize("name,args,contractible", KERNELS, ids=[k[0] for k in KERNELS])
def test_numba_kernels_contain_no_fused_multiply_add(name, args, contractible):
    """Compiled as detsample compiles them: no FMA (a contraction changes bits); the same
    source under fast-math has one where it can (the pattern finds what it looks for)."""
    from detsample.arith import elementary_jit

    kernel = getattr(elementary_jit, name)
    assert not FMA.search(fresh_asm(kernel, args, fastmath=False))
    if contractible and cpu_has_fma():
        assert FMA.search(fresh_asm(kernel, args, fastmath=True))


def test_errors_name_the_argument():
    with pytest.raises(TypeError, match="floating tensor, got torch.int64"):
        pointwise.silu(torch.arange(3))
    with pytest.raises(ValueError, match="approximate must be one of"):
        pointwise.gelu(torch.zeros(2), "erf")
    with pytest.raises(ValueError, match="exponent must be a real number, got 'x'"):
        pointwise.pow_scalar(torch.zeros(2), "x")
    with pytest.raises(ValueError, match="beta must not be 0"):
        pointwise.softplus(torch.zeros(2), 0.0)
    with pytest.raises(ValueError, match="impl must be one of"):
        pointwise.cos(torch.zeros(2), impl="sleef")
