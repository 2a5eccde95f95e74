"""detsample/penalty_state.py: host-side sparse penalty counts.

Pins: counts lost when the per-row arrays grow past their capacity (the first version
incremented the pre-growth array), prompt tokens counted as output, prompt tokens
tracked for rows whose repetition penalty is neutral, and the COO view going stale.
"""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from detsample import SamplingParams
from detsample.processors.penalty_state import PenaltyState, RowTokens

# name, params, prompt, output, expected snapshot
ROWS = [
    ("prompt-tracked-for-repetition", dict(repetition_penalty=1.2), [1, 1, 2], [2, 3], {1: 0, 2: 1, 3: 1}),
    ("prompt-ignored-without-repetition", dict(frequency_penalty=1.0), [1, 2], [2, 3, 3], {2: 1, 3: 2}),
    ("empty", dict(presence_penalty=1.0), [], [], {}),
]


@pytest.mark.parametrize("name,kw,prompt,output,want", ROWS, ids=[r[0] for r in ROWS])
def test_row_tokens(name, kw, prompt, output, want):
    assert RowTokens(SamplingParams(seed=1, **kw), prompt, output).snapshot() == want


@settings(max_examples=30, deadline=None)
@given(st.lists(st.integers(0, 5000), max_size=300), st.lists(st.integers(0, 5000), max_size=300))
def test_counts_survive_growth(prompt, output):
    """Beyond the initial capacity (16) every count must equal a Counter's."""
    row = RowTokens(SamplingParams(seed=1, repetition_penalty=1.5), prompt, [])
    for t in output:
        row.add(t)
    want = {t: 0 for t in prompt}
    want.update(Counter(output))
    assert row.snapshot() == want


def test_coo_view_follows_advance():
    p = SamplingParams(seed=1, frequency_penalty=1.0)
    st_ = PenaltyState.extend(None, 0, [type("R", (), {"params": p, "prompt_ids": []})()] * 2, [[4], []])
    rows, cols, counts, *_ = st_.coo(torch.device("cpu"))
    assert (rows.tolist(), cols.tolist(), counts.tolist()) == ([0], [4], [1])
    st_.advance([4, -1])
    rows, cols, counts, *_ = st_.coo(torch.device("cpu"))
    assert (rows.tolist(), cols.tolist(), counts.tolist()) == ([0], [4], [2])
    st_.advance([-1, 7])
    rows, cols, counts, *_ = st_.coo(torch.device("cpu"))
    assert (rows.tolist(), cols.tolist(), counts.tolist()) == ([0, 1], [4, 7], [2, 1])
