"""The model adapter protocol: what detsample needs of a causal LM.

Every consumer of a model (the probe, the continuous-batching engine, the audit's
rescoring, the model goldens) talks to it through one ragged-batch primitive, the one the
int64 reference model already has::

    cache = model.new_cache()                  # an empty per-sequence KV state
    outs = model.forward(caches, chunks)       # row b appends chunks[b] to caches[b]
    outs[b]                                    # logits (len(chunks[b]), V) float32

``len(cache)`` is the number of tokens a cache holds. Prefill is ``forward`` with an empty
cache and the whole prompt; decode is ``forward`` with one token per row; chunked prefill
is successive calls with the same cache; a batch of sequences of mixed lengths (padded
by the adapter) is one call with several rows. How the adapter pads (``padding="left"``
or ``"right"``) is the adapter's business; a batch-invariant model gives each row the
same bits whatever its neighbours, its padding and the split of its tokens into calls.

:class:`CausalLM` is that protocol. A user's own model satisfies it directly, or is a
Hugging Face causal LM that :class:`detsample.models.hf.HFCausalLM` wraps.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

import torch

from detsample.errors import DetsampleError


class ModelError(DetsampleError, ValueError):
    """A model spec cannot be resolved, or a model input is invalid (named)."""


@runtime_checkable
class CausalLM(Protocol):
    """A causal LM as detsample drives it (see the module docstring)."""

    name: str
    vocab_size: int
    max_seq_len: int | None  # None: no limit the adapter knows of

    def new_cache(self) -> Any:
        """An empty per-sequence KV state; ``len(cache)`` tokens held (0 here)."""
        ...

    def forward(self, caches: Sequence[Any], chunks: Sequence[Sequence[int]]) -> list[torch.Tensor]:
        """Ragged batch: appends ``chunks[b]`` to ``caches[b]``; logits ``(len(chunks[b]), V)``
        float32 per row b."""
        ...


class SeqCache:
    """One sequence's keys/values as a float model keeps them: ``token_ids`` (the tokens
    held, ``len(cache)``) and ``layers``, per layer a ``(keys, values)`` pair whose layout
    the adapter that fills it defines; a subclass names the tensors' sequence dimension in
    ``length_dim`` so that :meth:`truncate` can cut them."""

    length_dim: int | None = None

    def __init__(self) -> None:
        self.token_ids: list[int] = []
        self.layers: list[tuple[torch.Tensor, torch.Tensor]] = []

    def __len__(self) -> int:
        return len(self.token_ids)

    def truncate(self, n: int) -> None:
        """Keep the first ``n`` tokens (speculative decoding drops rejected drafts)."""
        if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= len(self):
            raise ModelError(f"truncate: n must be in [0, {len(self)}], got {n!r}")
        if self.length_dim is None:
            raise ModelError(f"{type(self).__name__} does not name its length_dim; it cannot be truncated")
        d = self.length_dim
        self.layers = [(k.narrow(d, 0, n), v.narrow(d, 0, n)) for k, v in self.layers]
        del self.token_ids[n:]


def prefill(model: CausalLM, token_ids: Sequence[int], cache: Any = None) -> torch.Tensor:
    """Logits ``(T, V)`` float32 of every position of ``token_ids`` in one call; with
    ``cache``, the tokens continue the sequence it holds (and are appended to it)."""
    cache = model.new_cache() if cache is None else cache
    return model.forward([cache], [list(token_ids)])[0]


def check_mode(batch_invariant: object, portable: object) -> None:
    """ModelError unless both are bools and ``portable`` comes with ``batch_invariant``."""
    for name, v in (("batch_invariant", batch_invariant), ("portable", portable)):
        if not isinstance(v, bool):
            raise ModelError(f"{name} must be a bool, got {v!r}")
    if portable and not batch_invariant:
        raise ModelError("portable=True needs batch_invariant=True (it selects the mode's portable kernels)")


def check_chunks(
    caches: Sequence[Any], chunks: Sequence[Sequence[int]], vocab_size: int, max_seq_len: int | None
) -> list[list[int]]:
    """Validate a ragged batch; returns the chunks as lists of ints (errors name the row)."""
    if len(caches) != len(chunks):
        raise ModelError(f"chunks must have one entry per cache ({len(caches)}), got {len(chunks)}")
    if len({id(c) for c in caches}) != len(caches):
        raise ModelError("caches must be distinct objects, got the same cache twice")
    out = []
    for b, (cache, chunk) in enumerate(zip(caches, chunks)):
        ids = [int(t) for t in chunk]
        if not ids:
            raise ModelError(f"chunks[{b}] must not be empty")
        bad = [t for t in ids if not 0 <= t < vocab_size]
        if bad:
            raise ModelError(f"chunks[{b}] holds token id {bad[0]} outside [0, {vocab_size})")
        if max_seq_len is not None and len(cache) + len(ids) > max_seq_len:
            raise ModelError(
                f"sequence {b} would have {len(cache) + len(ids)} tokens, more than max_seq_len={max_seq_len}"
            )
        out.append(ids)
    return out
