"""Rescoring: the trainer side of the audit loop, with any model detsample can load.

``ModelRescorer("refmodel")(prompt_ids, response_ids)`` returns the logprobs of
``response_ids`` after ``prompt_ids`` computed by ONE prefill of the model
(:func:`detsample.refmodel.engine.rescore`), i.e. what a trainer recomputes. The model is
a :func:`detsample.models.load_model` spec: ``refmodel``, ``refmodel-float``,
``hf-tiny-llama``, ``hf-tiny-qwen2`` or ``package.module:factory``, and with
``batch_invariant=True`` it runs under the batch-invariant mode. The engine's
sampling-time logprobs equal these bitwise when the model is batch-invariant (the
reference model; a float model under the mode), so ``detsample rollout`` ->
``detsample audit --rescore refmodel`` audits to ``exact_match_fraction == 1.0``, and so
does ``--model hf-tiny-llama --batch-invariant`` on both sides; without the mode the
audit reports the real mismatch.

:func:`resolve_rescorer` is the one place a ``rescore`` option becomes a callable. The
rescorer is picklable and builds its model lazily (in the worker), so ``--workers`` and
Ray can use it.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from detsample.audit.issues import AuditInputError
from detsample.audit.semantics import RAW, Semantics
from detsample.models import MODEL_NAMES, is_model_spec

#: what ``rescore`` options accept: None, a callable, or a model spec (:func:`is_model_spec`)
RescoreSpec = Callable[[list[int], list[int]], "np.ndarray | list[float]"] | str | None


class RescoreModelError(AuditInputError):
    """The rescoring model cannot be built, or answers outside the model protocol: fatal
    for the whole audit (never a per-sequence exclusion repeated on every row)."""


class ModelRescorer:
    """Callable ``(prompt_ids, response_ids) -> float32 logprobs [len(response_ids)]`` in
    ``semantics`` (default "raw": log_softmax of the model's logits; "processed" at a
    temperature and filters: vLLM's processed logprobs, :mod:`detsample.audit.semantics`),
    by one prefill of ``model``.

    model: a :func:`detsample.models.load_model` spec. batch_invariant: its forwards under
    the batch-invariant mode (``portable``: its portable kernels). model_path: a saved
    reference model (``RefModel.save``), with ``model="refmodel"`` only. label: how errors
    name the option that gave the model ("--rescore" for the audit, "--model" for
    ``detsample rollout``). semantics: a :class:`~detsample.audit.semantics.Semantics`.
    dtype: a model directory's parameter dtype (``float32``, ``bfloat16``, ``float16``).
    """

    def __init__(
        self,
        model: str = "refmodel",
        *,
        batch_invariant: bool = False,
        portable: bool = False,
        model_path: str | None = None,
        label: str = "--rescore",
        semantics: Semantics = RAW,
        dtype: str = "float32",
    ) -> None:
        check_rescore_spec(model)
        if not isinstance(model, str):
            raise ValueError(f"model must be a model spec string, got {model!r}")
        if model_path is not None and model != "refmodel":
            raise ValueError(f"model_path is for model 'refmodel', got model={model!r}")
        self.model = model
        if portable and not batch_invariant:
            raise ValueError("portable=True needs batch_invariant=True (the mode's portable kernels)")
        self.batch_invariant = bool(batch_invariant)
        self.portable = bool(portable)
        self.model_path = model_path
        self.label = str(label)
        if not isinstance(semantics, Semantics):
            raise ValueError(f"semantics must be a Semantics, got {type(semantics).__name__}")
        self.semantics = semantics
        self.dtype = str(dtype)
        #: logits of the first ``keep`` sequences scored (prompt, response) -> [n, V]
        self.keep = 0
        self.kept: dict = {}
        #: called ``(sequences scored, None, label)`` after each sequence (not pickled)
        self.progress = None
        self._scored = 0
        self._state = None

    def __getstate__(self) -> dict:
        return {
            "model": self.model,
            "batch_invariant": self.batch_invariant,
            "portable": self.portable,
            "model_path": self.model_path,
            "label": self.label,
            "semantics": self.semantics,
            "dtype": self.dtype,
        }

    def __setstate__(self, state: dict) -> None:
        self.__init__(
            state["model"],
            batch_invariant=state["batch_invariant"],
            portable=state.get("portable", False),
            model_path=state["model_path"],
            label=state.get("label", "--rescore"),
            semantics=state.get("semantics", RAW),
            dtype=state.get("dtype", "float32"),
        )

    def build_model(self):
        """The model this rescorer prefills with (built once)."""
        return self._load()[0]

    def _load(self):
        if self._state is None:
            from detsample.models import ModelError, adapt, load_model
            from detsample.refmodel import RefModel
            from detsample.refmodel.engine import rescore
            from detsample.sampler import Sampler

            try:
                if self.model_path is not None:
                    lm = adapt(
                        RefModel.load(self.model_path),
                        "refmodel",
                        batch_invariant=self.batch_invariant,
                        portable=self.portable,
                    )
                else:
                    lm = load_model(
                        self.model, batch_invariant=self.batch_invariant, portable=self.portable, dtype=self.dtype
                    )
            except ModelError as exc:
                raise RescoreModelError(f"{self.label}: {exc}") from exc
            self._state = (lm, Sampler(), rescore)
        return self._state

    def __call__(
        self, prompt_ids: list[int], response_ids: list[int], semantics: Semantics | None = None
    ) -> np.ndarray:
        """float32 [len(response_ids)]: the logprobs in ``semantics`` (a row's stated
        semantics; default :attr:`semantics`), by one prefill (its logits kept for
        :meth:`logits` while :attr:`keep` allows)."""
        out = self.score(prompt_ids, response_ids, self.semantics if semantics is None else semantics)
        if self.progress is not None:
            self._scored += 1
            self.progress(self._scored, None, "sequences rescored")
        return out

    def score(self, prompt_ids: list[int], response_ids: list[int], semantics: Semantics) -> np.ndarray:
        """:meth:`__call__` in another ``semantics`` (the kept logits reused)."""
        from detsample.models import ModelOutputError
        from detsample.refmodel.engine import score_logits

        model, sampler, _ = self._load()
        prompt, response = list(prompt_ids), list(response_ids)
        if not response:
            return np.empty(0, dtype=np.float32)
        logits = self.logits(prompt, response)
        try:
            return score_logits(model, sampler, rescore_params(semantics), prompt, response, logits).numpy()
        except ModelOutputError as exc:  # the model, not this sequence, is at fault
            raise RescoreModelError(f"{self.label}: {exc}") from exc

    def prompt_logprobs(self, prompt_ids: list[int]) -> np.ndarray:
        """float32 [len(prompt_ids) - 1]: the logprob of prompt token i + 1 after
        ``prompt_ids[:i + 1]`` in :attr:`semantics`, by one prefill (vLLM's
        ``prompt_logprobs`` without its leading None)."""
        prompt = list(prompt_ids)
        if len(prompt) < 2:
            return np.empty(0, dtype=np.float32)
        return self.score(prompt[:1], prompt[1:], self.semantics)

    def token_logprobs(self, prompt_ids: list[int], response_ids: list[int], token_ids: list[int]) -> np.ndarray:
        """float32 [len(response_ids), len(token_ids)]: at every response position, the
        logprobs of the named ``token_ids`` in :attr:`semantics` (SGLang's
        ``token_ids_logprob``), bitwise what the sampling path reports for those ids at
        that position (as the chosen token, or among the top logprobs)."""
        import torch

        from detsample.batch import SamplingBatch
        from detsample.params import Request

        model, sampler, _ = self._load()
        prompt, response = list(prompt_ids), list(response_ids)
        ids = [int(t) for t in token_ids]
        if not response or not ids:
            return np.empty((len(response), len(ids)), dtype=np.float32)
        logits = self.logits(prompt, response)
        params = rescore_params(self.semantics)
        reqs = [
            Request(f"named/{i}/{j}", params, prompt, response[:i])
            for i in range(len(response))
            for j in range(len(ids))
        ]
        batch = SamplingBatch.from_requests(reqs, vocab_size=model.vocab_size)
        rows = logits.repeat_interleave(len(ids), dim=0).contiguous()
        lp = sampler.compute_logprobs(rows, batch, torch.tensor(ids * len(response)))
        return lp.view(len(response), len(ids)).numpy()

    def logits(self, prompt_ids: list[int], response_ids: list[int]):
        """float32 [len(response_ids), V]: the logits that score each response token
        (row i after ``prompt_ids + response_ids[:i]``), by one prefill; the first
        :attr:`keep` sequences' are kept, so the diagnosis reuses the rescoring's forward."""
        from detsample.models import ModelOutputError

        prompt, response = list(prompt_ids), list(response_ids)
        key = (tuple(prompt), tuple(response))
        if key in self.kept:
            return self.kept[key]
        model = self._load()[0]
        try:
            out = prefill_logits(model, prompt, response)
        except ModelOutputError as exc:
            raise RescoreModelError(f"{self.label}: {exc}") from exc
        if len(self.kept) < self.keep:
            self.kept[key] = out
        return out


def prefill_logits(lm, prompt: list[int], response: list[int]):
    """float32 [len(response), V]: the logits of the built model ``lm`` that score each
    response token (row i after ``prompt + response[:i]``), by one prefill."""
    from detsample.errors import InvalidSamplingParams

    if not prompt:
        raise InvalidSamplingParams("rescore: prompt_ids must not be empty, got []")
    full = lm.forward([lm.new_cache()], [list(prompt) + list(response)])[0]
    return full[len(prompt) - 1 : len(prompt) + len(response) - 1].contiguous()


def rescore_params(semantics: Semantics = RAW):
    """The parameters of a rescoring prefill in ``semantics`` (default "raw": log_softmax
    of the model's logits, temperature 1), a fixed seed (nothing is drawn)."""
    return semantics.params()


def rescore_with(lm, prompt_ids: list[int], response_ids: list[int], semantics: Semantics = RAW):
    """The logprobs in ``semantics`` of ``response_ids`` after ``prompt_ids`` by one
    prefill of the built model ``lm`` (a float32 tensor): what :class:`ModelRescorer`
    computes."""
    from detsample.refmodel.engine import rescore
    from detsample.sampler import Sampler

    return rescore(lm, Sampler(), rescore_params(semantics), prompt_ids, response_ids)


def _rank_rescore(lm, comm, prompt_ids: list[int], response_ids: list[int], semantics: Semantics = RAW):
    """A :class:`TPRescorer` call on one rank (every rank runs it; rank 0 answers)."""
    return rescore_with(lm, prompt_ids, response_ids, semantics)


def _rank_logits(lm, comm, prompt_ids: list[int], response_ids: list[int]):
    """:meth:`TPRescorer.logits` on one rank: the gathered logits (rank 0 answers)."""
    return prefill_logits(lm, prompt_ids, response_ids)


class TPRescorer:
    """:class:`ModelRescorer` with the model run tensor-parallel over ``tp`` local ranks
    (:func:`detsample.parallel.tp_group`, started at the first call and kept until
    :meth:`close`): the logprobs of a TP=``tp`` trainer. Under
    ``batch_invariant=True, portable=True`` they are TP=1's bitwise
    (docs/tensor-parallel.md). Holds processes, so it is not picklable: audits with it
    run with ``workers=1``. ``start_method``: of the ranks
    (:class:`~detsample.parallel.RankGroup`)."""

    def __init__(
        self,
        model: str,
        tp: int,
        *,
        batch_invariant: bool = False,
        portable: bool = False,
        label: str = "--rescore",
        start_method: str = "spawn",
        semantics: Semantics = RAW,
    ) -> None:
        from detsample.parallel import TPModelSpec

        check_rescore_spec(model)
        self.spec = TPModelSpec(model, tp, batch_invariant, portable)
        self.semantics = semantics
        self.label = str(label)
        self.start_method = start_method
        self._group = None

    def _start(self):
        from detsample.models import ModelError
        from detsample.parallel import check_spec, tp_group

        try:
            check_spec(self.spec)
        except ModelError as exc:
            raise RescoreModelError(f"{self.label}: {exc}") from exc
        self._group = tp_group(self.spec, start_method=self.start_method)
        return self._group

    def _call(self, fn, *args):
        """``fn(lm, comm, *args)`` on every rank, rank 0's answer; a rank's failure is a
        :class:`RescoreModelError` (the ranks restart at the next call)."""
        from detsample.parallel import RankError

        group = self._group or self._start()
        try:
            return group.call(fn, *args)
        except RankError as exc:
            self._group = None
            raise RescoreModelError(f"{self.label} (tp={self.spec.tp}): {exc}") from exc

    def __call__(
        self, prompt_ids: list[int], response_ids: list[int], semantics: Semantics | None = None
    ) -> np.ndarray:
        """As :meth:`ModelRescorer.__call__`, the model on ``tp`` ranks."""
        return self._call(
            _rank_rescore, list(prompt_ids), list(response_ids), self.semantics if semantics is None else semantics
        ).numpy()

    @property
    def model(self) -> str:
        return self.spec.model

    def score(self, prompt_ids: list[int], response_ids: list[int], semantics: Semantics) -> np.ndarray:
        """:meth:`__call__` in another ``semantics`` (the diagnosis's exact figure)."""
        return self(prompt_ids, response_ids, semantics)

    def logits(self, prompt_ids: list[int], response_ids: list[int]):
        """As :meth:`ModelRescorer.logits`: the tensor-parallel model's gathered logits,
        rank 0's (a forward of its own: the diagnosis's search reads them)."""
        return self._call(_rank_logits, list(prompt_ids), list(response_ids))

    def close(self) -> None:
        """Stop the ranks (a later call starts them again)."""
        group, self._group = self._group, None
        if group is not None:
            group.close()

    def __getstate__(self) -> dict:
        raise TypeError(
            "a tensor-parallel rescorer holds its rank processes and cannot be pickled: audit with --tp and --workers 1"
        )


def semantics_of(rescore: object) -> Semantics | None:
    """The semantics a rescorer scores in when it takes a row's own (``ModelRescorer``,
    ``TPRescorer``: a ``semantics`` attribute, and ``semantics=`` on each call); None
    for a plain callable ``(prompt_ids, response_ids)``."""
    s = getattr(rescore, "semantics", None)
    return s if isinstance(s, Semantics) else None


def check_rescore_spec(spec: object) -> None:
    """ValueError naming the value unless ``spec`` is None, a callable or a model spec
    (cheap: imports and builds nothing; :func:`resolve_rescorer` builds)."""
    if not (spec is None or callable(spec) or is_model_spec(spec)):
        raise ValueError(
            f"rescore must be a callable, a model ({', '.join(MODEL_NAMES)}, a directory or "
            f"package.module:factory) or None, got {spec!r}"
        )


def resolve_rescorer(spec: RescoreSpec) -> Callable | None:
    """The rescoring callable an option names (the one place names are resolved).

    None: no rescoring; a callable ``(prompt_ids, response_ids) -> logprobs``: itself; a
    model spec: :class:`ModelRescorer` of it (default kernels; pass a
    ``ModelRescorer(spec, batch_invariant=True)`` for the mode, ``semantics=`` for an
    engine's processed logprobs)."""
    check_rescore_spec(spec)
    if spec is None or callable(spec):
        return spec
    return ModelRescorer(spec)
