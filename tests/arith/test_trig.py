"""detsample's defined cos and sin (detsample/arith/trig.py): the numba kernels, the torch
composition and the oracle (numpy + Python integers) give the same bits on both
reductions; the results are accurate against mpmath out to float32's largest values; the
constants are pi's; the compiled kernels have no fused multiply-add.

Pins: a Cody-Waite piece with too many bits (``k * P1`` no longer exact), a wrong 2/pi
table, a Payne-Hanek window off by a bit or a lost carry between limbs, the quadrant's
sign for negative arguments, and the boundary between the two reductions.
"""

from __future__ import annotations

import math

import mpmath
import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from detsample.arith import pointwise, trig
from oracles import elementary as to32
from oracles import trig as oracle
from tests.arith.fma import FMA, cpu_has_fma, fresh_asm, loop_args

FUNCS = [("sin", pointwise.sin, oracle.sin), ("cos", pointwise.cos, oracle.cos)]
IMPLS = ["numba", "torch"]


def bits(a) -> np.ndarray:
    a = a.numpy() if isinstance(a, torch.Tensor) else np.asarray(a)
    return a.view(np.int32 if a.dtype == np.float32 else np.int64)


def _near_multiples_of_pio2(n: int) -> np.ndarray:
    """The float32s nearest to k pi/2 (deep cancellation in the reduction)."""
    k = np.unique(np.geomspace(1, 4e7, n).astype(np.int64))
    with mpmath.workprec(100):
        return np.array([float(np.float32(float(kk * mpmath.pi / 2))) for kk in k])


def _inputs() -> np.ndarray:
    rng = np.random.default_rng(0)
    sign = np.where(rng.random(6000) < 0.5, -1.0, 1.0)
    return np.concatenate(
        [
            rng.standard_normal(20_000) * 3,
            rng.uniform(-1e5, 1e5, 20_000),  # rotary angles
            rng.uniform(-trig.CW_MAX, trig.CW_MAX, 5000),
            sign * 10 ** rng.uniform(6.0, 38.5, 6000),  # Payne-Hanek
            sign[:3000] * 10 ** rng.uniform(38.5, 308, 3000),  # float64 only
            _near_multiples_of_pio2(800),
            [
                trig.CW_MAX,
                -trig.CW_MAX,
                np.nextafter(trig.CW_MAX, np.inf),
                2.0**52,
                3e38,
                np.finfo(np.float32).max,
                1.7e308,
                5e-324,
                1e-45,
                0.0,
                -0.0,
                np.inf,
                -np.inf,
                np.nan,
            ],
        ]
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("name,fn,ref", FUNCS, ids=[f[0] for f in FUNCS])
def test_numba_torch_and_the_oracle_give_one_set_of_bits(name, fn, ref, impl, dtype):
    with np.errstate(over="ignore"):
        x = torch.from_numpy(_inputs()).to(dtype)
    want = ref(x.numpy().astype(np.float64))
    want = to32.to32(want) if dtype == torch.float32 else np.where(np.isnan(want), np.nan, want)
    assert np.array_equal(bits(fn(x, impl=impl)), bits(want))


@given(
    st.lists(st.floats(width=32, allow_nan=True, allow_infinity=True), min_size=1, max_size=200), st.sampled_from(FUNCS)
)
def test_property_every_float32_is_the_oracles(vals, case):
    _, fn, ref = case
    x = torch.tensor(vals, dtype=torch.float32)
    want = bits(to32.to32(ref(x.numpy().astype(np.float64))))
    for impl in IMPLS:
        assert np.array_equal(bits(fn(x, impl=impl)), want)


@given(st.lists(st.floats(allow_nan=True, allow_infinity=True), min_size=1, max_size=60), st.sampled_from(FUNCS))
def test_property_every_float64_is_the_oracles(vals, case):
    _, fn, ref = case
    x = torch.tensor(vals, dtype=torch.float64)
    want = bits(np.where(np.isnan(r := ref(x.numpy())), np.nan, r))
    for impl in IMPLS:
        assert np.array_equal(bits(fn(x, impl=impl)), want)


def _cr32(r) -> np.float32:
    """The float32 nearest to the mpmath value ``r`` (normal range)."""
    with mpmath.workprec(24):
        return np.float32(float(+r))


@pytest.mark.parametrize("name,fn,ref", FUNCS, ids=[f[0] for f in FUNCS])
def test_accuracy_against_mpmath(name, fn, ref):
    """float64: within 2 ulps, every reduction (measured: 1.4 in Cody-Waite's range, 1.8
    in Payne-Hanek's). float32: the correctly rounded value (measured: every sampled
    input, rotary angles to 1e5 and float32 values to 3e38 alike)."""
    mf = getattr(mpmath, name)
    rng = np.random.default_rng(1)
    x = np.concatenate([rng.uniform(-1e5, 1e5, 600), 10 ** rng.uniform(6, 300, 300), _near_multiples_of_pio2(100)])
    got = fn(torch.from_numpy(x)).numpy()
    x32 = np.concatenate([x[:600], 10 ** rng.uniform(6, 38, 300), _near_multiples_of_pio2(100)]).astype(np.float32)
    got32 = fn(torch.from_numpy(x32)).numpy()
    worst, wrong32 = 0.0, []
    with mpmath.workprec(400):
        for v, y in zip(x.tolist(), got.tolist()):
            r = mf(mpmath.mpf(v))
            worst = max(worst, float(abs(mpmath.mpf(y) - r) / np.spacing(abs(float(r)))))
        for v, y in zip(x32.tolist(), got32.tolist()):
            r = mf(mpmath.mpf(v))
            if abs(r) > 1e-37 and _cr32(r) != np.float32(y):
                wrong32.append(v)
    assert worst <= 2.0, worst
    assert not wrong32, wrong32[:5]


def test_the_constants_are_pis():
    with mpmath.workprec(2000):
        pio2 = mpmath.pi / 2
        assert abs(trig.P1 + mpmath.mpf(trig.P2) + trig.P3 + trig.P3T - pio2) < mpmath.mpf(2) ** -155
        assert float(pio2) == trig.PIO2 and float(2 / mpmath.pi) == trig.INV_PIO2
        assert int(trig.TWO_OVER_PI_HEX, 16) == int(mpmath.floor(2 / mpmath.pi * mpmath.mpf(2) ** 1152))
    for p in (trig.P1, trig.P2, trig.P3):  # 33 significant bits: k * P exact, |k| < 2**20
        m, _ = math.frexp(p)
        assert (m * 2**33).is_integer()
    assert trig.CW_MAX * 2 / math.pi < 2**20
    assert trig.SIN_COEFS[1] == -1 / 6 and trig.SIN_COEFS[8] == 1 / math.factorial(17)
    assert trig.COS_COEFS[2] == 1 / 24 and trig.COS_COEFS[8] == 1 / math.factorial(16)


def test_the_reductions_meet_at_cw_max():
    """Both sides of the boundary: the Payne-Hanek reduction of a value Cody-Waite also
    reduces exactly agrees with it (a window or carry error would not)."""
    from detsample.arith import trig_torch

    x = torch.tensor([trig.CW_MAX, 1e6, 7.5e5, 123456.75, 3.0e5], dtype=torch.float64)
    n_cw, r_cw = trig_torch.reduce(x)
    n_ph, r_ph = trig_torch.payne_hanek(x)
    assert torch.equal(n_cw, n_ph & 3)
    assert torch.allclose(r_cw, r_ph, rtol=0, atol=1e-15)


def test_specials():
    x = torch.tensor([0.0, -0.0, math.inf, -math.inf, math.nan])
    s, c = pointwise.sin(x), pointwise.cos(x)
    assert torch.equal(s[:2].view(torch.int32), x[:2].view(torch.int32))
    assert c[:2].tolist() == [1.0, 1.0]
    assert torch.all(s[2:].view(torch.int32) == 0x7FC00000)
    assert torch.all(c[2:].view(torch.int32) == 0x7FC00000)


@pytest.mark.parametrize(
    "name,args,contractible",
    [
        ("_sincos_into", loop_args(True), True),
        ("sin_into", loop_args(), False),
        ("cos_into", loop_args(), False),
        ("sincos", (1e10, False), True),
        ("payne_hanek", (1e10,), True),
    ],
)
def test_numba_kernels_contain_no_fused_multiply_add(name, args, contractible):
    from detsample.arith import trig_jit

    kernel = getattr(trig_jit, name)
    assert not FMA.search(fresh_asm(kernel, args, fastmath=False))
    if contractible and cpu_has_fma():
        assert FMA.search(fresh_asm(kernel, args, fastmath=True))
