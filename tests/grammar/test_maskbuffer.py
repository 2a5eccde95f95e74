"""Tests of detsample/grammar/maskbuffer.py: the persistent masked-logits buffer gives the
bits of the plain select, step after step, and exact row maxima.

Pins what an incremental buffer can get wrong: a sparse row keeping last step's finite
values, a cached column list served for a different bitmask, padding columns beyond the
grammar's vocabulary left finite, a zero maximum with the wrong sign, a bias added in
place leaking into the next step, an additive mask turning a disallowed NaN or ``+inf``
logit into NaN instead of ``-inf``, rows of one state sharing one gather or add mixing up
their values.
"""

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from detsample.grammar.maskbuffer import ColumnCache, MaskedLogitsBuffer, _classify
from detsample.ops.mask import bitmask_width, masked_logits

NEG = float("-inf")


def bits_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and torch.equal(a.contiguous().view(torch.int32), b.contiguous().view(torch.int32))


def pack(allowed: np.ndarray) -> torch.Tensor:
    """(R, n) bool -> (R, ceil(n/32)) int32 in xgrammar's layout."""
    w = bitmask_width(allowed.shape[1])
    padded = np.zeros((allowed.shape[0], w * 32), dtype=np.bool_)
    padded[:, : allowed.shape[1]] = allowed
    return torch.from_numpy(np.packbits(padded, axis=-1, bitorder="little").view(np.int32).copy())


@st.composite
def step_sequences(draw, nonfinite=False):
    b = draw(st.integers(1, 5))
    n = draw(st.integers(1, 150))
    v = n + draw(st.sampled_from([0, 0, 7, 40]))
    steps = []
    prev = None
    for _ in range(draw(st.integers(1, 5))):
        rows = sorted(draw(st.sets(st.integers(0, b - 1))))
        kinds = [draw(st.sampled_from(["few", "most", "sparse", "dense", "random", "same", "none"])) for _ in range(b)]
        rng = np.random.default_rng(draw(st.integers(0, 2**31)))
        allowed = np.zeros((b, n), dtype=np.bool_)
        for r, k in enumerate(kinds):
            if k == "same" and prev is not None:
                allowed[r] = prev[r]
            elif k in ("few", "most"):  # the sparse and dense paths even at small n
                allowed[r, rng.choice(n, size=min(n, int(rng.integers(0, 3))), replace=False)] = True
                if k == "most":
                    allowed[r] = ~allowed[r]
            elif k != "none":
                p = {"sparse": 0.01, "dense": 0.99, "random": 0.5, "same": 0.3}[k]
                allowed[r] = rng.random(n) < p
        prev = allowed
        logits = torch.from_numpy(rng.standard_normal((b, v)).astype(np.float32))
        specials = rng.integers(0, 4, size=(b, v))  # sprinkle +-0.0 and -inf
        logits[torch.from_numpy(specials == 0) & (torch.rand(b, v) < 0.1)] = 0.0
        logits[torch.from_numpy(specials == 1) & (torch.rand(b, v) < 0.1)] = -0.0
        logits[torch.from_numpy(specials == 2) & (torch.rand(b, v) < 0.05)] = NEG
        if nonfinite:  # what reaches the mask when no sanitising ran before it
            logits[torch.from_numpy(specials == 3) & (torch.rand(b, v) < 0.05)] = float("inf")
            logits[torch.from_numpy(specials == 3) & (torch.rand(b, v) < 0.05)] = float("nan")
        bias = draw(st.booleans())
        steps.append((logits, pack(allowed), rows, bias))
    return n, steps


def apply_and_check(buf: MaskedLogitsBuffer, logits, bm, rows, n) -> torch.Tensor:
    """One step: the buffer equals ``masked_logits`` bit for bit and its maxima are
    ``torch.amax`` of it (NaN where that is NaN). Returns the buffer's view."""
    ref = masked_logits(logits, bm, rows, limit=n)
    got, m = buf.apply(logits, bm, rows, n, torch.amax(logits, dim=-1, keepdim=True))
    assert bits_equal(got, ref)
    want = torch.amax(ref, dim=-1, keepdim=True)
    nan = torch.isnan(want)
    assert torch.equal(torch.isnan(m), nan) and bits_equal(m[~nan], want[~nan])
    for r, cols in buf.columns.items():  # listed rows are -inf outside their columns
        assert r in rows and cols.dtype == np.int64
        assert bool((np.diff(cols) > 0).all())
        assert cols.size == 0 or 0 <= cols[0] <= cols[-1] < n
        assert bits_equal(torch.from_numpy(buf.values[r]), got[r, torch.from_numpy(cols)])
        outside = np.ones(got.shape[1], dtype=bool)
        outside[cols] = False
        assert bool(np.isneginf(got[r].numpy()[outside]).all())
    return got


@settings(max_examples=80, deadline=None)
@given(step_sequences())
def test_buffer_equals_plain_select_every_step(seq):
    """Property: at every step of any sequence of masks (repeated or not, with a finite
    bias added in place between steps) the buffer holds ``masked_logits`` bit for bit
    and its maxima are ``torch.amax`` bit for bit."""
    n, steps = seq
    buf = MaskedLogitsBuffer()
    for logits, bm, rows, bias in steps:
        got = apply_and_check(buf, logits, bm, rows, n)
        if bias:
            got.add_(torch.randn(got.shape))  # what an in-place logit bias may do


@settings(max_examples=40, deadline=None)
@given(step_sequences(nonfinite=True))
def test_nan_and_posinf_logits_get_the_select_bits(seq):
    """Property: with NaN and ``+inf`` logits the buffer still holds ``masked_logits`` bit
    for bit (a disallowed one is ``-inf``, an allowed one kept); maxima match amax (NaN
    where amax is NaN)."""
    n, steps = seq
    buf = MaskedLogitsBuffer()
    for logits, bm, rows, _ in steps:
        apply_and_check(buf, logits, bm, rows, n)


def test_select_row_blanks_disallowed_nan_and_posinf():
    """A row with half its tokens allowed (the streaming-add kind): a disallowed ``+inf``
    or NaN logit becomes ``-inf``, an allowed NaN stays NaN, ``-0.0`` keeps its sign."""
    n = 64
    allowed = np.zeros((1, n), dtype=np.bool_)
    allowed[0, ::2] = True
    logits = torch.randn(1, n)
    logits[0, 1], logits[0, 3], logits[0, 4], logits[0, 6] = float("inf"), float("nan"), float("nan"), -0.0
    bm = pack(allowed)
    buf = MaskedLogitsBuffer()
    got, m = buf.apply(logits, bm, [0], n, torch.amax(logits, -1, keepdim=True))
    assert buf.cache.lookup_rows(bm.numpy(), [0], n)[0].kind == "select"
    assert bits_equal(got, masked_logits(logits, bm, [0], limit=n))
    assert torch.isneginf(got[0, 1]) and torch.isneginf(got[0, 3]) and torch.isnan(got[0, 4])
    assert torch.isnan(m).all()


def test_rows_of_one_state_keep_their_own_values():
    """Many rows in one sparse state and one select state (one gather and one broadcast
    add each), interleaved with unmasked rows and padding past the grammar's vocabulary."""
    n, v, b = 3000, 3010, 12
    rng = np.random.default_rng(3)
    few = rng.random(n) < 0.01
    half = rng.random(n) < 0.5
    allowed = np.array([few if r % 3 == 0 else half for r in range(b)])
    bm = pack(allowed)
    rows = [r for r in range(b) if r % 4 != 3]
    buf = MaskedLogitsBuffer()
    for step in range(3):
        logits = torch.from_numpy(rng.standard_normal((b, v)).astype(np.float32))
        apply_and_check(buf, logits, bm, rows, n)
    kinds = {e.kind for e in buf.cache.lookup_rows(bm.numpy(), rows, n).values()}
    assert kinds == {"sparse", "select"}


def test_cache_drops_least_recent_entries_beyond_its_byte_bound():
    """The byte bound holds (the additive rows and column lists of select entries are
    large) and a dropped entry is rebuilt on its next use."""
    n = 4096
    rng = np.random.default_rng(0)
    masks = [pack(rng.random((1, n)) < 0.5).numpy()[0] for _ in range(5)]
    size = max(_classify(w, n).nbytes for w in masks)  # ~ n * 4 + n // 8 + n / 2 * 8
    assert size > n * 4 + n // 8
    cache = ColumnCache(max_bytes=3 * size + 100)
    for w in masks:
        cache.lookup(int(cache.fingerprints(w[None])[0]), w, n)
    assert cache._bytes <= cache.max_bytes and len(cache._map) == 3
    again = cache.lookup(int(cache.fingerprints(masks[0][None])[0]), masks[0], n)
    assert again.kind == "select" and cache.misses == 6
    assert np.array_equal(~again.blocked, np.unpackbits(masks[0].view(np.uint8), bitorder="little")[:n].astype(bool))


@st.composite
def wide_steps(draw):
    """Masks over a few thousand tokens (odd and even bitmask widths), rows switching
    between a handful of allowed tokens (read from the nonzero words), cached sparse,
    select and dense states, and no mask."""
    b = draw(st.integers(1, 6))
    n = draw(st.sampled_from([2048, 2080, 3000, 4093]))
    v = n + draw(st.sampled_from([0, 5]))
    rng = np.random.default_rng(draw(st.integers(0, 2**31)))
    states = {
        "few": lambda: rng.choice(n, size=int(rng.integers(0, 4)), replace=False),
        "edge": lambda: np.array([0, n - 1]),  # first and last token
        "sparse": lambda: np.flatnonzero(rng.random(n) < 0.02),
        "select": lambda: np.flatnonzero(rng.random(n) < 0.3),
        "dense": lambda: np.flatnonzero(rng.random(n) < 0.995),
    }
    shared = {k: f() for k, f in states.items()}  # one state reached by several rows
    steps = []
    for _ in range(draw(st.integers(1, 6))):
        rows = sorted(draw(st.sets(st.integers(0, b - 1))))
        allowed = np.zeros((b, n), dtype=np.bool_)
        for r in range(b):
            kind = draw(st.sampled_from(sorted(states)))
            allowed[r, shared[kind] if draw(st.booleans()) else states[kind]()] = True
        logits = torch.from_numpy(rng.standard_normal((b, v)).astype(np.float32))
        logits[torch.rand(b, v) < 0.01] = -0.0
        steps.append((logits, pack(allowed), rows))
    return n, steps


@settings(max_examples=60, deadline=None)
@given(wide_steps())
def test_wide_masks_equal_plain_select_every_step(seq):
    """Property: over masks of thousands of tokens, whatever way each row's mask is
    applied (a few allowed tokens read from the words, a cached column list, a
    streaming add, a copy and blank) and however rows move between them, the buffer
    holds ``masked_logits`` bit for bit and its maxima are ``torch.amax``."""
    n, steps = seq
    buf = MaskedLogitsBuffer()
    for logits, bm, rows in steps:
        apply_and_check(buf, logits, bm, rows, n)


def test_zero_maximum_keeps_amax_sign():
    """A row whose allowed maximum is a zero of either sign takes amax's choice."""
    logits = torch.tensor([[-0.0, 0.0, -1.0, 5.0], [0.0, -0.0, -2.0, 7.0]])
    bm = pack(np.array([[1, 1, 1, 0], [1, 1, 0, 0]], dtype=np.bool_))
    got, m = MaskedLogitsBuffer().apply(logits, bm, [0, 1], 4, torch.amax(logits, -1, keepdim=True))
    ref = masked_logits(logits, bm, [0, 1], limit=4)
    assert bits_equal(m, torch.amax(ref, -1, keepdim=True))


def allowed_of(entry, n):
    if entry.kind == "sparse":
        return sorted(entry.cols.tolist())
    if entry.kind == "dense":
        return sorted(set(range(n)) - set(entry.cols.tolist()))
    return np.flatnonzero(~entry.blocked).tolist()


def test_cache_never_serves_another_mask():
    """Two bitmasks forced onto one fingerprint are told apart by the exact check."""
    cache = ColumnCache()
    a = pack(np.array([[1, 0, 0, 0, 1]], dtype=np.bool_)).numpy()[0]
    b = pack(np.array([[0, 1, 0, 0, 0]], dtype=np.bool_)).numpy()[0]
    ea, eb = cache.lookup(7, a, 5), cache.lookup(7, b, 5)
    assert allowed_of(ea, 5) == [0, 4] and allowed_of(eb, 5) == [1]
    assert cache.lookup(7, a, 5) is ea and cache.hits == 1


def test_unmasked_rows_are_copied_and_buffer_is_reused():
    buf = MaskedLogitsBuffer()
    logits = torch.randn(3, 64)
    bm = pack(np.ones((3, 64), dtype=np.bool_))
    first, _ = buf.apply(logits, bm, [1], 64)
    assert bits_equal(first, logits)
    second, _ = buf.apply(logits * 2, bm, [], 64)
    assert second.data_ptr() == first.data_ptr() and bits_equal(second, logits * 2)


def test_rows_sharing_a_fingerprint_are_confirmed_one_by_one():
    """A fingerprint collision inside one step: each row still gets its own columns."""
    cache = ColumnCache()
    cache.fingerprints = lambda words: np.zeros(words.shape[0], dtype=np.int64)
    words = pack(np.array([[1, 0, 0, 0, 1], [0, 1, 0, 0, 0], [1, 0, 0, 0, 1]], dtype=np.bool_)).numpy()
    got = cache.lookup_rows(words, [0, 1, 2], 5)
    assert [allowed_of(got[r], 5) for r in (0, 1, 2)] == [[0, 4], [1], [0, 4]]
