"""detsample: a bitwise-reproducible batched LLM sampler and its reproducibility harness.

Public API (a contract, see DESIGN.md)::

    from detsample import SamplingParams, Request, SamplingBatch, Sampler, SampleOutput
"""

from detsample.batch import SamplingBatch
from detsample.errors import DetsampleError, GrammarError, InvalidSamplingParams
from detsample.params import Request, SamplingParams
from detsample.sampler import SampleOutput, Sampler
from detsample.vocab import Vocabulary

__version__ = "0.1.0"

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
]
