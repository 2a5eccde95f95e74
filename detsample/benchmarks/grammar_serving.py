"""Grammar benchmarks that look like serving: which schemas the requests bring.

Shared by ``tests/benchmarks/test_grammar_serving_bench.py`` (opt-in) and
``tests/grammar/test_soak.py`` (opt-in). Three workloads (:data:`WORKLOADS`), each a
stream of tool-call JSON schemas, one per request:

* ``"reuse"`` -- every request the same schema (one tool);
* ``"fresh"`` -- every request a schema never seen before (its own tool list);
* ``"mix"`` -- half the requests one of 8 recurring schemas, half a new one.

:func:`serve` runs B rows as an engine would, ``rounds`` times: a batch of B new
requests is built (``SamplingBatch.from_requests`` submits their grammars for
compilation) and sampled for ``1 + steps`` steps; every step (``sample`` + ``advance``)
first replaces the rows that finished by new requests of the stream. Each step is timed
whole, the building or the replacing included: the *first step* (compile included: the
latency a new request sees) and the *steady step* (the replacements' compile waits and
first fills included). The same logits drive three batches side by side, their steps
interleaved in alternating order, each batch submitting its grammars inside its own
timed step (so no other batch's compilations run meanwhile): grammar rows with the
default mask cache (``GrammarConfig()``), with ``GrammarConfig(mask_cache=False)``
(xgrammar's own path), and rows without a grammar; a bare ``log_softmax`` of the same
logits is timed in the same rounds. The cache and no-cache batches sample the same
tokens (the cache never changes a bit), so they meet the same states and replacements;
:attr:`ServingCost.same_tokens` records that they did.

:func:`soak` runs many distinct schemas through one sampler and records the process RSS
(``/proc/self/status``) and the budget's bytes after each group of requests.
"""

from __future__ import annotations

import gc
import json
import random
import statistics
from dataclasses import dataclass, field

import torch

from detsample.batch import SamplingBatch
from detsample.benchmarks.grammar import clock, sample_step
from detsample.grammar.compiler import GrammarCompiler
from detsample.grammar.config import GrammarConfig
from detsample.params import Request, SamplingParams
from detsample.probe.threads import torch_threads
from detsample.sampler import Sampler
from detsample.vocab import Vocabulary

WORKLOADS = ("reuse", "fresh", "mix")
POOL = 8  # recurring schemas of the "mix" workload
_WORDS = ("city", "query", "units", "mode", "limit", "lang", "sort", "level", "kind", "tag")


def tool_schema(i: int) -> dict:
    """The i-th tool-call schema (distinct for every i): a ``name`` constant and three
    required arguments drawn from enums, bounded integers, short strings and booleans
    (seeded by i; every one ends within a few dozen tokens)."""
    rng = random.Random(i)
    props: dict = {"name": {"type": "string", "enum": [f"tool_{i}"]}}
    for k, word in enumerate(rng.sample(_WORDS, 3)):
        kind = rng.choice(("enum", "enum", "integer", "string", "boolean"))
        if kind == "enum":
            s = {"type": "string", "enum": [f"{word}{i}_{j}" for j in range(3)]}
        elif kind == "integer":
            s = {"type": "integer", "minimum": 0, "maximum": 10 ** rng.randint(1, 3)}
        elif kind == "string":
            s = {"type": "string", "maxLength": rng.randint(4, 12)}
        else:
            s = {"type": "boolean"}
        props[f"{word}_{k}"] = s
    return {"type": "object", "properties": props, "required": list(props)}


class SchemaStream:
    """The schemas of a workload's requests, in order (seeded; distinct fresh schemas
    for distinct ``seed``)."""

    def __init__(self, workload: str, seed: int = 0) -> None:
        if workload not in WORKLOADS:
            raise ValueError(f"workload must be one of {WORKLOADS}, got {workload!r}")
        self.workload = workload
        self._rng = random.Random(seed)
        self._next = (seed + 1) * 10**6  # fresh schema ids; the pool is 0..POOL-1

    def __next__(self) -> dict:
        if self.workload == "reuse" or (self.workload == "mix" and self._rng.random() < 0.5):
            return tool_schema(0 if self.workload == "reuse" else self._rng.randrange(POOL))
        self._next += 1
        return tool_schema(self._next)


def with_config(vocab: Vocabulary, config: GrammarConfig) -> Vocabulary:
    """A copy of ``vocab`` (same tokens, so the same fingerprint) whose grammar compiler
    has ``config``; the copy's caches are its own."""
    copy = Vocabulary(vocab.tokens, vocab.eos_token_ids, vocab.special_ids)
    copy._compiler = GrammarCompiler(copy, config)  # (Vocabulary builds one lazily)
    return copy


def rss_bytes() -> int:
    """This process's resident set size now (Linux ``/proc/self/status``)."""
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def _requests(stream, n: int, tag: str, seed: int) -> list[Request]:
    reqs = []
    for i in range(n):
        schema = next(stream) if stream is not None else None
        reqs.append(Request(f"{tag}{i}", SamplingParams(seed=seed + i, json_schema=schema), prompt_ids=[1]))
    return reqs


def _replace_finished(batch: SamplingBatch, stream, vocab, tag: str, seed: int) -> None:
    done = [i for i, f in enumerate(batch.finished) if f is not None]
    if done:
        batch.filter([i for i in range(len(batch)) if i not in done])
        batch.merge(
            SamplingBatch.from_requests(
                _requests(stream, len(done), tag, seed), vocab_size=vocab.vocab_size, vocab=vocab
            )
        )


@dataclass
class ServingCost:
    """Medians (ms) of one :func:`serve` run; ``first`` and ``steady`` per batch
    (``"cache"``, ``"off"``, ``"free"``), ``log_softmax`` of the same logits."""

    vocab: str
    V: int
    workload: str
    B: int
    threads: int
    first: dict[str, float]
    steady: dict[str, float]
    log_softmax: float
    first_ratio: float  # median over rounds of first step cache / off
    steady_ratio: float  # median over steps of step cache / off
    rss_mb: float  # the process's RSS at the end (all three batches, after a gc at the start)
    budget_mb: float  # bytes the cache batch's compiler charges its budget at the end
    named: int  # grammars the cache batch's compiler named
    same_tokens: bool
    samples: dict[str, list[float]] = field(default_factory=dict, repr=False)

    def row(self) -> str:
        f, s = self.first, self.steady
        return (
            f"| {self.vocab} | {self.workload} | {self.B} | {f['cache']:.2f} | "
            f"{f['off']:.2f} | {self.first_ratio:.2f} | {s['cache']:.2f} | {s['off']:.2f} | "
            f"{self.steady_ratio:.2f} | {s['free']:.2f} | {self.log_softmax:.2f} | "
            f"{(s['cache'] - s['free']) / self.log_softmax:+.2f} | {self.named} | "
            f"{self.budget_mb:.1f} | {self.rss_mb:.0f} |"
        )


HEADER = (
    "| vocab | workload | B | first step, cache | first step, off | first cache / off | "
    "steady, cache | steady, off | steady cache / off | steady, free | log_softmax | "
    "(cache - free) / log_softmax | grammars named | budget MB | RSS MB |\n"
    "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
)


def serve(
    vocab: Vocabulary,
    vocab_name: str,
    workload: str,
    b: int,
    *,
    rounds: int = 6,
    steps: int = 12,
    threads: int = 2,
    seed: int = 0,
    config: GrammarConfig | None = None,
) -> ServingCost:
    """The serving benchmark of one workload at batch size ``b`` (module docstring).
    ``config``: the cache batch's grammar options (default ``GrammarConfig()``)."""
    gc.collect()  # (earlier runs' compilers and samplers hold cycles: RSS is this run's)
    vocabs = {
        "cache": with_config(vocab, config or GrammarConfig()),
        "off": with_config(vocab, GrammarConfig(mask_cache=False)),
    }
    streams = {k: SchemaStream(workload, seed) for k in vocabs}
    samplers = {k: Sampler() for k in (*vocabs, "free")}
    gen = torch.Generator().manual_seed(seed)
    first: dict[str, list[float]] = {k: [] for k in samplers}
    steady: dict[str, list[float]] = {k: [] for k in samplers}
    soft, same, n = [], True, vocab.vocab_size
    out = torch.empty(b, n)
    with torch_threads(threads):
        for rnd in range(rounds):
            batches: dict[str, SamplingBatch] = {}
            for step in range(steps + 1):
                logits = torch.randn(b, n, generator=gen)
                soft.append(clock(lambda: torch.log_softmax(logits, -1, out=out))[0])
                order = list(samplers) if (rnd + step) % 2 == 0 else list(samplers)[::-1]
                toks = {}
                for k in order:

                    def run():
                        if step == 0:
                            batches[k] = SamplingBatch.from_requests(
                                _requests(streams.get(k), b, f"{k}{rnd}_", rnd * 1000),
                                vocab_size=n,
                                vocab=vocabs.get(k),
                            )
                        else:
                            _replace_finished(
                                batches[k], streams.get(k), vocabs.get(k), f"{k}{rnd}_{step}_", rnd * 1000 + step * 100
                            )
                        toks[k] = sample_step(samplers[k], batches[k], logits)

                    wall, _ = clock(run)
                    (first if step == 0 else steady)[k].append(wall)
                same = same and torch.equal(toks["cache"], toks["off"])
    for s in samplers.values():
        s.grammar_masker.close()
    compiler = vocabs["cache"].grammar_compiler
    budget, named = compiler.budget.bytes, compiler.stats.named
    for v in vocabs.values():
        v.grammar_compiler.close()

    def med(xs):
        return statistics.median(xs) * 1e3

    paired = [c / o for c, o in zip(first["cache"], first["off"])]
    paired_steady = [c / o for c, o in zip(steady["cache"], steady["off"])]
    return ServingCost(
        vocab_name,
        n,
        workload,
        b,
        threads,
        {k: med(v) for k, v in first.items()},
        {k: med(v) for k, v in steady.items()},
        med(soft),
        statistics.median(paired),
        statistics.median(paired_steady),
        rss_bytes() / 2**20,
        budget / 2**20,
        named,
        same,
        {"first_cache": first["cache"], "first_off": first["off"]},
    )


@dataclass
class SoakResult:
    """:func:`soak`: RSS (bytes) after the warm-up (``base``) and after each group,
    the budget's bytes after each group, and the budget's counters at the end."""

    schemas: int
    base: int
    rss: list[int]
    budget: list[int]
    max_bytes: int
    evictions: dict[str, int]
    named: int

    def summary(self) -> dict:
        return {
            "schemas": self.schemas,
            "base_mb": self.base / 2**20,
            "max_rss_mb": max(self.rss) / 2**20,
            "last_rss_mb": self.rss[-1] / 2**20,
            "max_growth_mb": (max(self.rss) - self.base) / 2**20,
            "max_budget_mb": max(self.budget) / 2**20,
            "budget_limit_mb": self.max_bytes / 2**20,
            "evictions": self.evictions,
            "named": self.named,
            "rss_mb_by_tenth": [round(r / 2**20) for r in _tenths(self.rss)],
            "budget_mb_by_tenth": [round(b / 2**20, 1) for b in _tenths(self.budget)],
        }


def _tenths(xs: list) -> list:
    return xs[:: max(1, len(xs) // 10)] + xs[-1:]


def soak(
    vocab: Vocabulary,
    schemas: int,
    *,
    config: GrammarConfig | None = None,
    per_schema: int = 2,
    group: int = 4,
    steps: int = 6,
    warmup: int = 20,
    threads: int = 1,
    seed: int = 0,
) -> SoakResult:
    """``schemas`` distinct tool schemas (``tool_schema(seed * 10**6 + i)``), ``group``
    at a time: a batch of ``group * per_schema`` requests (``per_schema`` >= 2: each
    schema recurs, so it is named and its recurring states' rows are kept) sampled for
    ``steps`` steps. RSS and the budget's bytes are recorded after every group; the
    base is the RSS after the first ``warmup`` schemas."""
    v = with_config(vocab, config or GrammarConfig())
    compiler = v.grammar_compiler
    sampler, gen = Sampler(), torch.Generator().manual_seed(seed)
    rss, budget, base = [], [], 0
    with torch_threads(threads):
        for start in range(0, schemas, group):
            ids = range(start, min(start + group, schemas))
            reqs = [
                Request(
                    f"s{i}_{j}",
                    SamplingParams(seed=j, json_schema=json.dumps(tool_schema(seed * 10**6 + i))),
                    prompt_ids=[1],
                )
                for i in ids
                for j in range(per_schema)
            ]
            batch = SamplingBatch.from_requests(reqs, vocab_size=v.vocab_size, vocab=v)
            for _ in range(steps):
                if all(f is not None for f in batch.finished):
                    break
                sample_step(sampler, batch, torch.randn(len(batch), v.vocab_size, generator=gen))
            del batch, reqs
            if start + group >= warmup and not base:
                base = rss_bytes()
            elif base:
                rss.append(rss_bytes())
                budget.append(compiler.budget.bytes)
    sampler.grammar_masker.close()
    stats = compiler.budget.stats()
    compiler.close()
    return SoakResult(schemas, base, rss, budget, stats.max_bytes, stats.evictions, compiler.stats.named)


def main(argv: list[str] | None = None) -> int:
    """``python -m detsample.benchmarks.grammar_serving soak [--vocab NAME] [--schemas N]
    [--cache-mb MB]``: one :func:`soak` in this (fresh) process; prints its summary as
    JSON (the soak test runs it in a subprocess, so the RSS is its own)."""
    import argparse

    from detsample.benchmarks.bpe_vocab import LLAMA3_LIKE, VOCABULARIES, bpe_vocabulary

    p = argparse.ArgumentParser(prog="python -m detsample.benchmarks.grammar_serving")
    p.add_argument("command", choices=["soak"])
    p.add_argument("--vocab", choices=VOCABULARIES, default=LLAMA3_LIKE)
    p.add_argument("--schemas", type=int, default=2000)
    p.add_argument("--cache-mb", type=int, default=None, help="GrammarConfig.cache_bytes in MiB (default: its default)")
    args = p.parse_args(argv)
    vocab = bpe_vocabulary(args.vocab)
    config = GrammarConfig() if args.cache_mb is None else GrammarConfig(cache_bytes=args.cache_mb << 20)
    start = rss_bytes()
    result = soak(vocab, args.schemas, config=config)
    print(
        json.dumps(
            {"vocab": args.vocab, "V": vocab.vocab_size, "rss_before_grammars_mb": start / 2**20, **result.summary()}
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
