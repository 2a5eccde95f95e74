"""detsample: a bitwise-reproducible batched LLM sampler and its reproducibility harness.

Public API (a contract, see DESIGN.md)::

    from detsample import SamplingParams, Request, SamplingBatch, Sampler, SampleOutput
"""

from detsample.errors import DetsampleError, GrammarError, InvalidSamplingParams
from detsample.params import Request, SamplingParams
from detsample.vocab import Vocabulary  # grammar branch

__version__ = "0.1.0"

__all__ = [
    "DetsampleError",
    "GrammarError",
    "InvalidSamplingParams",
    "Request",
    "SamplingParams",
    "Vocabulary",
    "__version__",
]

from detsample.batch import SamplingBatch  # noqa: E402
from detsample.sampler import SampleOutput, Sampler  # noqa: E402

__all__ += ["SamplingBatch", "SampleOutput", "Sampler"]
