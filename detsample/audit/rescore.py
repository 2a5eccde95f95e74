"""Rescoring with the reference model: the trainer side of the audit loop.

``RefModelRescorer()(prompt_ids, response_ids)`` returns the logprobs of
``response_ids`` after ``prompt_ids`` computed by ONE prefill of the reference model
(:func:`detsample.refmodel.engine.rescore`), i.e. what a trainer recomputes. The
engine's sampling-time logprobs equal these bitwise (the prefill/decode alignment
guarantee), so ``detsample rollout`` -> ``detsample audit --rescore refmodel`` audits to
``exact_match_fraction == 1.0``.

The object is picklable and builds the model lazily, so ``--workers`` can use it.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from detsample.audit.issues import AuditInputError


def _refmodel():
    try:
        from detsample.refmodel import RefModel
        from detsample.refmodel.engine import rescore
    except ImportError as exc:  # the reference model is a separate component
        raise AuditInputError(f"the reference model (detsample.refmodel) is not available: {exc}") from exc
    return RefModel, rescore


class RefModelRescorer:
    """Callable ``(prompt_ids, response_ids) -> float32 logprobs [len(response_ids)]``.

    model_path: a safetensors file written by ``RefModel.save`` (None = the default
    model, ``RefModel()``). logprobs_mode: the mode the engine reported ("raw" by default:
    log_softmax of the model's logits, independent of the sampling parameters).
    """

    def __init__(self, model_path: str | None = None, logprobs_mode: str = "raw") -> None:
        if logprobs_mode != "raw":
            raise ValueError(f"logprobs_mode must be 'raw' for rescoring without the "
                             f"request's sampling parameters, got {logprobs_mode!r}")
        self.model_path = model_path
        self.logprobs_mode = logprobs_mode
        self._state = None

    def __getstate__(self) -> dict:
        return {"model_path": self.model_path, "logprobs_mode": self.logprobs_mode}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["model_path"], state["logprobs_mode"])

    def _load(self):
        if self._state is None:
            from detsample.params import SamplingParams
            from detsample.sampler import Sampler

            RefModel, rescore = _refmodel()
            model = RefModel() if self.model_path is None else RefModel.load(self.model_path)
            params = SamplingParams(temperature=1.0, seed=0, logprobs_mode=self.logprobs_mode)
            self._state = (model, Sampler(), params, rescore)
        return self._state

    def __call__(self, prompt_ids: list[int], response_ids: list[int]) -> np.ndarray:
        model, sampler, params, rescore = self._load()
        return rescore(model, sampler, params, prompt_ids, response_ids).numpy()


class ModelRescorer:
    """Callable ``(prompt_ids, response_ids) -> float32 logprobs [len(response_ids)]`` by
    one prefill of ``model``, a :func:`detsample.models.load_model` spec (``refmodel``,
    ``hf-tiny-llama``, ``pkg.module:factory``, ...), under the batch-invariant mode with
    ``batch_invariant``; ``model_path``: a saved reference model (``model="refmodel"``).
    Picklable; the model is built on the first call (in the worker)."""

    def __init__(self, model: str = "refmodel", *, batch_invariant: bool = False,
                 model_path: str | None = None) -> None:
        if model_path is not None and model != "refmodel":
            raise ValueError(f"model_path is for model 'refmodel', got model={model!r}")
        self.model = model
        self.batch_invariant = bool(batch_invariant)
        self.model_path = model_path
        self._state = None

    def __getstate__(self) -> dict:
        return {"model": self.model, "batch_invariant": self.batch_invariant,
                "model_path": self.model_path}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["model"], batch_invariant=state["batch_invariant"],
                      model_path=state["model_path"])

    def build_model(self):
        """The model this rescorer prefills with (built once)."""
        return self._load()[0]

    def _load(self):
        if self._state is None:
            from detsample.models import ModelError, adapt, load_model
            from detsample.params import SamplingParams
            from detsample.refmodel.engine import rescore
            from detsample.sampler import Sampler

            try:
                if self.model_path is not None:
                    RefModel, _ = _refmodel()
                    lm = adapt(RefModel.load(self.model_path), "refmodel",
                               batch_invariant=self.batch_invariant)
                else:
                    lm = load_model(self.model, batch_invariant=self.batch_invariant)
            except ModelError as exc:
                raise AuditInputError(f"rescore model: {exc}") from exc
            params = SamplingParams(temperature=1.0, seed=0, logprobs_mode="raw")
            self._state = (lm, Sampler(), params, rescore)
        return self._state

    def __call__(self, prompt_ids: list[int], response_ids: list[int]) -> np.ndarray:
        model, sampler, params, rescore = self._load()
        return rescore(model, sampler, params, prompt_ids, response_ids).numpy()


def refmodel_rescorer(model_path: str | None = None) -> RefModelRescorer:
    """The rescoring callable behind ``--rescore refmodel``."""
    _refmodel()  # fail early, naming the missing component
    return RefModelRescorer(model_path)


#: the named rescorers ``rescore`` accepts besides a callable
RESCORERS = ("refmodel",)
#: what ``rescore`` options accept: None, a callable, or a name of :data:`RESCORERS`
RescoreSpec = Callable[[list[int], list[int]], "np.ndarray | list[float]"] | str | None


def check_rescore_spec(spec: object) -> None:
    """ValueError naming the value unless ``spec`` is None, a callable or a known name
    (cheap: builds nothing; :func:`resolve_rescorer` builds)."""
    if not (spec is None or callable(spec) or (isinstance(spec, str) and spec in RESCORERS)):
        raise ValueError(f"rescore must be a callable, one of {RESCORERS} or None, got {spec!r}")


def resolve_rescorer(spec: RescoreSpec) -> Callable | None:
    """The rescoring callable an option names (the one place names are resolved).

    None: no rescoring; a callable ``(prompt_ids, response_ids) -> logprobs``: itself;
    ``"refmodel"``: the reference model (:func:`refmodel_rescorer`)."""
    check_rescore_spec(spec)
    if spec is None or callable(spec):
        return spec
    return refmodel_rescorer()  # "refmodel", the one name so far
