"""Tests of detsample/grammar/masker.py: parallel fill, untouched rows, and end-to-end
generation from random logits under each grammar kind (outputs validated)."""

import json
import re

import jsonschema
import pytest
import torch

from detsample.grammar import GrammarMasker, RequestGrammar
from detsample.ops.mask import allocate_token_bitmask
from detsample.probe.threads import torch_threads

from .conftest import generate

SCHEMAS = [
    {
        "type": "object",
        "properties": {
            "name": {"type": "string", "pattern": "^[a-z ]{1,12}$"},
            "age": {"type": "integer", "minimum": 0, "maximum": 150},
            "ok": {"type": "boolean"},
            "tags": {"type": "array", "items": {"enum": ["a", "b", "null"]}, "maxItems": 3},
            "kind": {"enum": ["x", "y", None]},
        },
        "required": ["name", "age", "ok", "tags", "kind"],
    },
    {"type": "array", "items": {"type": "number"}, "minItems": 1, "maxItems": 4},
    {
        "type": "object",
        "properties": {
            "inner": {"type": "object", "properties": {"v": {"type": "integer"}}, "required": ["v"]},
            "w": {"anyOf": [{"type": "null"}, {"type": "integer"}]},
        },
        "required": ["inner"],
    },
]
REGEXES = [
    r"[a-z]{2,6}@[a-z]{2,5}\.(com|org)",
    r"(true|false|null)( (true|false|null)){0,3}",
    r"-?[0-9]{1,4}(\.[0-9]{1,3})?",
]
EBNF = r"""
root ::= expr
expr ::= term (("+" | "-") term){0,3}
term ::= num | "(" expr ")"
num ::= [1-9] [0-9]{0,2}
"""
ARITH = re.compile(r"[0-9()+\-]+")


def _text(vocab, ids):
    return vocab.decode(ids).decode("utf-8")


@pytest.mark.parametrize("schema", SCHEMAS)
def test_json_schema_outputs_parse_and_validate(vocab, submit, schema):
    gs = [submit("json_schema", schema, rid=f"j{i}") for i in range(6)]
    outs = generate(vocab, gs, seed=len(json.dumps(schema)))
    for g, ids in zip(gs, outs):
        assert g.is_terminated() and ids[-1] in vocab.eos_token_ids
        jsonschema.validate(json.loads(_text(vocab, ids)), schema)


@pytest.mark.parametrize("pattern", REGEXES)
def test_regex_outputs_fullmatch(vocab, submit, pattern):
    gs = [submit("regex", pattern, rid=f"x{i}") for i in range(6)]
    for g, ids in zip(gs, generate(vocab, gs, seed=7)):
        assert g.is_terminated()
        assert re.fullmatch(pattern, _text(vocab, ids)), _text(vocab, ids)


def test_ebnf_outputs_are_balanced_arithmetic(vocab, submit):
    gs = [submit("ebnf", EBNF, rid=f"e{i}") for i in range(6)]
    for g, ids in zip(gs, generate(vocab, gs, seed=3)):
        s = _text(vocab, ids)
        assert g.is_terminated() and ARITH.fullmatch(s), s
        depth = 0
        for ch in s:
            depth += {"(": 1, ")": -1}.get(ch, 0)
            assert depth >= 0
        assert depth == 0


def test_structural_tag_wraps_schema(vocab, submit):
    schema = {
        "type": "object",
        "properties": {"city": {"enum": ["Paris", "Rome"]}, "days": {"type": "integer", "minimum": 1, "maximum": 9}},
        "required": ["city", "days"],
    }
    tag = {
        "type": "structural_tag",
        "format": {
            "type": "tag",
            "begin": "<call>",
            "content": {"type": "json_schema", "json_schema": schema, "max_whitespace_cnt": 1},
            "end": "</call>",
        },
    }
    gs = [submit("structural_tag", tag, rid=f"s{i}") for i in range(6)]
    for g, ids in zip(gs, generate(vocab, gs, seed=11)):
        m = re.fullmatch(r"<call>(.*)</call>", _text(vocab, ids), re.S)
        assert g.is_terminated() and m
        jsonschema.validate(json.loads(m.group(1)), schema)


def test_parallel_fill_equals_sequential_fill(vocab, submit):
    """xgrammar's batch matcher must produce the same bits as one-by-one fills."""
    gs = [submit("json_schema", SCHEMAS[0], rid=f"p{i}") for i in range(5)]
    gs.insert(2, None)
    generate(vocab, [g for g in gs if g is not None][:2], seed=5, max_steps=400)
    par = GrammarMasker(max_threads=2, parallel_min_rows=1)
    bm_par, rows = par.fill(gs, vocab.vocab_size)
    bm_seq = allocate_token_bitmask(len(gs), vocab.vocab_size)
    for r in rows:
        gs[r].fill_bitmask(bm_seq, r)
    assert rows == [3, 4, 5]  # rows 0, 1 terminated, row 2 has no grammar
    assert torch.equal(bm_par[rows], bm_seq[rows])


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "all"])
def test_bad_max_threads_is_refused_by_name(bad):
    with pytest.raises(ValueError, match="max_threads"):
        GrammarMasker(max_threads=bad)


def test_auto_threads_prefetch_follows_torch_and_gives_the_same_bits(vocab, submit):
    """ "auto": a step's fill uses xgrammar's own thread choice, a prefetched fill torch's
    intra-op thread count of the moment; the bits are the same either way. (Grammars
    without state keys: with them the four rows, all in one state, are filled once.)"""
    fut = vocab.grammar_compiler.submit("json_schema", json.dumps(SCHEMAS[0]))
    gs = [RequestGrammar(f"t{i}", "json_schema", fut, vocab) for i in range(4)]
    for g in gs:
        g.resolve()
    masker = GrammarMasker()
    got = {}
    for n in (1, 2):
        with torch_threads(n):
            assert masker.prefetch(gs) == 4
            bm, rows = masker.fill(gs, vocab.vocab_size)  # takes the prefetched rows
            got[n] = bm[rows].clone()
    bm, rows = masker.fill(gs, vocab.vocab_size)  # nothing prefetched: filled in the step
    masker.close()
    assert sorted(masker._matchers, key=str) == [("prefetch", 1), ("prefetch", 2), ("step", "auto")]
    assert torch.equal(got[1], got[2]) and torch.equal(got[1], bm[rows])


def test_free_and_failed_rows_untouched_and_buffer_reused(vocab, submit):
    gs = [None, submit("regex", "(ab", rid="broken"), submit("regex", "ab", rid="ok")]
    masker = GrammarMasker()
    logits = torch.randn(3, vocab.vocab_size, generator=torch.Generator().manual_seed(0))
    out = logits.clone()
    assert masker.apply_(out, gs) == [2]
    assert torch.equal(out[:2], logits[:2])
    assert torch.isfinite(out[2]).sum() == 1 and torch.isfinite(out[2, ord("a") + 1])
    assert gs[1].failed and "request 'broken'" in gs[1].error
    ptr = masker.bitmask(3, vocab.vocab_size).data_ptr()
    masker.apply_(logits.clone(), gs)
    assert masker.bitmask(2, vocab.vocab_size).data_ptr() == ptr
