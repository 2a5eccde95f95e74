"""Registry of named golden scenarios: synthetic logits x sampling-parameter families.

A :class:`Scenario` is fully determined by its fields (explicit seeds; no global state).
``produce()`` runs it through :class:`detsample.Sampler` over a
:class:`detsample.SamplingBatch` for ``steps`` decode steps and returns a
:class:`~detsample.golden.format.ScenarioOutput`: entries ordered by (step, row), each the
request id, its position, the sampled token id (int64) and its sampling-time logprob
(float32), the top logprobs of rows that ask for them, plus metadata for the manifest
(params, seeds, RNG name, input hashes).

``run(order=..., split=..., shuffle_steps=...)`` runs the same requests under another
batch composition (a subset, a permutation, two batches merged, a permuting ``filter``
at every step); its output is put back into canonical order so that it can be compared
bitwise with ``produce()`` (the batch-composition invariance check).

Names are ``<logits family>.<params family>``, e.g. ``ties.top_k``; ``quick=True`` marks
the smoke subset that ``detsample check --quick`` runs. :func:`registry` adds the engine
schedules of :mod:`detsample.golden.engine_scenarios` when the reference engine is present.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from detsample.golden.format import ScenarioOutput, sha256
from detsample.golden.synthlogits import FAMILIES
from detsample.params import LOGPROBS_MODES

MODES = LOGPROBS_MODES
BIG_VOCAB = 152064
GRAMMAR_VOCAB = 512  # detsample.vocab.DEFAULT_VOCAB_SIZE
ParamFamily = Callable[[int, int], list[dict[str, Any]]]
StepHook = Callable[..., None]


def _cycle(values: Sequence[Any], n: int) -> list[Any]:
    return [values[i % len(values)] for i in range(n)]


def grammar_vocabulary() -> Any:
    """The default :class:`~detsample.Vocabulary`, its grammars compiled without a timeout:
    a scenario waits for every compilation however long it takes, so its output never
    depends on the machine's speed (under the default 30 s a loaded machine ended a
    request with ``grammar_error`` and no tokens)."""
    from detsample.grammar import GrammarConfig
    from detsample.vocab import Vocabulary

    vocab = Vocabulary.default()
    vocab.configure_grammar(GrammarConfig(compile_timeout_s=None))
    return vocab


def greedy_params(rows: int, vocab: int) -> list[dict[str, Any]]:
    """Greedy rows: temperature 0, top_k 1, and greedy with bias/penalty."""
    base = [
        dict(temperature=0.0),
        dict(top_k=1),
        dict(temperature=0.0, logprobs=3),
        dict(temperature=0.0, repetition_penalty=1.5),
        dict(temperature=0.0, logit_bias={vocab - 1: 5.0, 7: -3.0}),
    ]
    return _cycle(base, rows)


def temperature_params(rows: int, vocab: int) -> list[dict[str, Any]]:
    return [dict(temperature=t) for t in _cycle([0.25, 0.5, 0.8, 1.0, 1.3, 2.0, 1e-3, 7.0], rows)]


def top_k_params(rows: int, vocab: int) -> list[dict[str, Any]]:
    return [
        dict(top_k=k, temperature=t)
        for k, t in zip(_cycle([2, 5, 10, 50, 3, 20, 1000, vocab + 5], rows), _cycle([1.0, 0.7], rows))
    ]


def top_p_params(rows: int, vocab: int) -> list[dict[str, Any]]:
    return [dict(top_p=p) for p in _cycle([0.1, 0.5, 0.9, 0.95, 0.99, 1.0, 0.3, 0.75], rows)]


def min_p_params(rows: int, vocab: int) -> list[dict[str, Any]]:
    return [dict(min_p=m, temperature=0.9) for m in _cycle([0.01, 0.05, 0.1, 0.2, 0.5, 0.9, 1.0, 0.0], rows)]


def combo_params(rows: int, vocab: int) -> list[dict[str, Any]]:
    """Everything at once, greedy rows next to sampled rows, penalties and biases."""
    base = [
        dict(temperature=0.8, top_k=40, top_p=0.9, min_p=0.05),
        dict(temperature=0.0),
        dict(temperature=1.2, top_p=0.8, repetition_penalty=1.3, logprobs=5),
        dict(temperature=0.7, frequency_penalty=0.5, presence_penalty=0.3, top_k=20),
        dict(temperature=1.0, logit_bias={3: 2.5, vocab - 2: -100.0}, min_p=0.1),
        dict(temperature=1.0, min_new_tokens=2, stop_token_ids=(0, 5), top_k=8),
        dict(top_k=1, top_p=0.5),
        dict(temperature=0.5, top_k=3, top_p=0.99, min_p=0.3, repetition_penalty=0.8),
    ]
    return _cycle(base, rows)


def grammar_params(rows: int, vocab: int) -> list[dict[str, Any]]:
    """Grammar rows (JSON schema, regex, EBNF) next to free rows, over the default
    512-token :class:`~detsample.Vocabulary` (the scenario passes it to the batch)."""
    base = [
        dict(json_schema={"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}),
        dict(regex="[a-z]{2,8}", temperature=0.7),
        dict(ebnf='root ::= "yes" | "no" | "maybe"'),
        dict(temperature=1.0),
        dict(regex="(cat|dog)s?", temperature=0.0),
        dict(json_schema={"type": "string"}, top_k=5),
        dict(temperature=0.0, repetition_penalty=1.3),
        dict(regex="[0-9]+", top_p=0.9),
    ]
    return _cycle(base, rows)


def top_logprobs_params(rows: int, vocab: int) -> list[dict[str, Any]]:
    """Rows asking for 1 to 20 top logprobs, greedy and sampled, filtered and penalised;
    with the raw / scaled / processed cycle of modes every mode is covered, so a change
    to the top-n path (its log_softmax, the top-n selection, the tie order) moves bits."""
    base = [
        dict(logprobs=1),
        dict(logprobs=5, temperature=0.7),
        dict(logprobs=20, top_k=10),
        dict(temperature=0.0, logprobs=4),
        dict(logprobs=3, top_p=0.9, temperature=1.3),
        dict(logprobs=8, min_p=0.1),
        dict(logprobs=2, repetition_penalty=1.2, presence_penalty=0.5),
        dict(logprobs=6, top_k=1),
    ]
    return _cycle(base, rows)


PARAM_FAMILIES: dict[str, ParamFamily] = {
    "greedy": greedy_params,
    "temperature": temperature_params,
    "top_k": top_k_params,
    "top_p": top_p_params,
    "min_p": min_p_params,
    "combo": combo_params,
    "grammar": grammar_params,
    "top_logprobs": top_logprobs_params,
}
GRAMMAR_FAMILIES = ("grammar",)


def sampler_description(sampler: Any) -> dict[str, Any]:
    """The manifest's ``rng`` and ``sampler`` fields (inputs, see
    :data:`detsample.golden.store.INPUT_FIELDS`) for a run with ``sampler``."""
    return {
        "rng": sampler.rng_name,
        "sampler": {
            "class": type(sampler).__name__,
            "draw_method": sampler.draw_method,
            "deterministic": sampler.deterministic,
            "filter_impl": sampler.filter_impl,
        },
    }


@dataclass(frozen=True)
class Scenario:
    """One golden scenario: ``rows`` requests sampled for ``steps`` steps over logits of
    the family ``logits`` (vocabulary ``vocab``), with parameters of family ``params``.
    Row i uses ``logprobs_mode = MODES[i % 3]`` (unless its params family sets one) and seed
    ``(seed << 8) | i``."""

    name: str
    logits: str
    params: str
    vocab: int = 1000
    rows: int = 8
    steps: int = 3
    seed: int = 0
    quick: bool = False

    def __post_init__(self) -> None:
        if self.logits not in FAMILIES:
            raise ValueError(f"logits must be one of {sorted(FAMILIES)}, got {self.logits!r}")
        if self.params not in PARAM_FAMILIES:
            raise ValueError(f"params must be one of {sorted(PARAM_FAMILIES)}, got {self.params!r}")
        for f in ("vocab", "rows", "steps"):
            if getattr(self, f) < 1:
                raise ValueError(f"{f} must be >= 1, got {getattr(self, f)!r}")
        if not 0 <= self.seed < 2**54:
            raise ValueError(f"seed must be in [0, 2**54), got {self.seed!r}")
        if self.params in GRAMMAR_FAMILIES and self.vocab != GRAMMAR_VOCAB:
            raise ValueError(
                f"vocab must be {GRAMMAR_VOCAB} (the default Vocabulary) for grammar params, got {self.vocab!r}"
            )

    def vocabulary(self) -> Any:
        """The :class:`~detsample.Vocabulary` grammar rows need (:func:`grammar_vocabulary`),
        or None."""
        return grammar_vocabulary() if self.params in GRAMMAR_FAMILIES else None

    # -- inputs ----------------------------------------------------------------------
    def rid(self, row: int) -> str:
        return f"r{row}"

    def prompt(self, row: int) -> list[int]:
        """A short prompt (3..6 tokens) so penalties see prompt tokens."""
        n = 3 + row % 4
        return [(self.seed * 31 + row * 17 + 11 * j) % self.vocab for j in range(n)]

    def sampling_params(self) -> list[Any]:
        from detsample.params import SamplingParams

        kws = PARAM_FAMILIES[self.params](self.rows, self.vocab)
        return [
            SamplingParams(**{"logprobs_mode": MODES[i % 3], **kw, "seed": (self.seed << 8) | i})
            for i, kw in enumerate(kws)
        ]

    def requests(self) -> list[Any]:
        """Fresh :class:`detsample.Request` objects (row order)."""
        from detsample.params import Request

        return [
            Request(rid=self.rid(i), params=p, prompt_ids=self.prompt(i), output_ids=[])
            for i, p in enumerate(self.sampling_params())
        ]

    def step_logits(self, step: int) -> np.ndarray:
        """[rows, vocab] float32 logits of ``step`` (all rows, canonical order)."""
        return FAMILIES[self.logits](self.seed, step, self.rows, self.vocab)

    def position(self, row: int, step: int) -> int:
        return len(self.prompt(row)) - 1 + step

    # -- running ---------------------------------------------------------------------
    def run(
        self,
        order: Sequence[int] | None = None,
        split: int | None = None,
        shuffle_steps: bool = False,
        sampler: Any = None,
        device: str | torch.device = "cpu",
        on_step: StepHook | None = None,
    ) -> ScenarioOutput:
        """Sample rows ``order`` (default all, in order) for every step.

        ``split``: build ``order[:split]`` and ``order[split:]`` as two batches and
        ``merge`` them. ``shuffle_steps``: before each step after the first, permute the
        batch with ``filter`` (a seeded permutation). Entries come back in canonical
        (step, row) order whatever the composition. A row that finishes (grammar
        terminated, no admissible token: ``batch.finished``) leaves the batch with
        ``filter`` after its last entry. ``on_step(step, rows, logits, batch, positions,
        out)`` is called after each ``sample`` (before ``advance``).
        """
        from detsample.sampler import Sampler

        sampler = sampler if sampler is not None else Sampler()
        dev = torch.device(device)
        rows = list(range(self.rows)) if order is None else [int(i) for i in order]
        batch = self._batch(rows, len(rows) if split is None else split, dev)
        got: dict[tuple[int, int], tuple[int, int, float, np.ndarray, np.ndarray]] = {}
        asks = [r.params.logprobs for r in self.requests()]
        perm_rng = np.random.default_rng(self.seed)
        shas = []
        for step in range(self.steps):
            if shuffle_steps and step > 0:
                perm = [int(i) for i in perm_rng.permutation(len(rows))]
                batch.filter(perm)
                rows = [rows[i] for i in perm]
            full = self.step_logits(step)
            shas.append(sha256(full))
            logits = torch.from_numpy(full[rows]).to(dev)
            positions = torch.tensor([self.position(r, step) for r in rows], dtype=torch.int64, device=dev)
            out = sampler.sample(logits, batch, positions)
            if on_step is not None:
                on_step(step, rows, logits, batch, positions, out)
            self._record(got, step, rows, out, asks)
            batch.advance(out.token_ids)
            # Finished rows (grammar terminated, no admissible token) leave the batch, as
            # in a serving engine; they are never sampled again.
            keep = [j for j, f in enumerate(batch.finished) if f is None]
            if not keep:
                break
            if len(keep) != len(rows):
                batch.filter(keep)
                rows = [rows[j] for j in keep]
        shas += [sha256(self.step_logits(s)) for s in range(len(shas), self.steps)]
        return self._output(got, sampler, shas)

    def _batch(self, rows: list[int], cut: int, dev: torch.device) -> Any:
        """The batch of ``rows``: ``rows[:cut]`` built, ``rows[cut:]`` built and merged."""
        from detsample.batch import SamplingBatch

        reqs, vocab = self.requests(), self.vocabulary()

        def build(part: list[int]) -> SamplingBatch:
            return SamplingBatch.from_requests(
                [reqs[i] for i in part], vocab_size=self.vocab, device=dev, eos_token_ids=(0,), vocab=vocab
            )

        batch = build(rows[:cut])
        if cut < len(rows):
            batch.merge(build(rows[cut:]))
        return batch

    def _record(self, got: dict, step: int, rows: list[int], out: Any, asks: list[int]) -> None:
        """One step's entries, keyed (step, row): position, token, logprob, top ids, top logprobs."""
        toks = out.token_ids.cpu().numpy()
        lps = out.logprobs.cpu().numpy()
        top_v, top_i = _top_arrays(out, len(rows))
        for j, r in enumerate(rows):
            got[(step, r)] = (self.position(r, step), int(toks[j]), lps[j], top_i[j, : asks[r]], top_v[j, : asks[r]])

    def _output(self, got: dict, sampler: Any, shas: list[str]) -> ScenarioOutput:
        """The entries in canonical (step, row) order."""
        keys = sorted(got)
        return ScenarioOutput(
            rids=tuple(self.rid(r) for _, r in keys),
            positions=np.array([got[k][0] for k in keys], dtype=np.int64),
            tokens=np.array([got[k][1] for k in keys], dtype=np.int64),
            logprobs=np.array([got[k][2] for k in keys], dtype=np.float32),
            meta=self.metadata(sampler, shas),
            top_counts=np.array([got[k][3].size for k in keys], dtype=np.int64),
            top_ids=np.concatenate([got[k][3] for k in keys] + [np.zeros(0, np.int64)]),
            top_logprobs=np.concatenate([got[k][4] for k in keys] + [np.zeros(0, np.float32)]),
        )

    def produce(self, sampler: Any = None, device: str | torch.device = "cpu") -> ScenarioOutput:
        """The canonical run: all rows in one batch, in order."""
        return self.run(sampler=sampler, device=device)

    def metadata(self, sampler: Any = None, logits_sha256: list[str] | None = None) -> dict[str, Any]:
        """The manifest's description of the inputs (params, seeds, rng, draw method,
        logits hashes) for a run with ``sampler`` (default ``Sampler()``)."""
        if logits_sha256 is None:
            logits_sha256 = [sha256(self.step_logits(s)) for s in range(self.steps)]
        from detsample.sampler import Sampler

        sampler = sampler if sampler is not None else Sampler()
        params = self.sampling_params()
        return {
            **sampler_description(sampler),
            "inputs": {
                "logits_family": self.logits,
                "params_family": self.params,
                "vocab_size": self.vocab,
                "rows": self.rows,
                "steps": self.steps,
                "logits_seed": self.seed,
                "logits_generator": "PCG64(SeedSequence([seed, step])).random_raw",
                "logits_dtype": "<f4",
                "logits_shape": [self.rows, self.vocab],
                "logits_sha256": logits_sha256,
            },
            "requests": [
                {"rid": self.rid(i), "prompt_ids": self.prompt(i), "params": p.to_dict()} for i, p in enumerate(params)
            ],
            "seeds": {self.rid(i): p.seed for i, p in enumerate(params)},
        }


def _top_arrays(out: Any, rows: int) -> tuple[np.ndarray, np.ndarray]:
    """``out.top_logprobs`` as numpy ((rows, n) float32, (rows, n) int64); n = 0 when no
    row asks for top logprobs."""
    if out.top_logprobs is None:
        return np.zeros((rows, 0), np.float32), np.zeros((rows, 0), np.int64)
    vals, ids = out.top_logprobs
    return vals.cpu().numpy(), ids.cpu().numpy()


def _seed(name: str) -> int:
    return zlib.crc32(name.encode("utf-8"))


QUICK = {
    "random.combo",
    "ties.top_k",
    "nan.greedy",
    "onehot.top_p",
    "neginf.min_p",
    "huge.temperature",
    "big.top_p",
    "random.grammar",
    "random.top_logprobs",
}
GRAMMAR_LOGITS = ("random", "ties", "neginf")


def _build() -> dict[str, Scenario]:
    out: dict[str, Scenario] = {}
    for lf in FAMILIES:
        for pf in PARAM_FAMILIES:
            if pf in GRAMMAR_FAMILIES and lf not in GRAMMAR_LOGITS:
                continue
            name = f"{lf}.{pf}"
            vocab = GRAMMAR_VOCAB if pf in GRAMMAR_FAMILIES else 1000
            out[name] = Scenario(name, lf, pf, vocab=vocab, seed=_seed(name), quick=name in QUICK)
    for pf in ("top_p", "combo"):
        name = f"big.{pf}"
        out[name] = Scenario(
            name, "random", pf, vocab=BIG_VOCAB, rows=3, steps=2, seed=_seed(name), quick=name in QUICK
        )
    return out


SCENARIOS: dict[str, Scenario] = _build()
