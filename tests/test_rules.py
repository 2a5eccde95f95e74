"""detsample.rules: each rule gives the same bits in every container it takes (torch,
numpy, Python scalars) and the exact value where one is defined, on tests/rules_cases.py
(the table the Triton spellings are run on too, tests/kernels/test_rules.py).

Bugs it pins: a spelling of the mass that scales in float64 for one container and float32
for another, a top-p test compared as int < float (exact in Python, rounded in torch), a
draw target without its clamp, a uniform off by the half-ulp.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from detsample import arith, rules
from tests import rules_cases as C

F32 = np.float32


@pytest.mark.parametrize("e,frac", C.MASS)
def test_mass(e, frac):
    want = math.floor(Fraction(e) * 2**frac)  # exact trunc(e * 2**frac)
    assert rules.mass(torch.tensor([e], dtype=torch.float32), frac).tolist() == [want]
    assert rules.mass(np.array([e], dtype=np.float32), frac).tolist() == [want]
    assert rules.mass(e, frac) == want
    w = torch.tensor([e], dtype=torch.float32)
    assert rules.mass_in_place(w, frac, torch.empty(1, dtype=torch.int64)).tolist() == [want]


def test_exp_floor_changes_no_mass():
    z = torch.tensor([0.0, -86.9, -87.0, -87.5, -200.0, float("-inf")])
    frac = rules.frac_bits(2)
    assert torch.equal(rules.mass(rules.floored_exp(z), frac), rules.mass(arith.exp(z), frac))
    assert math.exp(rules.EXP_FLOOR) * 2.0**rules.MAX_FRAC < 1.0


_TIES = [0.0, -0.0, -1.0, -1.5, -86.9, -87.0, -87.5, -200.0, float("-inf")]


@settings(max_examples=60, deadline=None)
@given(
    rows=st.lists(
        st.lists(st.sampled_from(_TIES) | st.floats(-100, 0, width=32), min_size=1, max_size=9), min_size=1, max_size=4
    ),
    taus=st.lists(st.sampled_from(_TIES) | st.floats(-100, 0, width=32), min_size=4, max_size=4),
    frac=st.integers(1, rules.MAX_FRAC),
)
def test_floored_exp_keep_from_drops_values_below_the_threshold(rows, taus, frac):
    """Bug pinned: a cut made on the exps (``exp(z) >= exp(tau)``) keeps a value below
    tau whose exp rounds onto tau's; the cut compares values, ties at tau kept (0.0
    and -0.0 alike), -inf thresholds keep the row, values below the floor carry 0."""
    V = max(len(r) for r in rows)
    z = torch.tensor([r + [float("-inf")] * (V - len(r)) for r in rows], dtype=torch.float32)
    tau = torch.tensor(taus[: len(rows)], dtype=torch.float32)
    want = rules.mass(arith.exp(z), frac) * (z >= tau.unsqueeze(1))
    for mode in ("fresh", "scratch", "in place"):
        src = z.clone()
        out = {"fresh": None, "scratch": torch.empty_like(z), "in place": src}[mode]
        got = rules.mass(rules.floored_exp(src, out=out, keep_from=tau), frac)
        assert torch.equal(got, want)
    meta = z.to("meta")  # the device-generic branch (masked_fill_) keeps its shapes
    assert rules.floored_exp(meta, keep_from=tau.to("meta")).shape == z.shape


@pytest.mark.parametrize("V", [rules.ROW_THRESHOLD_MIN - 1, rules.ROW_THRESHOLD_MIN])
def test_floored_exp_keep_from_is_the_same_set_by_either_drop(V):
    """Every form of the drop (one ``threshold_`` when the rows share tau, one per row
    from ROW_THRESHOLD_MIN entries a row, a masked fill below) keeps ``z >= tau``, ties
    and -0.0 included."""
    g = torch.Generator().manual_seed(V)
    z = (torch.randn(3, V, generator=g) * 4).round()  # many ties at tau
    z[:, :5] = torch.tensor([0.0, -0.0, -1.0, float("-inf"), -90.0])
    z = z - z.amax(1, keepdim=True)
    frac = rules.frac_bits(V)
    for tau in (torch.tensor([-1.0, 0.0, float("-inf")]), torch.full((3,), -1.0)):
        want = rules.mass(arith.exp(z), frac) * (z >= tau.unsqueeze(1))
        assert torch.equal(rules.mass(rules.floored_exp(z, keep_from=tau), frac), want)


def test_floored_exp_keep_from_is_not_a_cut_on_the_exps():
    """A value just below tau whose exp equals tau's exp (float32 ``exp`` is flat there)
    is dropped: a cut on the exps would keep it."""
    tau = torch.tensor([-0.25])
    below = torch.nextafter(tau, torch.tensor(-math.inf))
    assert torch.equal(arith.exp(below), arith.exp(tau))  # the premise of the bug
    z = torch.stack([tau, below], 1)
    got = rules.mass(rules.floored_exp(z, keep_from=tau), rules.MAX_FRAC)
    assert got[0, 0] > 0 and got[0, 1] == 0


@pytest.mark.parametrize("above,top_p,total", C.TOP_P)
def test_top_p(above, top_p, total):
    # the rule, in float64: float64(above) < top_p * float64(total)
    want = top_p >= 1.0 or float(above) < top_p * float(total)
    t_lim = rules.top_p_limit(torch.tensor([top_p], dtype=torch.float64), torch.tensor([total], dtype=torch.int64))
    n_lim = rules.top_p_limit(np.array([top_p]), np.array([total], dtype=np.int64))
    p_lim = rules.top_p_limit(top_p, total)
    assert rules.top_p_keeps(torch.tensor([above]), t_lim).tolist() == [want]
    assert rules.top_p_keeps(np.array([above], dtype=np.int64), n_lim).tolist() == [want]
    assert rules.top_p_keeps(above, p_lim) is want


def test_top_p_is_not_the_exact_integer_comparison():
    """2**53 + 1 rounds to 2**53 in float64: the rule says 'not below 2**53' where the
    exact comparison of a Python int says it is above."""
    assert rules.top_p_keeps(2**53 + 1, float(2**53) + 2.0)
    assert not rules.top_p_keeps(2**53 + 1, float(2**53))


@pytest.mark.parametrize("e,min_p", C.MIN_P)
def test_min_p(e, min_p):
    want = F32(e) >= F32(min_p)
    te, tm = torch.tensor([e], dtype=torch.float32), torch.tensor([min_p], dtype=torch.float32)
    assert rules.min_p_keeps(te, tm).tolist() == [want]
    assert rules.min_p_drops(te, tm).tolist() == [not want]
    assert rules.min_p_keeps(np.float32(e), np.float32(min_p)) == want
    assert rules.min_p_keeps(float(F32(e)), float(F32(min_p))) == want


def test_min_p_is_the_element_filter_registry_entry():
    """The registry holds min-p as its one element-wise filter (field, neutral value,
    keep-test); ``element_keeps`` over a (rows, F) tensor is that test, column by
    column. Pins a strategy's registry reading min-p's column with another rule."""
    assert [(f.name, f.neutral, f.keeps) for f in rules.ELEMENT_FILTERS] == [("min_p", 0.0, rules.min_p_keeps)]
    e = torch.tensor([[F32(a) for a, _ in C.MIN_P]], dtype=torch.float32)
    m = torch.tensor([F32(b) for _, b in C.MIN_P], dtype=torch.float32)
    got = torch.stack(
        [rules.element_keeps(e[:, i : i + 1], rules.element_tensor(1, min_p=m[i])) for i in range(len(C.MIN_P))], 1
    ).flatten()
    assert got.tolist() == [bool(F32(a) >= F32(b)) for a, b in C.MIN_P]


def test_element_tensor_and_active_rows():
    """``element_tensor`` fills unnamed filters with their neutral value and refuses an
    unknown name; ``element_active`` flags exactly the rows off neutral;
    ``element_values`` reads a row's fields in registry order."""
    t = rules.element_tensor(3, min_p=torch.tensor([0.0, 0.25, 0.0]))
    assert t.shape == (3, len(rules.ELEMENT_FILTERS)) and t.dtype == torch.float32
    assert rules.element_active(t).tolist() == [False, True, False]
    assert rules.element_active(rules.element_tensor(2)).tolist() == [False, False]
    with pytest.raises(ValueError, match="not an element-wise filter: \\['epsilon'\\]"):
        rules.element_tensor(1, epsilon=0.1)
    from detsample import SamplingParams

    assert rules.element_values(SamplingParams(min_p=0.5)) == [0.5]
    assert rules.element_in_use(SamplingParams(min_p=0.5))
    assert not rules.element_in_use(SamplingParams())


@pytest.mark.parametrize("u,total", C.DRAW)
def test_draw_target(u, total):
    want = min(math.floor(u * float(total)), total - 1)
    assert 0 <= want <= total - 1
    got_t = rules.draw_target(torch.tensor([u], dtype=torch.float64), torch.tensor([total], dtype=torch.int64))
    got_n = rules.draw_target(np.array([u]), np.array([total], dtype=np.int64))
    assert got_t.tolist() == [want] and got_n.tolist() == [want]
    assert rules.draw_target(u, total) == want


@pytest.mark.parametrize("csum,t", C.FIRST_ABOVE)
def test_first_above(csum, t):
    want = next((j for j, c in enumerate(csum) if c > t), len(csum))
    got_t = rules.first_above(torch.tensor([csum]), torch.tensor([[t]]))
    assert got_t.tolist() == [[want]]
    assert rules.first_above(np.array([csum]), np.array([t])).tolist() == [want]
    assert rules.first_above(np.array(csum), t) == want
    assert rules.first_above(iter(csum), t) == want


@pytest.mark.parametrize("w0,w1", C.UNIFORM)
def test_uniform(w0, w1):
    n = (w0 << 20) | (w1 >> 12)
    want = float(Fraction(2 * n + 1, 2**53))  # exact in float64
    assert 0.0 < want < 1.0
    assert rules.uniform(rules.u52(w0, w1)) == want
    tn = rules.u52(torch.tensor([w0]), torch.tensor([w1]))
    assert rules.uniform(tn).tolist() == [want]
    nn = rules.u52(np.array([w0], dtype=np.uint64), np.array([w1], dtype=np.uint64))
    assert rules.uniform(nn).tolist() == [want]


def test_pad_id_is_above_every_token_id():
    assert rules.PAD_ID == torch.iinfo(torch.int64).max == np.iinfo(np.int64).max


@given(
    st.integers(1, 5),
    st.integers(1, 700),
    st.integers(0, 2**31 - 1),
    st.sampled_from([None, 1, 7, 64, 1024]),
    st.booleans(),
    st.booleans(),
    st.booleans(),
)
def test_cut_masses_fused_pass_is_the_torch_composition(rows, V, seed, block, with_tau, with_least, want_q):
    """rules.cut_masses on a CPU is one fused numba pass; bit for bit the torch
    composition floored_exp -> keep_at_least -> mass_in_place -> block sums it replaces:
    values under the exp floor, -inf, ties at tau, exps equal to ``least``, blocks that
    do not divide V. Bugs it would catch: a cut on the unclamped value, ``>`` for ``>=``,
    a block sum off by the short last block, the masses written when not wanted."""
    rng = np.random.default_rng(seed)
    z = (rng.standard_normal((rows, V)) * 30).astype(np.float32)
    z[rng.random((rows, V)) < 0.1] = -np.inf
    z[:, 0] = 0.0
    z[rng.random((rows, V)) < 0.2] = np.float32(-1.5)
    zt = torch.from_numpy(np.minimum(z, 0))
    tau = (
        torch.where(torch.from_numpy(rng.random(rows) < 0.7), torch.tensor(-1.5), torch.tensor(-math.inf))
        if with_tau
        else None
    )
    least = arith.exp(torch.full((rows,), -1.5)) if with_least else None  # ties on e too
    frac = rules.frac_bits(V)
    got = rules.cut_masses(zt, frac, tau=tau, least=least, block=block, want_q=want_q)
    assert rules.fused_masses(zt)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(rules, "fused_masses", lambda z: False)
        want = rules.cut_masses(zt, frac, tau=tau, least=least, block=block)
    assert torch.equal(got[1], want[1])
    assert (got[0] is None) != want_q
    if want_q:
        assert torch.equal(got[0], want[0])
