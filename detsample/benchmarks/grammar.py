"""Grammar benchmarks: what JSON-schema rows add to a sampling step.

Shared by ``tests/benchmarks/test_grammar_bench.py`` (opt-in) and scripts. The figure of merit
is the *added* cost per step: ``Sampler.sample`` + ``batch.advance`` with a JSON schema
on every row minus the same without, on the same logits, as the median over steps of
the per-step difference (the two batches' steps are interleaved and alternate in
order, so load drift and warm-up effects hit both alike), against the median of a bare
``log_softmax`` over the same (B, V) logits (into a reused buffer) in the same run. The
difference of the two medians is reported too: on a busy host it can swing by the
whole step time (a 2-thread step waits whenever another process holds a core), which
the paired difference does not. A finished grammar row is replaced by a fresh request
outside the timed region, so B stays constant.

Two synthetic vocabularies of any size V (seeded, built from the default 512 tokens):
``bpe_like`` (mostly word pieces, 5% digit runs, 3% punctuation) and ``digit_heavy``
(30% digit runs, 10% digits with punctuation attached, 25% punctuation runs, the rest
word pieces: the shape that makes xgrammar's bitmask fill slow inside numbers). Never
used by tests as an assertion.
"""

from __future__ import annotations

import random
import statistics
import time
from dataclasses import dataclass

import torch

from detsample.batch import SamplingBatch
from detsample.params import Request, SamplingParams
from detsample.probe.threads import torch_threads
from detsample.sampler import Sampler
from detsample.vocab import Vocabulary

SCHEMAS: dict[str, dict] = {
    "int_array": {"type": "array", "items": {"type": "integer"}},
    "tool_call": {
        "type": "object",
        "properties": {
            "name": {"type": "string", "enum": ["search", "lookup", "finish"]},
            "query": {"type": "string", "maxLength": 40},
            "limit": {"type": "integer", "minimum": 1, "maximum": 100},
            "exact": {"type": "boolean"},
        },
        "required": ["name", "query", "limit"],
    },
}
_CONS, _VOW = "bcdfghjklmnprstvwz", "aeiou"
_PUNCT = list(",.;:!?()[]{}\"'-_/\\@#$%&*+=<>|`~")


def _distinct(v: int, seed: int, draw) -> Vocabulary:
    rng = random.Random(seed)
    toks = list(Vocabulary.default().tokens)
    seen = set(toks)
    while len(toks) < v:
        t = draw(rng).encode()
        if t not in seen:
            seen.add(t)
            toks.append(t)
    return Vocabulary.from_tokens(toks, eos_token_ids=[0], special_ids=[0])


def _bpe_token(rng: random.Random) -> str:
    r = rng.random()
    if r < 0.05:
        return "".join(rng.choice("0123456789") for _ in range(rng.randint(1, 3)))
    if r < 0.08:
        t = "".join(rng.choice(_PUNCT) for _ in range(rng.randint(1, 3)))
        return " " + t if rng.random() < 0.3 else t
    t = "".join(rng.choice(_CONS) + rng.choice(_VOW) for _ in range(rng.randint(1, 4)))
    if rng.random() < 0.3:
        t += rng.choice(_CONS)
    t = " " + t if rng.random() < 0.5 else t
    return t.capitalize() if rng.random() < 0.1 else t


def _digit_token(rng: random.Random) -> str:
    r = rng.random()
    if r < 0.3:
        return "".join(rng.choice("0123456789") for _ in range(rng.randint(1, 4)))
    if r < 0.4:
        t = "".join(rng.choice("0123456789") for _ in range(rng.randint(1, 3)))
        return (
            rng.choice([" ", ",", ", ", "-", ".", "["]) + t
            if rng.random() < 0.5
            else t + rng.choice([",", ", ", ".", "]", "}"])
        )
    if r < 0.65:
        return "".join(rng.choice(_PUNCT + [" "]) for _ in range(rng.randint(1, 4)))
    return _bpe_token(rng)


def bpe_like(v: int, seed: int = 0) -> Vocabulary:
    """A V-token vocabulary shaped like a BPE one (word pieces, some digits/punctuation)."""
    return _distinct(v, seed, _bpe_token)


def digit_heavy(v: int, seed: int = 0) -> Vocabulary:
    """A V-token vocabulary of mostly digit runs and punctuation."""
    return _distinct(v, seed, _digit_token)


VOCABS = {"bpe_like": bpe_like, "digit_heavy": digit_heavy}


@dataclass
class StepCost:
    """Medians (ms) of one grammar step-cost run: wall time and process CPU time (all
    threads; steadier than wall time on a shared host, where a busy scheduler adds whole
    time slices to any step)."""

    B: int
    V: int
    vocab: str
    schema: str
    threads: int
    forward_ms: float
    wall: dict[str, float]  # free, grammar, log_softmax, paired, fill, mask
    cpu: dict[str, float]  # free, grammar, log_softmax, paired

    @property
    def added_ms(self) -> float:
        """Median over steps of (grammar step - free step), ms."""
        return self.wall["paired"]

    @property
    def ratio(self) -> float:
        """Added wall time over a bare log_softmax of the same logits."""
        return self.added_ms / self.wall["log_softmax"]

    @property
    def cpu_ratio(self) -> float:
        return self.cpu["paired"] / self.cpu["log_softmax"]

    def row(self) -> str:
        w, c = self.wall, self.cpu
        return (
            f"| {self.vocab} | {self.schema} | {self.B} | {self.threads} | "
            f"{self.forward_ms:g} | {w['fill']:.2f} | {w['mask']:.2f} | {w['free']:.2f} | "
            f"{w['grammar']:.2f} | {w['grammar'] - w['free']:+.2f} | "
            f"{self.added_ms:+.2f} | {w['log_softmax']:.2f} | {self.ratio:+.2f} | "
            f"{c['paired']:+.2f} | {c['log_softmax']:.2f} | {self.cpu_ratio:+.2f} |"
        )


HEADER = (
    "| vocab | schema | B | threads | prefetch: forward ms | fill | mask | free step | "
    "grammar step | difference of medians | added | log_softmax | "
    "added / log_softmax | CPU added | CPU log_softmax | CPU added / log_softmax |\n"
    "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
)


def _batch(vocab: Vocabulary, schema: dict | None, b: int, tag: str) -> SamplingBatch:
    reqs = [
        Request(rid=f"{tag}{i}", params=SamplingParams(seed=i, json_schema=schema), prompt_ids=[1]) for i in range(b)
    ]
    return SamplingBatch.from_requests(reqs, vocab_size=vocab.vocab_size, vocab=vocab)


def step_cost(
    vocab: Vocabulary,
    vocab_name: str,
    schema_name: str,
    b: int,
    *,
    steps: int = 30,
    threads: int = 2,
    forward_ms: float = 0.0,
    prefetch: bool = False,
    seed: int = 0,
) -> StepCost:
    """Median ``sample`` + ``advance`` with and without the schema on all ``b`` rows.

    ``prefetch``: the grammar batch calls ``Sampler.prefetch_grammar`` after ``advance``;
    then ``forward_ms`` of idle CPU stand for the model's forward pass on an accelerator,
    and the time still spent waiting for the fill after it is added to the grammar
    step (an engine's next ``sample`` would wait that long). Nothing else runs while a
    fill is in flight, so the overlap is never larger than the stated forward pass.
    """
    schema = SCHEMAS[schema_name]
    vocab.grammar_compiler.compile("json_schema", _text(schema), timeout=600)
    gen = torch.Generator().manual_seed(seed)
    t: dict[str, list[tuple[float, float]]] = {"free": [], "grammar": [], "log_softmax": []}
    with torch_threads(threads):
        free, gram = _batch(vocab, None, b, "f"), _batch(vocab, schema, b, "g")
        s_free, s_gram = Sampler(), Sampler()
        parts = _instrument(s_gram)
        out = torch.empty(b, vocab.vocab_size)
        for step in range(steps + 2):  # two warm-up steps
            logits = torch.randn(b, vocab.vocab_size, generator=gen)
            t["log_softmax"].append(clock(lambda: torch.log_softmax(logits, -1, out=out)))
            for which in ("free", "grammar") if step % 2 == 0 else ("grammar", "free"):
                if which == "free":
                    t["free"].append(clock(lambda: sample_step(s_free, free, logits)))
                    continue
                wall, cpu = clock(lambda: sample_step(s_gram, gram, logits, prefetch))
                if prefetch:
                    time.sleep(forward_ms / 1e3)
                    w2, c2 = clock(lambda: s_gram.grammar_masker.wait_prefetched(gram.grammars))
                    wall, cpu = wall + w2, cpu + c2
                t["grammar"].append((wall, cpu))
            _refill(free, vocab, None, step)
            _refill(gram, vocab, schema, step)
        s_gram.grammar_masker.close()

    def med(xs):
        return statistics.median(xs[2:]) * 1e3

    wall = {k: med([w for w, _ in v]) for k, v in t.items()}
    cpu = {k: med([c for _, c in v]) for k, v in t.items()}
    for d, i in ((wall, 0), (cpu, 1)):
        d["paired"] = med([g[i] - f[i] for f, g in zip(t["free"], t["grammar"])])
    wall["fill"] = med(parts["fill"])
    wall["mask"] = med(parts["step"]) - wall["fill"]
    return StepCost(b, vocab.vocab_size, vocab_name, schema_name, threads, forward_ms if prefetch else 0.0, wall, cpu)


#: the stages of :func:`stage_costs`: function names as cProfile sees them ("fill" runs
#: inside "masked_step"; "scale_logits" and "block_cdf" are the steps 7-9 that a row
#: drawn over its allowed columns, "_column_cut", runs on those columns only (its
#: "scale_logits" included), "_scaled" the general path's full-vocabulary scaling)
STAGES = ("fill", "masked_step", "_column_cut", "advance_grammars", "_scaled", "scale_logits", "block_cdf")


def stage_costs(
    vocab: Vocabulary, schema_name: str, b: int, *, steps: int = 16, seed: int = 0
) -> dict[str, dict[str, float]]:
    """Per-stage process CPU time (ms per step, 1 thread, ``cProfile`` cumulative time
    of :data:`STAGES` over ``steps`` steps after 4 warm-up steps) of ``sample`` +
    ``advance`` without (``"free"``) and with (``"grammar"``) the schema on all ``b``
    rows, same logits; each dict also holds ``"step"``, the median step."""
    import cProfile
    import pstats

    schema = SCHEMAS[schema_name]
    vocab.grammar_compiler.compile("json_schema", _text(schema), timeout=600)
    gen = torch.Generator().manual_seed(seed)
    out: dict[str, dict[str, float]] = {}
    with torch_threads(1):
        batches = {"free": _batch(vocab, None, b, "f"), "grammar": _batch(vocab, schema, b, "g")}
        samplers = {k: Sampler() for k in batches}
        prof = {k: cProfile.Profile() for k in batches}
        times: dict[str, list[float]] = {k: [] for k in batches}
        for step in range(steps + 4):
            logits = torch.randn(b, vocab.vocab_size, generator=gen)
            for k, batch in batches.items():
                t0 = time.process_time()
                if step >= 4:
                    prof[k].enable()
                sample_step(samplers[k], batch, logits)
                if step >= 4:
                    prof[k].disable()
                    times[k].append(time.process_time() - t0)
                _refill(batch, vocab, schema if k == "grammar" else None, step)
    for k, p in prof.items():
        stats = pstats.Stats(p).stats  # {(file, line, name): (cc, nc, tt, ct, callers)}
        out[k] = {name: sum(v[3] for key, v in stats.items() if key[2] == name) / steps * 1e3 for name in STAGES}
        out[k]["step"] = statistics.median(times[k]) * 1e3
    return out


def clock(fn) -> tuple[float, float]:
    """(wall, process CPU) seconds of ``fn()``."""
    w0, c0 = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - w0, time.process_time() - c0


def sample_step(sampler: Sampler, batch: SamplingBatch, logits: torch.Tensor, prefetch: bool = False) -> torch.Tensor:
    """One engine step: ``sample`` at each row's next position, ``advance`` (and,
    with ``prefetch``, ``prefetch_grammar``); returns the token ids."""
    pos = torch.tensor([len(o) for o in batch.output_ids])
    tokens = sampler.sample(logits, batch, pos).token_ids
    batch.advance(tokens)
    if prefetch:
        sampler.prefetch_grammar(batch)
    return tokens


def _instrument(sampler: Sampler) -> dict[str, list[float]]:
    """Time the grammar step (``masked_step``) and its bitmask fill on this sampler's
    masker (instance attributes: nothing global is patched)."""
    parts: dict[str, list[float]] = {"fill": [], "step": []}
    masker = sampler.grammar_masker
    fill, step = masker.fill, masker.masked_step

    def timed(fn, key):
        def run(*a, **kw):
            t0 = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                parts[key].append(time.perf_counter() - t0)

        return run

    masker.fill, masker.masked_step = timed(fill, "fill"), timed(step, "step")
    return parts


def _text(schema: dict) -> str:
    import json

    return json.dumps(schema)


def _refill(batch: SamplingBatch, vocab: Vocabulary, schema: dict, step: int) -> None:
    """Replace finished rows by fresh requests (keeps B constant)."""
    done = [i for i, f in enumerate(batch.finished) if f is not None]
    if done:
        batch.filter([i for i in range(len(batch)) if i not in done])
        batch.merge(_batch(vocab, schema, len(done), f"s{step}_"))
