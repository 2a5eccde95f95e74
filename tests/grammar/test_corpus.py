"""The JSON-schema corpus (tests/data/json_schemas/): every finished output is strict
JSON that validates against its schema.

Each schema is sampled with seeded random logits until EOS over the default vocabulary
and over a byte-level one (every token one byte, so any byte sequence a grammar admits
can appear: raw control characters, UTF-8 surrogates, broken escapes). The output must
decode as UTF-8, parse with a strict ``json.loads`` and pass ``jsonschema`` with the
format checker. Pins every defect of detsample/grammar/{schema,regex,ebnf,formats}.py
at once. The default run samples each schema once per vocabulary (grammar masks only);
``pytest -m corpus tests/grammar`` adds more seeds through the full Sampler.
"""

import json
from pathlib import Path

import jsonschema
import pytest
import torch

from detsample import Request, Sampler, SamplingBatch, SamplingParams, Vocabulary
from detsample.grammar import RequestGrammar
from detsample.grammar.batching import grammar_errors
from detsample.probe.threads import torch_threads
from tests.grammar.conftest import generate, verifying

DATA = Path(__file__).resolve().parents[1] / "data" / "json_schemas"
SCHEMAS = {p.stem: json.loads(p.read_text(encoding="utf-8")) for p in sorted(DATA.glob("*.json"))}
CHECKER = jsonschema.Draft202012Validator.FORMAT_CHECKER
VOCABS = {
    "default": Vocabulary.default,
    "bytes": lambda: Vocabulary.from_tokens([b""] + [bytes([b]) for b in range(256)], eos_token_ids=[0]),
}
MAX_STEPS = 4000


def validate(name: str, data: bytes) -> None:
    """Strict: UTF-8, json.loads (control characters refused), jsonschema + formats."""
    value = json.loads(data.decode("utf-8"))
    jsonschema.validate(value, SCHEMAS[name], format_checker=CHECKER)


def test_corpus_is_large_and_covers_the_keywords():
    assert len(SCHEMAS) >= 40
    text = json.dumps(list(SCHEMAS.values()))
    for kw in (
        "$defs",
        "$ref",
        "anyOf",
        "oneOf",
        "enum",
        "const",
        "minItems",
        "maxItems",
        "minimum",
        "exclusiveMinimum",
        "pattern",
        "format",
        "minLength",
        "maxLength",
        "additionalProperties",
        "patternProperties",
        "propertyNames",
        "prefixItems",
    ):
        assert f'"{kw}"' in text, kw


@pytest.fixture(scope="module", params=sorted(VOCABS))
def corpus_vocab(request):
    v = verifying(VOCABS[request.param]())  # every cached bitmask row checked
    yield v
    v.grammar_compiler.close()


@pytest.fixture(autouse=True)
def _one_thread():
    """Small tensors: one intra-op thread (OpenMP hand-offs dominate on a shared host)."""
    with torch_threads(1):
        yield


def test_every_schema_samples_valid_json(corpus_vocab):
    """All schemas as the rows of one batch, random logits until every row ends."""
    names = list(SCHEMAS)
    grammars = [RequestGrammar.submit(n, "json_schema", SCHEMAS[n], corpus_vocab) for n in names]
    outs = generate(corpus_vocab, grammars, seed=0, max_steps=MAX_STEPS)
    assert not [g.error for g in grammars if g.failed]
    for name, toks in zip(names, outs):
        validate(name, corpus_vocab.decode(toks))


def _sample_with_sampler(vocab, names, seed):
    reqs = [
        Request(n, SamplingParams(seed=seed * 1000 + i, json_schema=SCHEMAS[n]), prompt_ids=[1])
        for i, n in enumerate(names)
    ]
    batch = SamplingBatch.from_requests(reqs, vocab_size=vocab.vocab_size, vocab=vocab)
    sampler, gen = Sampler(), torch.Generator().manual_seed(seed)
    done = {}
    for _ in range(MAX_STEPS):
        logits = torch.randn(len(batch), vocab.vocab_size, generator=gen) * 3.0
        pos = torch.tensor([len(o) for o in batch.output_ids])
        batch.advance(sampler.sample(logits, batch, pos).token_ids)
        assert not grammar_errors(batch)
        ended = [i for i, f in enumerate(batch.finished) if f is not None]
        for i in ended:  # an engine retires finished rows
            assert batch.finished[i] == "grammar_terminated", batch.finished[i]
            done[batch.requests[i].rid] = list(batch.output_ids[i])
        batch.filter([i for i in range(len(batch)) if i not in ended])
        if not len(batch):
            break
    assert sorted(done) == sorted(names)
    for name in names:
        validate(name, vocab.decode(done[name]))


def test_sampler_end_to_end_on_a_slice_of_the_corpus():
    """The full Sampler (penalty-free, temperature 1) on every fifth schema."""
    vocab = verifying(Vocabulary.default())
    _sample_with_sampler(vocab, list(SCHEMAS)[::5], seed=3)


@pytest.mark.corpus
@pytest.mark.parametrize("seed", [1, 2, 3, 4])
def test_full_corpus_through_the_sampler(corpus_vocab, seed):
    _sample_with_sampler(corpus_vocab, list(SCHEMAS), seed)
