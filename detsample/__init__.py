"""detsample: a bitwise-reproducible batched LLM sampler and its reproducibility harness.

Public API (a contract: docs/sampling.md and docs/architecture.md)::

    from detsample import SamplingParams, Request, SamplingBatch, Sampler, SampleOutput

and the batch-invariant mode for float models (docs/batch-invariant.md)::

    with detsample.batch_invariant():       # or detsample.enable() ... detsample.disable()
        logits = model(...)

The names that need torch are imported on first use (PEP 562), so importing the package
(``python -m detsample``, any submodule) costs nothing until one of them is used: the
command line installs its Ctrl-C handler before torch's seconds of import.
"""

from __future__ import annotations

import importlib

from detsample.errors import DetsampleError, GrammarError, InvalidSamplingParams
from detsample.version import __version__

#: public name -> the module that defines it (imported on first use)
_LAZY = {
    "Request": "detsample.params",
    "SampleOutput": "detsample.sampler",
    "Sampler": "detsample.sampler",
    "SamplingBatch": "detsample.batch",
    "SamplingParams": "detsample.params",
    "Vocabulary": "detsample.vocab",
    "batch_invariant": "detsample.invariant",
    "disable": "detsample.invariant",
    "enable": "detsample.invariant",
}

__all__ = [
    "DetsampleError",
    "GrammarError",
    "InvalidSamplingParams",
    "Request",
    "SampleOutput",
    "Sampler",
    "SamplingBatch",
    "SamplingParams",
    "Vocabulary",
    "__version__",
    "batch_invariant",
    "disable",
    "enable",
]


def __getattr__(name: str):
    """The lazily imported public names (:data:`_LAZY`)."""
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'detsample' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
