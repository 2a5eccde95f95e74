"""Logits processors (pipeline step 1) and the per-row state of penalties and constraints.

* :mod:`detsample.processors.base` -- the :class:`LogitsProcessor` interface (vLLM v1 model)
  and the runner the Sampler calls;
* :mod:`detsample.processors.loading` -- processors by class, class name or entry point;
* :mod:`detsample.processors.builtin` -- min-p, logit bias and min-tokens as processors;
* :mod:`detsample.processors.batch_update` -- how a batch's rows changed, as processors see it;
* :mod:`detsample.processors.penalty_state` -- sparse per-row token counts;
* :mod:`detsample.processors.penalties` -- penalties and token constraints as the Sampler runs them.
"""

from detsample.processors.base import (
    AddedRequest,
    BatchUpdate,
    LogitsProcessor,
    ProcessorRunner,
    RowInfo,
    SlotProcessor,
)

__all__ = ["AddedRequest", "BatchUpdate", "LogitsProcessor", "ProcessorRunner", "RowInfo", "SlotProcessor"]
