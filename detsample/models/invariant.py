"""Any :class:`~detsample.models.base.CausalLM` with its forwards under the batch-invariant mode.

``BatchInvariantLM(model)`` runs ``model.forward`` inside ``detsample.batch_invariant()``
and passes everything else through. Hugging Face models do not need it (``HFCausalLM``
takes ``batch_invariant=True`` and also switches the attention); it is for the reference
models and users' own adapters, whose float ops the mode then replaces. Attention a model
computes itself (not through transformers' ``AttentionInterface``) stays the model's own.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from detsample.invariant import batch_invariant
from detsample.models.base import CausalLM


class BatchInvariantLM:
    """``model`` (a CausalLM) whose every forward runs under the batch-invariant mode
    (``portable``: its portable kernels)."""

    batch_invariant = True

    def __init__(self, model: CausalLM, portable: bool = False) -> None:
        self.inner = model
        self.portable = bool(portable)
        self.name = model.name
        self.vocab_size = model.vocab_size
        self.max_seq_len = getattr(model, "max_seq_len", None)

    def new_cache(self) -> Any:
        return self.inner.new_cache()

    def forward(self, caches: Sequence[Any], chunks: Sequence[Sequence[int]]) -> list[torch.Tensor]:
        with batch_invariant(portable=self.portable):
            return self.inner.forward(caches, chunks)

    def __getattr__(self, attr: str) -> Any:  # module, padding, with_padding, ... of the inner model
        if attr == "inner":
            raise AttributeError(attr)
        value = getattr(self.inner, attr)
        if attr == "with_padding" and callable(value):
            return lambda padding: BatchInvariantLM(value(padding), self.portable)
        return value
