"""Model adapters: the models detsample can drive, behind one protocol.

``load_model(spec)`` resolves a model spec to a :class:`~detsample.models.base.CausalLM`:

=====================  =====================================================================
``refmodel``           the tiny int64 reference model (batch-invariant by construction)
``refmodel-float``     its float32 twin on the usual kernels (a known-variant control)
``hf-tiny-llama``      a 4-layer ``LlamaForCausalLM``, float32, seeded weights (offline)
``hf-tiny-qwen2``      a 3-layer ``Qwen2ForCausalLM``, float32, seeded weights (offline)
``DIR``                 a local Hugging Face model directory (config.json + weights), loaded
                       by transformers in ``dtype`` (:mod:`detsample.models.hfdir`)
``pkg.module:factory`` ``factory()`` from the user's module: a Hugging Face causal LM (wrapped
                       in :class:`~detsample.models.hf.HFCausalLM`), a ``RefModel``, or any
                       object with ``new_cache`` / ``forward(caches, chunks)`` / ``vocab_size``
=====================  =====================================================================

``load_model(spec, batch_invariant=True)`` returns the same model with every forward under
``detsample.batch_invariant()`` (Hugging Face models also switch to the ``"detsample"``
attention; docs/batch-invariant.md); ``portable=True`` as well selects the mode's portable
kernels.

A Hugging Face model's end tokens (its config's and generation config's ``eos_token_id``,
united) are the loaded model's ``eos_token_ids`` attribute (:func:`model_eos_token_ids`);
the reference model and the built-in tiny models (the reference tokenizer's layout) keep
EOS id 0.

Importing the user's module is the only code a spec runs, and only when asked.
"""

from __future__ import annotations

import importlib
import inspect
from typing import Any

from detsample.errors import Interrupted
from detsample.models.base import CausalLM, ModelError, check_mode, prefill
from detsample.models.checked import CheckedLM, ModelOutputError
from detsample.models.hf import HFCausalLM, HFSeqCache
from detsample.models.hfdir import MODEL_DTYPES, config_eos_token_ids, is_model_dir_spec, load_model_dir
from detsample.models.invariant import BatchInvariantLM
from detsample.models.refmodel_float import RefModelFloat
from detsample.models.tiny import TINY_CONFIGS, build_tiny
from detsample.refmodel import RefModel

MODEL_NAMES = ("hf-tiny-llama", "hf-tiny-qwen2", "refmodel", "refmodel-float")

__all__ = [
    "BatchInvariantLM",
    "CausalLM",
    "CheckedLM",
    "HFCausalLM",
    "HFSeqCache",
    "MODEL_NAMES",
    "MODEL_DTYPES",
    "ModelError",
    "ModelOutputError",
    "RefModelLM",
    "RefModelFloat",
    "adapt",
    "build_tiny",
    "is_model_spec",
    "load_model",
    "model_eos_token_ids",
    "prefill",
]


class RefModelLM:
    """The int64 :class:`~detsample.refmodel.RefModel` as a ``CausalLM`` (it already has
    the ragged ``forward``; this names it and exposes ``vocab_size``)."""

    def __init__(self, model: RefModel | None = None, name: str = "refmodel") -> None:
        self.model = model if model is not None else RefModel()
        self.name = name
        self.vocab_size = self.model.config.vocab_size
        self.max_seq_len = self.model.config.max_seq_len

    def new_cache(self) -> Any:
        return self.model.new_cache()

    def forward(self, caches, chunks):
        return self.model.forward(caches, chunks)


def adapt(
    obj: Any, name: str, *, padding: str = "left", batch_invariant: bool = False, portable: bool = False
) -> CausalLM:
    """Wrap what a factory returned: RefModel, a Hugging Face model, or a CausalLM as is
    (with ``batch_invariant``, its forwards under the batch-invariant mode; ``portable``:
    its portable kernels)."""
    check_mode(batch_invariant, portable)
    if isinstance(obj, RefModel):
        lm = RefModelLM(obj, name=name)
        return BatchInvariantLM(lm, portable) if batch_invariant else lm
    if hasattr(obj, "config") and callable(getattr(obj, "forward", None)) and hasattr(obj, "named_parameters"):
        return HFCausalLM(obj, padding=padding, name=name, batch_invariant=batch_invariant, portable=portable)
    missing = [a for a in ("new_cache", "forward", "vocab_size") if not hasattr(obj, a)]
    if missing:
        raise ModelError(
            f"model {name!r}: the factory returned a {type(obj).__name__}, which "
            f"is neither a Hugging Face causal LM nor a CausalLM (missing "
            f"{', '.join(missing)}); see docs/probe.md, 'Your own model'"
        )
    if not hasattr(obj, "name"):
        obj.name = name
    if not hasattr(obj, "max_seq_len"):
        obj.max_seq_len = None
    return BatchInvariantLM(obj, portable) if batch_invariant else obj


def is_model_spec(spec: object) -> bool:
    """Whether ``spec`` names a model: one of :data:`MODEL_NAMES` or the syntax
    ``pkg.module:factory`` (checked without importing anything)."""
    if not isinstance(spec, str):
        return False
    if spec in MODEL_NAMES or is_model_dir_spec(spec):
        return True
    mod_name, _, attr = spec.partition(":")
    return bool(mod_name) and attr.isidentifier() and all(p.isidentifier() for p in mod_name.split("."))


def load_factory(spec: str) -> Any:
    """Import ``pkg.module`` and call ``factory()`` for ``spec = "pkg.module:factory"``.

    Every failure of the user's code is a :class:`ModelError` naming ``spec`` and what
    went wrong: the import, a missing or non-callable attribute, a factory that needs
    arguments, a factory that raises."""
    mod_name, _, attr = spec.partition(":")
    if not is_model_spec(spec):
        raise ModelError(f"model spec must be one of {', '.join(MODEL_NAMES)} or package.module:factory, got {spec!r}")
    try:
        module = importlib.import_module(mod_name)
    except Exception as e:  # the user's import error, whatever it is, goes in the message
        raise ModelError(f"cannot import {mod_name!r} for model {spec!r}: {type(e).__name__}: {e}") from e
    factory = getattr(module, attr, None)
    if not callable(factory):
        raise ModelError(f"model {spec!r}: {mod_name} has no callable {attr!r}")
    try:
        inspect.signature(factory).bind()
    except TypeError as e:
        raise ModelError(
            f"model {spec!r}: the factory must be callable without arguments ({attr}{inspect.signature(factory)}: {e})"
        ) from None
    except ValueError:  # no signature (a builtin): call it and see
        pass
    try:
        return factory()
    except Exception as e:  # the user's factory failed: named, never a bare traceback
        raise ModelError(f"model {spec!r}: {attr}() raised {type(e).__name__}: {e}") from e
    except SystemExit as e:  # never a silent exit 0 with nothing done
        raise ModelError(f"model {spec!r}: {attr}() called sys.exit({e.code!r}) instead of returning a model") from None
    except KeyboardInterrupt as e:
        if isinstance(e, Interrupted):  # a real Ctrl-C: the command's to report
            raise
        raise ModelError(f"model {spec!r}: {attr}() raised KeyboardInterrupt instead of returning a model") from None


def model_eos_token_ids(lm: Any) -> tuple[int, ...] | None:
    """The end tokens a loaded model declares (``lm.eos_token_ids``: its Hugging Face
    configs' union), or None when it declares none of its own (the engine's default, id 0)."""
    eos = getattr(lm, "eos_token_ids", None)
    return None if eos is None else tuple(int(t) for t in eos)


def load_model(
    spec: str,
    *,
    padding: str = "left",
    seed: int = 0,
    batch_invariant: bool = False,
    portable: bool = False,
    dtype: str = "float32",
) -> CausalLM:
    """The model ``spec`` names (see the module docstring); ``padding`` for HF models;
    ``batch_invariant``: every forward under the batch-invariant mode (``portable``: its
    portable kernels); ``dtype`` (:data:`MODEL_DTYPES`): a model directory's parameters
    (the other specs build float32 models and refuse another dtype)."""
    if not isinstance(spec, str) or not spec:
        raise ModelError(f"model spec must be a non-empty string, got {spec!r}")
    check_mode(batch_invariant, portable)
    if is_model_dir_spec(spec):
        model = load_model_dir(spec, dtype)
        lm = HFCausalLM(model, padding=padding, name=spec, batch_invariant=batch_invariant, portable=portable)
        lm.eos_token_ids = config_eos_token_ids(model)
        return lm
    if dtype != "float32":
        raise ModelError(f"dtype {dtype!r} applies to a model directory; model {spec!r} is float32")
    if spec == "refmodel":
        return BatchInvariantLM(RefModelLM(), portable) if batch_invariant else RefModelLM()
    if spec == "refmodel-float":
        return BatchInvariantLM(RefModelFloat(), portable) if batch_invariant else RefModelFloat()
    if spec in TINY_CONFIGS:
        return HFCausalLM(
            build_tiny(spec, seed), padding=padding, name=spec, batch_invariant=batch_invariant, portable=portable
        )
    if ":" not in spec:
        raise ModelError(
            f"unknown model {spec!r}; known: {', '.join(MODEL_NAMES)}, a model directory or package.module:factory"
        )
    obj = load_factory(spec)
    lm = CheckedLM(adapt(obj, spec, padding=padding, batch_invariant=batch_invariant, portable=portable), spec)
    eos = config_eos_token_ids(obj)
    if eos is not None:
        lm.eos_token_ids = eos
    return lm
