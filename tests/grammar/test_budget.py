"""Tests of detsample/grammar/budget.py: one byte budget, least recently used first out.

The budget is what keeps a worker's memory bounded when every request brings its own
grammar (~21 MB per schema were never released). Here: the ledger alone
(against a reference model, property-tested), and the compiler's use of it -- compiled
grammars, names and rows are charged, evicted least recently used first, and rebuilt
on demand with the same bits.
"""

import json
from collections import OrderedDict

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from detsample import Sampler, SamplingBatch, Vocabulary
from detsample.grammar import GrammarConfig, RequestGrammar
from detsample.grammar.budget import COMPILED_FACTOR, ROW_OVERHEAD, CacheBudget
from detsample.grammar.compiler import GrammarCompiler
from detsample.grammar.kinds import grammar_source
from detsample.grammar.statekeys import StateKeys
from tests.helpers import params_strategy

from .conftest import generate, grammar_requests, random_session, same_steps


def _schema(i: int) -> dict:
    return {
        "type": "object",
        "properties": {f"k{i}": {"type": "string", "enum": ["a", "b"]}, "n": {"type": "integer"}},
        "required": [f"k{i}", "n"],
    }


# -- the ledger -------------------------------------------------------------------------
def test_evicts_least_recently_used_first_and_reports_the_victims():
    out = []
    b = CacheBudget(100)
    for name in "abc":
        b.add(("row", name), 30, out.append, name)
    b.touch(("row", "a"))  # order now b, c, a
    b.add(("row", "d"), 30, out.append, "d")
    assert out == ["b"] and b.bytes == 90
    b.resize(("row", "c"), 50)  # c grows, becomes the most recent: a goes
    assert out == ["b", "a"] and b.bytes == 80
    assert ("row", "c") in b and ("row", "a") not in b


def test_an_entry_larger_than_the_budget_is_evicted_at_once():
    out = []
    b = CacheBudget(100)
    b.add(("row", "small"), 10, out.append, "small")
    b.add(("compiled", "huge"), 101, out.append, "huge")
    assert out == ["small", "huge"] and b.bytes == 0
    zero = CacheBudget(0)
    zero.add(("names", 1), 1, out.append, "one")
    assert out[-1] == "one" and zero.bytes == 0


def test_discard_and_replace_do_not_call_on_evict_and_stats_count_per_kind():
    out = []
    b = CacheBudget(1000)
    b.add(("row", 1), 10, out.append)
    b.add(("row", 1), 20, out.append)  # replaced
    b.add(("names", 1), 100, out.append)
    b.discard(("names", 1))
    b.discard(("names", 1))  # (absent: nothing)
    b.resize(("names", 1), 999)  # absent: not re-added
    s = b.stats()
    assert out == [] and s.bytes == 20 and s.by_kind == {"compiled": 0, "names": 0, "row": 20}
    assert s.entries["row"] == 1 and s.entries["names"] == 0
    b.add(("compiled", 1), 990, out.append, "c")
    assert b.stats().evictions == {"compiled": 0, "names": 0, "row": 1}


def test_on_evict_runs_outside_the_lock():
    """Bug guarded: an on_evict that calls back into the budget (a names entry drops its
    rows) deadlocked when it ran under the budget's lock."""
    b = CacheBudget(50)

    def drop_rows(_):
        b.discard(("row", "r"))

    b.add(("names", "n"), 40, drop_rows)
    b.add(("row", "r"), 10, lambda _: None)
    b.add(("compiled", "c"), 30, lambda _: None)  # evicts n, whose callback drops r
    assert b.bytes == 30 and ("row", "r") not in b


OPS = st.lists(
    st.tuples(st.sampled_from(["add", "resize", "touch", "discard"]), st.integers(0, 5), st.integers(0, 60)),
    max_size=60,
)


@settings(max_examples=60)
@given(st.integers(0, 120), OPS)
def test_ledger_matches_an_lru_model(limit, ops):
    """Property: after every operation the charged bytes are <= the budget and equal the
    sum of the live entries, and the live entries and evictions are those of a plain
    LRU model of the same operations."""
    evicted, model, gone = [], OrderedDict(), []
    b = CacheBudget(limit)
    for op, k, n in ops:
        key = ("row", k)
        if op == "add":
            model.pop(key, None)
            model[key] = n
            b.add(key, n, evicted.append, key)
        elif op == "resize" and key in model:
            model[key] = n
            model.move_to_end(key)
            b.resize(key, n)
        elif op == "touch" and key in model:
            model.move_to_end(key)
            b.touch(key)
        elif op == "discard":
            model.pop(key, None)
            b.discard(key)
        while sum(model.values()) > limit:
            gone.append(model.popitem(last=False)[0])
        assert b.bytes == sum(model.values()) <= limit
        assert evicted == gone
        assert all(k in b for k in model)


# -- the compiler's caches under it ------------------------------------------------------
def _compiler(**kw) -> GrammarCompiler:
    return GrammarCompiler(Vocabulary.default(), GrammarConfig(**kw))


def test_compiled_grammars_are_charged_and_recompiled_after_eviction():
    c = _compiler(mask_cache=False)
    texts = [json.dumps(_schema(i)) for i in range(3)]
    sizes = []
    for t in texts:
        compiled = c.compile("json_schema", t)
        sizes.append(COMPILED_FACTOR * compiled.memory_size_bytes)
    s = c.budget.stats()
    assert s.entries["compiled"] == 3 and s.by_kind["compiled"] >= sum(sizes)
    small = _compiler(mask_cache=False, cache_bytes=s.by_kind["compiled"] * 2 // 3)
    for t in texts:
        small.compile("json_schema", t)
    assert small.cache_size() == 2 and small.budget.stats().evictions["compiled"] == 1
    small.compile("json_schema", texts[0])  # evicted first: compiled again
    assert small.stats.misses == 4
    c.close()
    small.close()


def test_failures_are_charged_too():
    """A cached failure is charged; when it recurs, its (absent) names are recorded
    once, charged too, instead of being looked for again at every hit."""
    c = _compiler()
    with pytest.raises(Exception):
        c.compile("regex", "(")
    assert c.budget.stats().entries == {"compiled": 1, "names": 0, "row": 0}
    for _ in range(3):
        c.submit("regex", "(")
    assert c.wait_names("regex", "(", timeout=30) is None
    assert c.budget.stats().entries == {"compiled": 1, "names": 1, "row": 0}
    assert c.stats.named == 0
    c.close()


def test_rows_are_evicted_least_recently_used_first():
    """Rows of every state share the budget: the least recently used row goes."""
    vocab = Vocabulary.default()
    width = (vocab.vocab_size + 31) // 32
    budget = CacheBudget(2 * (4 * width + ROW_OVERHEAD))  # room for two rows
    keys = StateKeys.build(
        grammar_source("regex", "[a-z]{0,10}", GrammarConfig()),
        vocab.tokens,
        vocab.eos_token_ids,
        width,
        budget=budget,
        budget_key=("names", "x"),
    )
    named = [keys.start]
    for _ in range(3):  # one state per length of the text
        named.append(keys.step(named[-1], ord("a") + 1))
    assert len(set(named)) == 4 and all(keys.named(s) for s in named)
    row = torch.zeros(width, dtype=torch.int32)
    for s in named[:3]:
        assert keys.offer(s, row)
    assert keys.mask(named[0]) is None and keys.mask(named[1]) is not None
    keys.mask(named[1])  # used: named[2] is now the least recent
    keys.offer(named[3], row)
    assert sorted(keys._masks) == sorted([named[1], named[3]])
    assert budget.bytes == 2 * (4 * width + ROW_OVERHEAD)


def test_evicted_names_are_retired_and_rebuilt_when_the_grammar_recurs():
    c = _compiler()
    t = json.dumps(_schema(0))
    vocab = c.vocab
    a = RequestGrammar.submit("a", "json_schema", t, vocab, compiler=c)
    b = RequestGrammar.submit("b", "json_schema", t, vocab, compiler=c)  # recurs
    keys = c.wait_names("json_schema", t, timeout=30)
    assert keys is not None
    generate(vocab, [a, b], seed=0, max_steps=4, until_done=False)
    assert a._keys is keys
    c._evict_names((c.key("json_schema", t), keys))  # what the budget does
    assert keys.retired and keys.num_rows == 0
    assert a.mask_state() is None and a._keys is None  # dropped, nothing to adopt yet
    RequestGrammar.submit("c", "json_schema", t, vocab, compiler=c)  # recurs again
    fresh = c.wait_names("json_schema", t, timeout=30)
    assert fresh is not None and fresh is not keys
    ns = a.mask_state()
    assert ns is not None and ns[0] is fresh
    sids = [fresh.start]
    for tid in a.accepted:
        sids.append(fresh.step(sids[-1], tid))
    assert a._sids == sids  # the accepted text was renamed
    c.close()


def test_clear_cache_retires_names_and_starts_a_new_budget():
    c = _compiler(mask_cache_policy="eager")
    t = json.dumps(_schema(0))
    c.compile("json_schema", t)
    keys = c.state_keys("json_schema", t)
    c.clear_cache()
    assert keys.retired and c.budget.bytes == 0 and c.cache_size() == 0
    assert c.state_keys("json_schema", t) is None
    c.close()


# -- property: the bits do not depend on the budget or the policy -------------------------
GRAMMARS = [
    None,
    ("json_schema", _schema(0)),
    ("json_schema", _schema(1)),
    ("regex", "[a-z]{2,9}( [0-9]{1,3})?"),
    ("json_schema", {"type": "array", "items": {"type": "integer"}, "maxItems": 5}),
]
CONFIGS = {
    "off": {"mask_cache": False},
    "recurring, 0 bytes": {"cache_bytes": 0},
    "recurring, 48 KiB": {"cache_bytes": 48 << 10},
    "eager, 48 KiB": {"cache_bytes": 48 << 10, "mask_cache_policy": "eager"},
    "recurring, verified": {"verify_mask_cache": True},
}


@settings(max_examples=20, deadline=None)
@given(
    st.lists(st.tuples(params_strategy(512), st.sampled_from(range(len(GRAMMARS)))), min_size=1, max_size=6),
    st.sampled_from(["random", "peaked", "ties"]),
    st.integers(0, 2**32 - 1),
)
def test_sessions_are_the_same_bits_under_any_budget_and_policy(rows, family, seed):
    """Property: a session's token ids, logprobs and status are the same bits whatever
    the budget evicts (compilations, names, rows: each rebuilt on demand) and whichever
    policy names the states, as with the mask cache off."""
    seen = {}
    for name, kw in CONFIGS.items():
        vocab = Vocabulary.default()
        vocab._compiler = GrammarCompiler(vocab, GrammarConfig(**kw))
        batch = SamplingBatch.from_requests(grammar_requests(rows, GRAMMARS), vocab_size=512, vocab=vocab)
        sampler = Sampler()
        seen[name] = random_session(sampler, batch, 512, seed, family, 10)
        sampler.grammar_masker.close()
        vocab.grammar_compiler.close()
        assert vocab.grammar_compiler.budget.bytes <= vocab.grammar_compiler.budget.max_bytes
    for name in CONFIGS:
        same_steps(seen[name], seen["off"])
