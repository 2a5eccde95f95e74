"""detsample/ops/penalties.py against oracles/penalties.py.

Pins: penalties applied to the wrong token set (prompt tokens in frequency counts),
the wrong order (scaling before additive), a reciprocal multiply instead of the
specified division, -inf masks revived by a negative penalty, sparse and dense
layouts drifting apart, and constraints leaking into neighbour rows.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from detsample.ops import penalties as ops
from oracles import penalties as orc

V = 64

# name, prompt, output, frequency, presence, repetition
CASES = [
    ("frequency-only", [1, 2], [3, 3, 3, 5], 0.7, 0.0, 1.0),
    ("presence-only", [1, 2], [3, 3, 5], 0.0, 1.5, 1.0),
    ("repetition-only", [1, 2, 2, 9], [3, 5], 0.0, 0.0, 1.1),
    ("repetition<1", [1, 2], [3, 3], 0.0, 0.0, 0.7),
    ("all-three", [1, 2, 3], [3, 3, 4, 60], 0.3, -0.4, 1.7),
    ("negative-additive", [], [0, 0, 63], -2.0, -2.0, 1.0),
    ("empty-output", [4, 5, 6], [], 1.0, 1.0, 1.3),
    ("prompt-not-counted", [7, 7, 7], [8], 1.0, 0.0, 1.0),
]


def _coo(rows_state):
    """rows_state: list of (prompt, output, f, p, r) -> COO tensors of the op."""
    R, C, K, F, P, Rp = [], [], [], [], [], []
    for i, (prompt, output, f, p, r) in enumerate(rows_state):
        counts = Counter(output)
        toks = set(counts) | (set(prompt) if r != 1.0 else set())
        for t in sorted(toks):
            R.append(i), C.append(t), K.append(counts.get(t, 0))
            F.append(f), P.append(p), Rp.append(r)
    i64 = lambda v: torch.tensor(v, dtype=torch.int64)  # noqa: E731
    f32 = lambda v: torch.tensor(v, dtype=torch.float32)  # noqa: E731
    return i64(R), i64(C), torch.tensor(K, dtype=torch.int32), f32(F), f32(P), f32(Rp)


def _dense(rows_state, B):
    counts = torch.zeros((B, V), dtype=torch.int32)
    seen = torch.zeros((B, V), dtype=torch.bool)
    f, p, r = (torch.zeros((B, 1)), torch.zeros((B, 1)), torch.ones((B, 1)))
    for i, (prompt, output, fi, pi, ri) in enumerate(rows_state):
        for t in output:
            counts[i, t] += 1
            seen[i, t] = True
        for t in prompt:
            seen[i, t] = True
        f[i], p[i], r[i] = fi, pi, ri
    return counts, seen, f, p, r


def _logits(B, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn((B, V), generator=g) * 4
    x[:, 0] = 0.0
    x[:, 1] = -0.0
    return x


@pytest.mark.parametrize("name,prompt,output,f,p,r", CASES, ids=[c[0] for c in CASES])
def test_penalties_match_oracle(name, prompt, output, f, p, r):
    """Bitwise against the float32 oracle, within 2 ulp of the float64 oracle."""
    x = _logits(1)
    got = ops.apply_penalties_coo_(x.clone(), _coo([(prompt, output, f, p, r)]))[0].numpy()
    want32 = orc.penalize_row(x[0].numpy(), prompt, output, f, p, r, dtype=np.float32)
    assert np.array_equal(got.view(np.int32), want32.view(np.int32))
    want64 = orc.penalize_row(x[0].numpy(), prompt, output, f, p, r)
    np.testing.assert_allclose(got, want64, rtol=2 * 2.0**-23, atol=1e-6)


def test_dense_and_coo_layouts_bitwise_equal():
    """The sparse layout must not change a bit relative to vLLM's dense layout."""
    rows = [(pr, out, f, p, r) for _, pr, out, f, p, r in CASES]
    x = _logits(len(rows), seed=3)
    a = ops.apply_penalties_coo_(x.clone(), _coo(rows))
    b = ops.apply_penalties_dense_(x.clone(), *_dense(rows, len(rows)))
    assert torch.equal(a.view(torch.int32), b.view(torch.int32))


def test_repetition_is_a_true_division():
    """x / r, not x * (1 / r): they differ in the last bit for some x at r = 1.1."""
    x = torch.linspace(0.1, 50.0, 4001, dtype=torch.float32).reshape(1, -1)
    r = torch.tensor(1.1, dtype=torch.float32)
    cols = torch.arange(x.shape[1])
    rows = torch.zeros_like(cols)
    n = cols.numel()
    got = ops.apply_penalties_coo_(
        x.clone(), (rows, cols, torch.zeros(n, dtype=torch.int32), torch.zeros(n), torch.zeros(n), r.expand(n).clone())
    )
    assert torch.equal(got, x / r)
    assert not torch.equal(got, x * (1.0 / r))  # the distinction is real


def test_negative_logits_are_multiplied():
    x = torch.tensor([[-2.0, -0.0, 0.0, 3.0]])
    n = 4
    got = ops.apply_penalties_coo_(
        x.clone(),
        (
            torch.zeros(n, dtype=torch.int64),
            torch.arange(n),
            torch.zeros(n, dtype=torch.int32),
            torch.zeros(n),
            torch.zeros(n),
            torch.full((n,), 2.0),
        ),
    )
    assert got.tolist() == [[-4.0, -0.0, 0.0, 1.5]]
    assert torch.signbit(got[0, 1]) and not torch.signbit(got[0, 2])


def test_masked_token_stays_masked_under_negative_penalty():
    """A -inf logit (a processor's mask) must not become finite or NaN."""
    x = torch.full((1, 4), float("-inf"))
    got = ops.apply_penalties_coo_(
        x.clone(),
        (
            torch.zeros(1, dtype=torch.int64),
            torch.tensor([2]),
            torch.tensor([3], dtype=torch.int32),
            torch.tensor([-3e38]),
            torch.tensor([-3e38]),
            torch.tensor([0.5]),
        ),
    )
    assert torch.isneginf(got).all()


# name, allowed, bans
CONSTRAINTS = [
    ("allowed-subset", [3, 7, 63], []),
    ("allowed-and-ban", [3, 7], [(0, 7)]),
    ("ban-only", None, [(0, 1), (0, 1), (0, 40)]),
]


@pytest.mark.parametrize("name,allowed,bans", CONSTRAINTS, ids=[c[0] for c in CONSTRAINTS])
def test_constraints_match_oracle_and_spare_neighbours(name, allowed, bans):
    x = _logits(3, seed=5)
    y = x.clone()
    if allowed is not None:
        t = torch.tensor(allowed)
        ops.restrict_to_allowed_(y, torch.tensor([0]), torch.zeros_like(t), t)
    if bans:
        rc = torch.tensor(bans)
        ops.ban_tokens_(y, rc[:, 0], rc[:, 1])
    want = orc.allowed_row(x[0].numpy().astype(np.float64), allowed)
    for _, t in bans:
        want[t] = -np.inf
    assert np.array_equal(y[0].numpy().astype(np.float64), want)
    assert torch.equal(y[1:], x[1:])


BAD_WORDS = [
    ("single-always", [1, 2], [[5]], {5}),
    ("prefix-matches", [1, 2, 3], [[2, 3, 9]], {9}),
    ("prefix-not-at-end", [2, 3, 1], [[2, 3, 9]], set()),
    ("prefix-longer-than-output", [3], [[2, 3, 9]], set()),
    ("two-sequences", [4], [[4, 8], [7], [5, 6]], {7, 8}),
]


@pytest.mark.parametrize("name,out,bad,want", BAD_WORDS, ids=[c[0] for c in BAD_WORDS])
def test_bad_words_oracle_rule(name, out, bad, want):
    assert orc.banned_by_bad_words(out, bad) == want


row_state = st.tuples(
    st.lists(st.integers(0, V - 1), max_size=12),
    st.lists(st.integers(0, V - 1), max_size=12),
    st.floats(-2, 2, width=32),
    st.floats(-2, 2, width=32),
    st.floats(0.0625, 4, width=32),
)


@settings(max_examples=40, deadline=None)
@given(st.lists(row_state, min_size=1, max_size=5), st.integers(0, 2**16))
def test_penalties_property_oracle_and_row_locality(rows, seed):
    """Random rows: bitwise float32 oracle per row; each row equals itself alone."""
    x = _logits(len(rows), seed)
    got = ops.apply_penalties_coo_(x.clone(), _coo(rows))
    for i, (pr, out, f, p, r) in enumerate(rows):
        want = orc.penalize_row(x[i].numpy(), pr, out, f, p, r, dtype=np.float32)
        assert np.array_equal(got[i].numpy().view(np.int32), want.view(np.int32))
        alone = ops.apply_penalties_coo_(x[i : i + 1].clone(), _coo([rows[i]]))
        assert torch.equal(alone[0].view(torch.int32), got[i].view(torch.int32))
    dense = ops.apply_penalties_dense_(x.clone(), *_dense(rows, len(rows)))
    assert torch.equal(dense.view(torch.int32), got.view(torch.int32))
