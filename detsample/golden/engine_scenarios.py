"""Golden scenarios that run the reference model under the continuous-batching engine.

An :class:`EngineScenario` is a scripted schedule (arrivals at given steps, a row limit
so that requests wait, finish at different steps and leave with ``filter``) over the
seeded reference model (:mod:`detsample.refmodel`). ``produce()`` returns a
:class:`~detsample.golden.format.ScenarioOutput` with, per request in script order, every
generated token at position ``len(prompt) - 1 + i``, its sampling-time logprob in the
request's own ``logprobs_mode`` and, for requests with ``logprobs = n > 0``, its n top
logprobs; finish reasons and seeds go to the manifest.

These scenarios exist only where :mod:`detsample.refmodel.engine` does
(:func:`available`); :mod:`detsample.golden.scenarios` registers them then.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from detsample.golden.format import ScenarioOutput
from detsample.golden.scenarios import MODES, grammar_vocabulary, sampler_description


def available() -> bool:
    """True when the reference engine is importable in this build."""
    try:
        return importlib.util.find_spec("detsample.refmodel.engine") is not None
    except ModuleNotFoundError:
        return False


@dataclass(frozen=True)
class Arrive:
    """Request ``rid`` with ``prompt`` (text, byte-tokenised) arrives at ``step``."""

    step: int
    rid: str
    prompt: str
    params: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class EngineScenario:
    """A schedule over ``RefModel(RefModelConfig(seed=model_seed))`` (or, with ``model``, the
    :func:`detsample.models.load_model` model of that name and seed, under the
    batch-invariant mode with ``batch_invariant``, its portable kernels with ``portable``);
    request i gets seed ``(seed << 8) | i`` and (unless given)
    ``logprobs_mode = MODES[i % 3]``."""

    name: str
    arrivals: tuple[Arrive, ...]
    seed: int
    model_seed: int = 0
    max_batch_size: int | None = None
    max_new_tokens: int = 8
    quick: bool = False
    devices: tuple[str, ...] = ("cpu",)  # the reference model is a CPU model
    grammar: bool = False  # give the engine the default Vocabulary (grammar rows)
    model: str = "refmodel"
    batch_invariant: bool = False
    portable: bool = False

    def requests(self) -> list[Any]:
        from detsample.params import Request, SamplingParams
        from detsample.refmodel.tokenizer import encode

        out = []
        for i, a in enumerate(self.arrivals):
            kw = {"logprobs_mode": MODES[i % 3], **a.params, "seed": (self.seed << 8) | i}
            out.append(Request(rid=a.rid, params=SamplingParams(**kw), prompt_ids=encode(a.prompt)))
        return out

    def vocabulary(self) -> Any:
        """The default :class:`~detsample.Vocabulary` when the scenario has grammar rows,
        its grammars compiled without a timeout
        (:func:`~detsample.golden.scenarios.grammar_vocabulary`)."""
        return grammar_vocabulary() if self.grammar else None

    def build_model(self) -> Any:
        if self.model == "refmodel":
            from detsample.refmodel import RefModel, RefModelConfig

            return RefModel(RefModelConfig(seed=self.model_seed))
        from detsample.models import load_model

        return load_model(
            self.model, seed=self.model_seed, batch_invariant=self.batch_invariant, portable=self.portable
        )

    def run(
        self,
        only: Sequence[str] | None = None,
        reverse: bool = False,
        max_batch_size: Any = "default",
        mode: str | None = None,
        sampler: Any = None,
        model: Any = None,
    ) -> tuple[list[Any], Any]:
        """Run the schedule (or only the requests ``only``, all arriving at their own
        steps; ``reverse`` reverses the script order within the schedule; ``mode``
        makes every request report logprobs in that mode). Returns the requests (script
        order) and the engine's ``EngineResult``."""
        from detsample.params import Request
        from detsample.refmodel.engine import Engine, EngineConfig, with_mode
        from detsample.refmodel.schedule import Schedule
        from detsample.sampler import Sampler

        sampler = sampler if sampler is not None else Sampler()
        mbs = self.max_batch_size if max_batch_size == "default" else max_batch_size
        reqs = self.requests()
        if mode is not None:
            reqs = [Request(r.rid, with_mode(r.params, mode), r.prompt_ids, r.output_ids) for r in reqs]
        pairs = [(a, r) for a, r in zip(self.arrivals, reqs) if only is None or a.rid in only]
        script = list(reversed(pairs)) if reverse else pairs
        vocab = self.vocabulary()
        engine = Engine(
            model if model is not None else self.build_model(),
            sampler,
            EngineConfig(max_batch_size=mbs, default_max_new_tokens=self.max_new_tokens, vocab=vocab),
        )
        return [r for _, r in pairs], engine.run(Schedule.of([(a.step, r) for a, r in script]))

    def produce(self, sampler: Any = None, device: str = "cpu") -> ScenarioOutput:
        """Run the schedule (CPU: the reference model is a CPU model)."""
        if str(device) != "cpu":
            raise ValueError(f"device must be 'cpu' for engine scenarios, got {str(device)!r}")
        from detsample.sampler import Sampler

        sampler = sampler if sampler is not None else Sampler()
        model = self.build_model()
        reqs, res = self.run(sampler=sampler, model=model)
        rids, pos, toks, lps = [], [], [], []
        counts, top_ids, top_lps = [], [np.zeros(0, np.int64)], [np.zeros(0, np.float32)]
        for r in reqs:
            rr = res[r.rid]
            lp = rr.logprobs[r.params.logprobs_mode].cpu().numpy().astype(np.float32, copy=False)
            for i, t in enumerate(rr.token_ids):
                rids.append(r.rid)
                pos.append(len(r.prompt_ids) - 1 + i)
                toks.append(t)
                lps.append(lp[i])
                counts.append(r.params.logprobs if rr.top_logprobs is not None else 0)
                if rr.top_logprobs is not None:
                    top_lps.append(rr.top_logprobs[0][i].cpu().numpy().astype(np.float32, copy=False))
                    top_ids.append(rr.top_logprobs[1][i].cpu().numpy().astype(np.int64, copy=False))
        meta = {
            **sampler_description(sampler),
            "inputs": {
                "kind": "engine",
                "model": "RefModel" if self.model == "refmodel" else self.model,
                "batch_invariant": self.batch_invariant,
                "portable": self.portable,
                "model_seed": self.model_seed,
                "vocab_size": model.vocab_size,
                "max_batch_size": self.max_batch_size,
                "max_new_tokens": self.max_new_tokens,
                "schedule": [[a.step, a.rid] for a in self.arrivals],
            },
            "batch_rows_per_step": [list(s) for s in res.steps],
            "requests": [{"rid": r.rid, "prompt_ids": r.prompt_ids, "params": r.params.to_dict()} for r in reqs],
            "seeds": {r.rid: res[r.rid].seed for r in reqs},
            "finish_reasons": {r.rid: res[r.rid].finish_reason for r in reqs},
        }
        return ScenarioOutput(
            tuple(rids),
            np.array(pos, dtype=np.int64),
            np.array(toks, dtype=np.int64),
            np.array(lps, dtype=np.float32).reshape(-1),
            meta,
            top_counts=np.array(counts, dtype=np.int64),
            top_ids=np.concatenate(top_ids),
            top_logprobs=np.concatenate(top_lps),
        )


def _mixed() -> tuple[Arrive, ...]:
    return (
        Arrive(0, "a", "The quick brown fox", dict(temperature=0.8, top_p=0.9)),
        Arrive(0, "b", "def f(x):", dict(temperature=0.0)),
        Arrive(1, "c", "Once upon", dict(temperature=1.0, top_k=20, max_new_tokens=3)),
        Arrive(2, "d", '{"key": ', dict(temperature=0.7, min_p=0.1, repetition_penalty=1.2)),
        Arrive(4, "e", "zz", dict(temperature=1.3, top_k=5, top_p=0.8, min_p=0.05, max_new_tokens=5)),
        Arrive(5, "f", "Hello", dict(top_k=1, logprobs=3)),
    )


ENGINE_SCENARIOS: dict[str, EngineScenario] = {
    s.name: s
    for s in (
        EngineScenario("engine.mixed", _mixed(), seed=101, quick=True),
        EngineScenario("engine.queued", _mixed(), seed=102, max_batch_size=2),
        EngineScenario(
            "engine.stops",
            (
                Arrive(0, "s0", "abc", dict(temperature=1.5, stop_token_ids=tuple(range(1, 512, 4)))),
                Arrive(0, "s1", "abc", dict(temperature=1.0, min_new_tokens=4, logit_bias={0: 12.0})),
                Arrive(3, "s2", "x", dict(temperature=2.0, top_p=0.95, max_new_tokens=10)),
            ),
            seed=103,
            max_new_tokens=12,
        ),
        EngineScenario(
            "engine.grammar",
            (
                Arrive(
                    0,
                    "j",
                    "JSON: ",
                    dict(
                        json_schema={"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]},
                        temperature=0.8,
                    ),
                ),
                Arrive(0, "x", "free ", dict(temperature=1.0)),
                Arrive(1, "r", "word: ", dict(regex="[a-z]{3,6}", temperature=0.0)),
                Arrive(2, "e", "answer: ", dict(ebnf='root ::= "yes" | "no"', top_p=0.9)),
            ),
            seed=104,
            max_new_tokens=12,
            grammar=True,
        ),
        # a real transformers model under the batch-invariant mode's portable kernels: its
        # bits move when an overriding kernel or the invariant attention changes, not with
        # the machine's BLAS (the verified kernels' bits do: CHECK_SCENARIOS)
        EngineScenario(
            "engine.hf-tiny-llama.invariant",
            _mixed(),
            seed=105,
            max_batch_size=4,
            max_new_tokens=6,
            model="hf-tiny-llama",
            batch_invariant=True,
            portable=True,
        ),
    )
}

#: scenarios the engine checks run (invariance, alignment, determinism on THIS machine) but
#: that have no goldens: their bits rest on the machine's BLAS kernels (the verified mode)
CHECK_SCENARIOS: dict[str, EngineScenario] = {
    s.name: s
    for s in (
        EngineScenario(
            "engine.hf-tiny-llama.verified",
            _mixed(),
            seed=106,
            max_batch_size=4,
            max_new_tokens=6,
            model="hf-tiny-llama",
            batch_invariant=True,
        ),
    )
}
