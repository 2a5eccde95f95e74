"""The Triton spelling of detsample's arithmetic (detsample/kernels/common.py: exp64,
exp32, log64, the two-word fixed-point sum) gives detsample.arith's bits, element by
element, under the interpreter (numpy: IEEE float64 and float32 operations).

Bugs it pins: a kernel helper drifting from arith.spec (``tl.exp`` / ``tl.log`` in place
of the definition, a Horner order where it says Estrin, a constant rounded to float32
by Triton's typing of a Python float, a clamp or a shift constant off by one, a NaN of
the platform's pattern instead of 0x7fc00000, a low word truncated before its scaling).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from detsample import arith, rules
from detsample.arith import reference, spec
from oracles import arith as oracle

IMPLS = ["torch", "numba"]


def f32_bits(x: torch.Tensor) -> torch.Tensor:
    return x.view(torch.int32)


def f64_bits(x: torch.Tensor) -> torch.Tensor:
    return x.view(torch.int64)


def near(c: float, n: int = 300) -> torch.Tensor:
    """The 2n float32 values around ``float32(c)`` (c not within n ulps of 0), ulp by ulp."""
    b = torch.tensor([c], dtype=torch.float32).view(torch.int32).to(torch.int64)
    return (b + torch.arange(-n, n)).to(torch.int32).view(torch.float32)


def from_bits32(*bits: int) -> torch.Tensor:
    return torch.tensor(bits, dtype=torch.int64).to(torch.int32).view(torch.float32)


#: float32 specials: zeros, infinities, NaNs of three patterns (x86's default negative
#: one, a signalling one, the canonical one), extremes, subnormals, ln 2 / 2
SPECIALS32 = torch.cat(
    [
        torch.tensor(
            [
                0.0,
                -0.0,
                math.inf,
                -math.inf,
                3e38,
                -3e38,
                1e-40,
                -1e-40,
                1e-45,
                -1e-45,
                1.0,
                -1.0,
                0.5,
                -0.34657359,
                0.34657359,
                88.72283,
                88.72284,
                89.0,
                89.5,
                -87.33654,
                -103.97208,
                -104.0,
                -104.5,
                -150.0,
                -1e-8,
                1e-30,
            ],
            dtype=torch.float32,
        ),
        from_bits32(
            0x7FC00000,
            0xFFC00000 - 2**32,
            0x7F800001,
            0x7FFFFFFF,
            0x7F7FFFFF,
            0xFF7FFFFF - 2**32,
            0x00000001,
            0x80000001 - 2**32,
        ),
    ]
)


def float32_inputs() -> torch.Tensor:
    """Random float32 values over exp's whole range, ulp-by-ulp runs around its edges
    (-104 and 89: the clamps; -103.97: 2**-150, the last nonzero float32; -87.34: the
    subnormal boundary; 88.72: the overflow), and the specials."""
    g = torch.Generator().manual_seed(0)
    return torch.cat(
        [
            torch.randn(30_000, generator=g) * 30,
            torch.randn(5_000, generator=g) * 1e-3,
            -torch.rand(10_000, generator=g) * 110,
            near(-104.0),
            near(89.0),
            near(-103.97208),
            near(-87.33654),
            near(88.72284),
            from_bits32(*range(50)),
            -from_bits32(*range(50)),
            SPECIALS32,
        ]
    )


def float64_inputs() -> torch.Tensor:
    """float64 values that are not float32 values (exp64 sees the full double), near the
    rounding ties of ``x / ln 2`` (k + 1/2), and float64 specials."""
    g = torch.Generator().manual_seed(1)
    half_ln2 = (torch.arange(-300, 260, dtype=torch.float64) + 0.5) * math.log(2)
    return torch.cat(
        [
            torch.randn(20_000, generator=g, dtype=torch.float64) * 40,
            -torch.rand(5_000, generator=g, dtype=torch.float64) * 120,
            half_ln2,
            torch.nextafter(half_ln2, half_ln2 * 2),
            torch.tensor(
                [
                    0.0,
                    -0.0,
                    math.inf,
                    -math.inf,
                    math.nan,
                    1e-300,
                    -1e-300,
                    5e-324,
                    709.0,
                    710.0,
                    -745.0,
                    -746.0,
                    1e308,
                    -1e308,
                    88.72283935546875,
                    -103.97207708399179,
                ],
                dtype=torch.float64,
            ),
        ]
    )


def log_inputs() -> torch.Tensor:
    """Positive float64 values over the whole exponent range (subnormals included), near
    1, near sqrt(1/2) (the mantissa's split), and the specials."""
    g = torch.Generator().manual_seed(2)
    x = torch.rand(20_000, generator=g, dtype=torch.float64)
    one = torch.tensor(1.0, dtype=torch.float64)
    sh = torch.tensor(spec.SQRT_HALF, dtype=torch.float64)
    return torch.cat(
        [
            x * 1e3,
            x[:5_000] + 0.5,
            torch.exp(x[:5_000] * 1400 - 700),
            torch.ldexp(x[:2_000] + 0.5, torch.randint(-1074, -1022, (2_000,), generator=g)),
            torch.tensor(
                [
                    0.0,
                    -0.0,
                    -1.0,
                    math.inf,
                    -math.inf,
                    math.nan,
                    1.0,
                    5e-324,
                    2.2250738585072014e-308,
                    2.225073858507201e-308,
                    1.7976931348623157e308,
                    2.0**0.5,
                    0.5**0.5,
                ],
                dtype=torch.float64,
            ),
            torch.nextafter(torch.stack([one, one, sh, sh]), torch.stack([one * 2, one * 0, sh * 2, sh * 0])),
        ]
    )


def run_helpers(z32, x64, xl):
    from tests.kernels import arith_kernels as K

    return K.exp32_of(z32), K.exp64_of(x64), K.log64_of(xl), K.exp64_wide_of(x64)


@pytest.fixture(scope="module")
def helpers(interp):
    z32, x64, xl = float32_inputs(), float64_inputs(), log_inputs()
    return (z32, x64, xl), interp(run_helpers, z32, x64, xl)


@pytest.mark.parametrize("impl", IMPLS)
def test_exp32_is_arith_exp_bit_for_bit(helpers, impl):
    (z32, _, _), (e, _, _, _) = helpers
    assert torch.equal(f32_bits(e), f32_bits(arith.exp(z32, impl=impl)))


def test_exp32_specials_and_canonical_nan(helpers):
    """NaNs of every pattern give 0x7fc00000; exp(+-0) = 1 exactly; subnormal results are
    produced, not flushed; the clamps give 0 and inf."""
    (z32, _, _), (e, _, _, _) = helpers
    nan = torch.isnan(z32)
    assert int(nan.sum()) == 4 and bool((f32_bits(e)[nan] == spec.NAN32_BITS).all())
    assert bool((e[z32 == 0] == 1.0).all()) and int((z32 == 0).sum()) >= 2
    assert bool((e[z32 <= spec.EXP_LO] == 0).all())
    assert bool((e[z32 >= spec.EXP_HI] == math.inf).all())
    sub = (z32 > -103.9) & (z32 < -87.4)
    assert int(sub.sum()) > 100
    assert bool((e[sub] > 0).all()) and bool((e[sub] < 1.2e-38).all())


@pytest.mark.parametrize("impl", IMPLS)
def test_exp64_of_doubles_is_arith_bit_for_bit(helpers, impl):
    (_, x64, _), (_, e, _, _) = helpers
    assert torch.equal(f32_bits(e), f32_bits(arith.exp64(x64, impl=impl)))


def test_exp64_is_the_numpy_oracles(helpers):
    (_, x64, _), (_, e, _, _) = helpers
    assert np.array_equal(e.numpy().view(np.int32), oracle.exp64(x64.numpy()).view(np.int32))


def test_exp64_before_its_rounding_is_the_definitions_float64(helpers):
    """``p * 2**k`` in float64, before the rounding to float32, is the numpy oracle's bit
    for bit. Bug it pins: a polynomial order (Horner for Estrin), a coefficient or a
    reduction step other than the definition's, which in float32 shows for about one
    input in 10^8 (when exp lies that close to a rounding boundary), in float64 on most."""
    (_, x64, _), (_, _, _, wide) = helpers
    ok = ~torch.isnan(x64)
    assert np.array_equal(wide[ok].numpy().view(np.int64), oracle.exp64_wide(x64[ok].numpy()).view(np.int64))


@pytest.mark.parametrize("impl", IMPLS)
def test_log64_is_arith_bit_for_bit(helpers, impl):
    (_, _, xl), (_, _, y, _) = helpers
    want = arith.log64(xl, impl=impl)
    assert torch.equal(f64_bits(y), f64_bits(want))
    assert bool((xl[torch.isneginf(y)] == 0).all()) and int(torch.isnan(y).sum()) == 3


def run_fixed(e):
    from tests.kernels import arith_kernels as K

    return K.fixed_sum_of(e)


@pytest.mark.parametrize("n", [3, 1000, 2500])
def test_two_word_sum_is_arith_exact_sum(interp, n):
    """Rows of exps (arith's, of a row's shifted logits), ones, zeros and subnormals: each
    ``h`` is ``rules.mass`` (the sampler's ``q``), ``(h, l)`` the exact words, ``S`` the
    exact sum of detsample.arith's reference and of the numpy oracle. Bug it pins: a
    low word scaled after its truncation, a float sum where the definition sums int64."""
    g = torch.Generator().manual_seed(n)
    z = torch.randn(5, n, generator=g) * 4
    e = arith.exp(z - z.amax(-1, keepdim=True))
    e[1] = 1.0
    e[2] = 0.0
    e[3, ::2] = torch.tensor(1e-40)
    e[4] = arith.exp(-torch.rand(n, generator=g) * 110)
    words, q, hl, S = interp(run_fixed, e)
    frac = spec.frac_bits(n)
    w = e.double() * 2.0**frac
    h = torch.trunc(w)
    lo = torch.trunc((w - h) * 2.0**frac)
    assert torch.equal(words[..., 0], h.to(torch.int64))
    assert torch.equal(words[..., 1], lo.to(torch.int64))
    assert torch.equal(q, rules.mass(e, frac)) and torch.equal(q, words[..., 0])
    assert torch.equal(hl, words.sum(1))
    assert torch.equal(f64_bits(S), f64_bits(reference.fixed_sum(e, frac)))
    for r in range(e.shape[0]):
        assert float(S[r]) == oracle.fixed_sum(e[r].numpy(), frac)
    assert float(S[1]) == n and float(S[2]) == 0.0


@pytest.mark.gpu
def test_helpers_on_cuda_are_the_cpus_bits(cuda):
    """On a GPU: every helper gives detsample.arith's CPU bits (exp64 also in float64
    before its rounding, against the numpy oracle), and the two-word sum the reference's
    exact sum. The aim of the definition, which the interpreter cannot vouch for: the
    GPU's float64 ``+ - * /`` and conversions are IEEE and nothing is contracted."""
    from tests.kernels import arith_kernels as K

    z32, x64, xl = float32_inputs(), float64_inputs(), log_inputs()
    assert torch.equal(f32_bits(K.exp32_of(z32.to(cuda)).cpu()), f32_bits(arith.exp(z32)))
    assert torch.equal(f32_bits(K.exp64_of(x64.to(cuda)).cpu()), f32_bits(arith.exp64(x64)))
    ok = ~torch.isnan(x64)
    wide = K.exp64_wide_of(x64[ok].to(cuda)).cpu()
    assert np.array_equal(wide.numpy().view(np.int64), oracle.exp64_wide(x64[ok].numpy()).view(np.int64))
    assert torch.equal(f64_bits(K.log64_of(xl.to(cuda)).cpu()), f64_bits(arith.log64(xl)))
    e = arith.exp(torch.randn(4, 152064) * 4 - 8).clamp(max=1.0)
    S = K.fixed_sum_of(e.to(cuda))[3].cpu()
    assert torch.equal(f64_bits(S), f64_bits(reference.fixed_sum(e, spec.frac_bits(152064))))
