"""detsample.ops.topkdraw: the small top-k shortcut (steps 7-10 of each row in one numba
pass) against the sampler's general path (``Sampler._sample``, the torch-composed
steps), bit for bit: tokens, logprobs, top logprobs, status."""

from __future__ import annotations

from unittest import mock

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from detsample import Sampler, SamplingBatch, SamplingParams, rules
from detsample.ops import topkdraw
from tests.helpers import logits_rows, requests_from

pytestmark = pytest.mark.skipif(not rules.fused_masses(torch.zeros(1)), reason="numba is not installed")


def _outputs_equal(a, b) -> bool:
    ok = (
        torch.equal(a.token_ids, b.token_ids)
        and torch.equal(a.logprobs.view(torch.int32), b.logprobs.view(torch.int32))
        and torch.equal(a.status, b.status)
        and torch.equal(a.seeds, b.seeds)
    )
    if (a.top_logprobs is None) != (b.top_logprobs is None):
        return False
    if a.top_logprobs is not None:
        ok = ok and torch.equal(a.top_logprobs[0].view(torch.int32), b.top_logprobs[0].view(torch.int32))
        ok = ok and torch.equal(a.top_logprobs[1], b.top_logprobs[1])
    return ok


class _Counted:
    """Counts the kernel's calls that drew (``drawn``) and that handed back (``none``);
    ``last``: the last :class:`~detsample.ops.topkdraw.Drawn`."""

    def __init__(self):
        self.drawn = self.none = 0
        self.last = None
        self._patch = mock.patch.object(topkdraw, "draw", self._draw)
        self._real = topkdraw.draw

    def _draw(self, *a, **k):
        got = self._real(*a, **k)
        if got is None:
            self.none += 1
        else:
            self.drawn += 1
            self.last = got
        return got

    def __enter__(self):
        self._patch.start()
        return self

    def __exit__(self, *exc):
        self._patch.stop()


def _run(params, x, pos, deterministic=True, counted=None):
    """The sampler's output (the shortcut where it runs) and the general path's; with
    ``counted``, the kernel's kept thresholds and masses are the general path's too
    (each mass bit counts there: a token rarely shows a one-ulp change of a mass)."""
    V = x.shape[1]
    batch = SamplingBatch.from_requests(requests_from(params), V)
    s = Sampler(deterministic=deterministic)
    before = None if counted is None else counted.drawn
    fast, general = s.sample(x, batch, pos), s._sample(x, batch, pos)
    if counted is not None and counted.drawn != before:
        cdf = s._steps(x, batch, pos).cdf
        assert torch.equal(torch.from_numpy(counted.last.total), cdf.total)
        assert torch.equal(torch.from_numpy(counted.last.tau).view(torch.int32), cdf.tau.view(torch.int32))
    return fast, general


def _logits(rng, B, V, family):
    if family == "spill":  # a tie group straddles every row's candidate bound
        x = logits_rows(rng, B, V, "random")
        x[:, : min(V, 40)] = 50.0
        return torch.from_numpy(x)
    if family == "kth-tie":  # ties at the k-th value that end inside the candidates
        x = logits_rows(rng, B, V, "random")
        x[:, 10:13] = 40.0
        x[:, 20:22] = 41.0
        return torch.from_numpy(x)
    if family == "posinf":  # one +inf logit in the last row (sanitised there)
        x = logits_rows(rng, B, V, "random")
        x[-1, 7] = np.inf
        return torch.from_numpy(x)
    if family == "dead-row":  # the last row all -inf (no admissible token)
        x = logits_rows(rng, B, V, "random")
        x[-1] = -np.inf
        return torch.from_numpy(x)
    if family == "zeros":  # the maximum is 0 with both signs present
        x = -np.abs(logits_rows(rng, B, V, "random"))
        x[:, [1, 3]] = -0.0
        x[:, 2] = 0.0
        return torch.from_numpy(x)
    if family == "overflow":  # finite, but x - max overflows to -inf
        return torch.from_numpy(rng.uniform(-3.4e38, 3.4e38, (B, V)).astype(np.float32))
    return torch.from_numpy(logits_rows(rng, B, V, family))


ROWS = [
    dict(temperature=0.8, top_k=20, top_p=0.9),
    dict(temperature=1.2, top_k=5),
    dict(temperature=0.5, top_k=12, min_p=0.1, logprobs=3),
    dict(temperature=0.9, top_k=8, top_p=0.3, min_p=0.05),
    dict(temperature=0.7, top_k=20, top_p=1.0, logprobs=1),
    dict(temperature=2.0, top_k=3),
    dict(temperature=0.05, top_k=2, top_p=0.5),
]
#: family -> whether the kernel draws every row (else it hands the batch back; None:
#: either, by where the rounded values' tie groups fall)
FAMILIES = {
    "random": True,
    "peaked": True,
    "ties": None,
    "bf16": None,
    "onehot": False,  # the k-th value's tie group is the whole row but one
    "neginf": True,
    "huge": True,
    "zeros": True,
    "overflow": True,
    "kth-tie": True,
    "spill": False,  # grown on the general path
    "nan": False,  # sanitised there
    "mixed": False,  # NaN, all -inf rows
    "posinf": False,
    "dead-row": False,
}


@pytest.mark.parametrize("family", sorted(FAMILIES))
@pytest.mark.parametrize("B", [1, 4, 7])
def test_the_shortcut_gives_the_general_paths_bits(family, B):
    """Every row of a batch of small top-k rows (top-p, min-p, top logprobs, tiny and
    large temperatures): the shortcut's token, logprob and top logprobs are the general
    path's bit for bit, and it hands back exactly the batches it must (a NaN, +inf or
    all -inf row; a tie group past the candidates). Bugs it would catch: a kept test
    with ``>`` for ``>=`` (a tie group at the k-th or top-p boundary split), the
    exclusive running mass taken inclusive, the mass or the scaled value rounded
    another way, a NaN row drawn instead of sanitised."""
    rng = np.random.default_rng(B * 7 + len(family))
    V = 1000
    x = _logits(rng, B, V, family)
    params = [SamplingParams(seed=i, **ROWS[i % len(ROWS)]) for i in range(B)]
    with _Counted() as counted:
        for step in range(3):
            pos = torch.arange(B) + 11 * step
            fast, general = _run(params, x, pos, counted=counted)
            assert _outputs_equal(fast, general), (family, B, step)
    if FAMILIES[family]:
        assert counted.drawn == 3 and counted.none == 0
    elif FAMILIES[family] is False:
        assert counted.none == 3 and counted.drawn == 0
    else:
        assert counted.none + counted.drawn == 3


@st.composite
def _case(draw):
    B = draw(st.integers(1, 6))
    V = draw(st.sampled_from([9, 16, 17, 64, 257, 1000, 4099]))
    family = draw(
        st.sampled_from(["random", "ties", "bf16", "neginf", "huge", "peaked", "kth-tie", "nan", "posinf", "zeros"])
    )
    rows = []
    for _ in range(B):
        rows.append(
            dict(
                temperature=draw(st.sampled_from([0.05, 0.5, 1.0, 1.7, 30.0])),
                top_k=draw(st.integers(2, max(2, V // 8))),
                top_p=draw(st.sampled_from([1.0, 0.9, 0.5, 0.05, 0.999])),
                min_p=draw(st.sampled_from([0.0, 0.0, 0.02, 0.3])),
                logprobs=draw(st.sampled_from([0, 0, 2])),
            )
        )
    return B, V, family, rows, draw(st.integers(0, 2**31)), draw(st.booleans())


@settings(max_examples=80, deadline=None)
@given(_case())
def test_random_batches_take_the_general_paths_bits(case):
    """Random batches of small top-k rows (top-k 2 with K = 3 candidates at V = 16, 17;
    at V = 9 no top-k is small: the general path alone; the fast mode too): the
    sampler's output with the shortcut is the general path's, bit for bit, and the
    kernel draws every batch without a NaN, a +inf or a tie."""
    B, V, family, rows, seed, deterministic = case
    rng = np.random.default_rng(seed)
    x = _logits(rng, B, V, family)
    if V < 16 and family == "kth-tie":
        x = torch.from_numpy(logits_rows(rng, B, V, "ties"))
    params = [SamplingParams(seed=seed % 1000 + i, **r) for i, r in enumerate(rows)]
    pos = torch.from_numpy(rng.integers(0, 2**40, B))
    with _Counted() as counted:
        fast, general = _run(params, x, pos, deterministic, counted=counted)
    assert _outputs_equal(fast, general)
    if family in ("random", "peaked") and V >= 16:  # no NaN, +inf or tie: the kernel drew
        assert counted.drawn == 1


def test_the_kernel_draws_each_row_as_it_draws_it_alone():
    """A row's token and logprob do not depend on its neighbours or its place in the
    batch (each row is one thread's, its scratch its own): the batch's rows equal the
    rows drawn one by one, in another order."""
    rng = np.random.default_rng(3)
    B, V = 9, 4000
    x = torch.from_numpy(logits_rows(rng, B, V, "peaked"))
    params = [SamplingParams(seed=i, **ROWS[i % len(ROWS)]) for i in range(B)]
    pos = torch.arange(B) + 3
    whole, _ = _run(params, x, pos)
    for i in reversed(range(B)):
        alone, _ = _run([params[i]], x[i : i + 1], pos[i : i + 1])
        assert torch.equal(whole.token_ids[i : i + 1], alone.token_ids)
        assert torch.equal(whole.logprobs[i : i + 1].view(torch.int32), alone.logprobs.view(torch.int32))


@pytest.mark.parametrize(
    "params",
    [
        [dict(temperature=0.8, top_k=20), dict(temperature=0.8)],  # a plain row beside
        [dict(temperature=0.8, top_k=20), dict(temperature=0.0)],  # a greedy row beside
        [dict(temperature=0.8, top_k=20), dict(temperature=0.8, top_p=0.9)],  # a wide top-p row
        [dict(temperature=0.8, top_k=20, logprobs_mode="processed")],
        [dict(temperature=0.8, top_k=20, presence_penalty=0.5)],
        [dict(temperature=0.8, top_k=200)],  # not small: 200 * 8 > V
    ],
)
def test_batches_outside_the_shortcut_take_the_general_path(params):
    """The kernel never runs where its semantics are not the batch's: a row without a
    small top-k, a mode other than "raw", steps 1-5 in use."""
    V = 1000
    x = torch.from_numpy(logits_rows(np.random.default_rng(1), len(params), V, "random"))
    ps = [SamplingParams(seed=i, **p) for i, p in enumerate(params)]
    with _Counted() as counted:
        fast, general = _run(ps, x, torch.arange(len(ps)))
    assert _outputs_equal(fast, general)
    assert counted.drawn == 0 and counted.none == 0


@pytest.mark.parametrize("B, family", [(1, "peaked"), (3, "peaked"), (3, "posinf"), (3, "dead-row")])
def test_a_long_row_of_a_small_batch_splits_its_normaliser(B, family):
    """B < threads and V >= 65,536: the maxima and normalisers come from the column-split
    pass (its exact words summed), the rest from the kernel; at 1-4 threads (rows split
    over the threads, or each row's columns) the same bits as the general path and as
    each other, an invalid row handed back there as on the one-pass path."""
    rng = np.random.default_rng(4)
    x = _logits(rng, B, 1 << 17, family)
    params = [SamplingParams(seed=5 + i, temperature=0.8, top_k=50, top_p=0.9) for i in range(B)]
    before = torch.get_num_threads()
    try:
        outs = []
        for t in (1, 2, 3, 4):
            torch.set_num_threads(t)
            fast, general = _run(params, x, torch.arange(B) + 17)
            assert _outputs_equal(fast, general), t
            outs.append(fast)
        assert all(_outputs_equal(outs[0], o) for o in outs[1:])
    finally:
        torch.set_num_threads(before)


LN2 = float(np.float32(np.log(2.0)))


@pytest.mark.parametrize(
    "top_p, kept",
    [
        (0.5, 1),  # the mass above the 2nd value is exactly the limit: not kept
        (0.5000001, 3),  # just above it: the tie group of the 2nd value kept whole
        (0.75, 3),
    ],
)
def test_a_mass_exactly_at_the_top_p_limit_is_cut(top_p, kept):
    """exp(-ln 2) rounds to 1/2 exactly, so the masses are 2**F, 2**(F-1), 2**(F-1) and,
    at top-p 1/2, the mass above the 2nd value equals the limit ``top_p * Z``: the rule
    keeps a value only when the mass above it is strictly below (``rules.top_p_keeps``).
    Bug it would catch: ``<=`` for ``<`` (three tokens kept at top-p 1/2)."""
    V = 24
    x = torch.full((1, V), -200.0)
    x[0, 5], x[0, 9], x[0, 17] = 0.0, -LN2, -LN2
    params = [SamplingParams(seed=1, temperature=1.0, top_k=3, top_p=top_p)]
    F = rules.frac_bits(V)
    with _Counted() as counted:
        for p in range(6):
            fast, general = _run(params, x, torch.tensor([p]), counted=counted)
            assert _outputs_equal(fast, general)
            assert int(counted.last.total[0]) == (1 << F) + (kept - 1) * (1 << (F - 1))
    assert counted.drawn == 6


@given(st.lists(st.integers(0, 5), min_size=1, max_size=12), st.data())
def test_the_draw_hits_the_running_masses_as_the_torch_table_does(qs, data):
    """``draw_kept`` (a kept subset of candidates, their masses, a uniform) against
    ``ops.draw.id_order_cdf`` + ``draw_by_cdf``, with uniforms that land exactly on a
    running mass (``u * Q`` an integer) and zero masses. Bug it would catch: the first
    running mass ``>= t`` taken for the first ``> t``."""
    from detsample.ops import draw as draw_ops
    from detsample.ops import topkdrawjit

    K = len(qs)
    kept = np.array(data.draw(st.lists(st.booleans(), min_size=K, max_size=K)))
    q = np.array(qs, dtype=np.int64)
    if not kept.any() or int(q[kept].sum()) == 0:
        kept[0], q[0] = True, 3
    ids = np.array(data.draw(st.permutations(range(100, 100 + K))), dtype=np.int64)
    Q = int(q[kept].sum())
    u = (data.draw(st.integers(0, Q - 1)) + data.draw(st.sampled_from([0.0, 0.5]))) / Q
    u = min(max(u, 2.0**-53), 1 - 2.0**-53)
    tok, total = topkdrawjit.draw_kept(ids, q, kept, u)
    sid, csum = draw_ops.id_order_cdf(
        torch.from_numpy(ids)[None], torch.from_numpy(q)[None], torch.from_numpy(kept)[None]
    )
    want = draw_ops.draw_by_cdf(sid, csum, torch.tensor([u], dtype=torch.float64))
    assert (int(tok), int(total)) == (int(want[0]), Q)


def test_parameters_that_keep_no_candidate_hand_the_batch_back():
    """A row whose filters keep nothing (not reachable from validated parameters: min-p
    <= 1 always keeps the maximum) is handed back, never drawn from an empty table (an
    index past the kept candidates). Bug it would catch: a read before the first kept
    candidate, a crash or a garbage token."""
    x = torch.from_numpy(logits_rows(np.random.default_rng(6), 2, 64, "random"))
    rows = topkdraw.SmallTopK(
        5,
        np.array([3, 3], dtype=np.int64),
        np.ones(2, dtype=np.float32),
        np.full(2, np.inf),
        np.array([0.0, 2.0], dtype=np.float32),
        rules.frac_bits(64),
    )
    assert topkdraw.draw(x, rows, torch.full((2,), 0.5, dtype=torch.float64)) is None
    ok = topkdraw.SmallTopK(
        *(getattr(rows, f) for f in ("K", "k_index", "temperatures", "top_p")),
        np.array([0.0, 1.0], dtype=np.float32),
        rows.frac,
    )
    assert topkdraw.draw(x, ok, torch.full((2,), 0.5, dtype=torch.float64)) is not None


@pytest.mark.parametrize("layout", ["strided", "transposed", "offset", "bfloat16"])
def test_logits_of_any_layout_take_the_general_paths_bits(layout):
    """Logits as an engine hands them over (every other column of a wider buffer, a
    transposed view, a row slice starting one element in, half precision): the shortcut
    draws from the same values as the general path on a contiguous float32 copy."""
    rng = np.random.default_rng(8)
    wide = torch.from_numpy(logits_rows(rng, 3, 2001, "peaked"))
    x = {
        "strided": wide[:, :2000:2],
        "transposed": wide[:, :1000].t().contiguous().t(),
        "offset": wide[:, 1:1001],
        "bfloat16": wide[:, :1000].to(torch.bfloat16),
    }[layout]
    params = [SamplingParams(seed=i, **ROWS[i]) for i in range(3)]
    batch = SamplingBatch.from_requests(requests_from(params), 1000)
    s = Sampler()
    with _Counted() as counted:
        fast = s.sample(x, batch, torch.arange(3))
    assert counted.drawn == 1
    assert _outputs_equal(fast, s._sample(x.to(torch.float32).contiguous(), batch, torch.arange(3)))
