"""detsample/ops/colcdf.py: the draw of a masked row over its allowed columns equals the
full-vocabulary pass (``scale_logits``, ``block_cdf``, ``draw_by_blocks``) bit for bit.

Pins: a padded column of a short row next to a long one must carry no mass; a listed
column whose logit is itself ``-inf`` carries none either; min-p, temperatures far from
1, huge magnitudes (``x - max`` overflowing to ``-inf``), ties and signed zeros change
nothing.
"""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from detsample import rules
from detsample.ops import colcdf as C
from detsample.ops import draw as D
from detsample.ops.temperature import scale_logits
from detsample.rng import row_uniforms
from detsample.rules import PAD_ID, frac_bits
from tests.helpers import logits_rows

FAMILIES = ["random", "peaked", "ties", "neginf", "bf16", "huge", "zeros"]
DENSITIES = [0.002, 0.03, 0.2, 0.6, 1.0]
TEMPERATURES = [1e-3, 0.5, 1.0, 1.7, 100.0]
MIN_PS = [0.0, 0.0, 0.05, 0.5, 1.0]


def _masked(rng, family, B, V):
    """(B, V) float32 logits masked to random allowed sets (at least one finite allowed
    logit per row) and each row's allowed columns."""
    if family == "zeros":  # +0.0 / -0.0 ties at the maximum
        x = rng.choice(np.array([0.0, -0.0, -1.0], np.float32), (B, V))
    else:
        x = logits_rows(rng, B, V, family)
    allowed = rng.random((B, V)) < rng.choice(DENSITIES, (B, 1))
    for r in range(B):
        if not np.isfinite(x[r][allowed[r]]).any():
            c = int(rng.integers(0, V))
            allowed[r, c] = True
            x[r, c] = 0.5
    return np.where(allowed, x, np.float32(-np.inf)), [np.flatnonzero(a) for a in allowed]


def _full_pass(x, shift, temps, min_p, frac, u):
    z = scale_logits(x, shift, temps)
    tau = torch.full((x.shape[0],), float("-inf"))
    q, bsum = D.block_cdf(z, tau, min_p, frac, cut_tau=False)
    return q, bsum[:, -1], D.draw_by_blocks(q, bsum, u)


@settings(max_examples=120, deadline=None)
@given(st.integers(0, 2**32 - 1), st.sampled_from(FAMILIES), st.integers(1, 6), st.integers(33, 2100))
def test_column_draw_equals_the_full_pass(seed, family, B, V):
    """Property: same kept mass Q, same masses on the allowed columns and same drawn
    token as the full-vocabulary pass, for any subset of rows in any order (rows of
    different lengths padded in one table)."""
    rng = np.random.default_rng(seed)
    xm, cols = _masked(rng, family, B, V)
    x = torch.from_numpy(xm)
    shift = x.amax(1, keepdim=True)
    temps = torch.from_numpy(rng.choice(TEMPERATURES, (B, 1)).astype(np.float32))
    min_p = rules.element_tensor(B, min_p=torch.from_numpy(rng.choice(MIN_PS, B).astype(np.float32)))
    frac = frac_bits(V)
    u = row_uniforms(torch.from_numpy(rng.integers(0, 2**62, B)), torch.arange(B))
    q, total, tokens = _full_pass(x, shift, temps, min_p, frac, u)
    rows = rng.permutation(B)[: int(rng.integers(1, B + 1))].tolist()
    ri = torch.tensor(rows)
    known = [xm[r, cols[r]] if rng.random() < 0.5 else None for r in rows]  # already read
    vals, ids = C.gather_columns(x, rows, [cols[r] for r in rows], known)
    ids, csum = C.column_cdf(
        vals,
        ids,
        shift[ri],
        temps[ri],
        min_p[ri],
        frac,
        cut_element=None if rng.random() < 0.5 else bool((min_p > 0).any()),
    )
    assert torch.equal(csum[:, -1], total[ri])
    assert torch.equal(D.draw_by_cdf(ids, csum, u[ri]), tokens[ri])
    for i, r in enumerate(rows):  # the masses themselves, column by column
        n = cols[r].size
        assert torch.equal(ids[i, :n], torch.from_numpy(cols[r]))
        assert bool((ids[i, n:] == PAD_ID).all())
        mass = torch.diff(csum[i], prepend=torch.zeros(1, dtype=torch.int64))
        assert torch.equal(mass[:n], q[r, cols[r]]) and not bool(mass[n:].any())
        assert int(q[r].sum()) == int(total[r])  # nothing outside the columns


_SHARED = np.array([1, 4, 8])  # one grammar state's columns, shared by several rows
GATHER_CASES = [
    ([2, 0, 1], [_SHARED, np.array([3]), _SHARED]),  # a shared array, rows out of order
    ([0, 1, 2], [_SHARED, _SHARED, _SHARED]),  # every row, in order, one state
    ([0], [np.array([3, 7])]),  # one row
    ([2, 0], [np.array([1, 2, 3]), np.array([0])]),  # padded, rows out of order
    ([1, 2], [np.array([4, 5]), np.array([6, 9])]),  # one width: no padding
    ([1], [np.array([], dtype=np.int64)]),  # no column at all
]


@pytest.mark.parametrize("rows,cols", GATHER_CASES)
def test_gather_columns_pads_with_neg_inf_and_pad_id(rows, cols):
    """Values at the listed columns, then -inf values and PAD_ID ids."""
    x = torch.arange(30, dtype=torch.float32).reshape(3, 10)
    vals, ids = C.gather_columns(x, rows, cols)
    k = max(max(c.size for c in cols), 1)
    assert vals.shape == ids.shape == (len(rows), k) and vals.dtype == torch.float32
    for i, (r, c) in enumerate(zip(rows, cols)):
        assert torch.equal(vals[i, : c.size], x[r, c])
        assert torch.equal(ids[i, : c.size], torch.from_numpy(c).long())
        assert bool(torch.isneginf(vals[i, c.size :]).all())
        assert bool((ids[i, c.size :] == PAD_ID).all())
