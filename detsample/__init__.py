"""detsample: a bitwise-reproducible batched LLM sampler and its reproducibility harness.

Public API (a contract: docs/sampling.md and docs/architecture.md)::

    from detsample import SamplingParams, Request, SamplingBatch, Sampler, SampleOutput

and the batch-invariant mode for float models (docs/batch-invariant.md)::

    with detsample.batch_invariant():       # or detsample.enable() ... detsample.disable()
        logits = model(...)
"""

from detsample.batch import SamplingBatch
from detsample.errors import DetsampleError, GrammarError, InvalidSamplingParams
from detsample.invariant import batch_invariant, disable, enable
from detsample.params import Request, SamplingParams
from detsample.sampler import SampleOutput, Sampler
from detsample.version import __version__
from detsample.vocab import Vocabulary


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
