"""A user's model, its answers checked: :class:`CheckedLM`.

``load_model("pkg.module:factory")`` runs the user's code; what it returns is checked once
(``vocab_size`` an integer >= 1, ``new_cache`` and ``forward`` callable) and every
``forward`` result is checked against the protocol (a list of one float tensor
``(len(chunks[b]), vocab_size)`` per row) before anything reads it. A result of the wrong
type or shape, or with NaN or +inf logits (no distribution: a rollout would sample from
the sanitising floor and exit 0), is a :class:`ModelOutputError` naming the model, the row
and the position, never an ``AttributeError`` deep inside the probe or the engine.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from detsample.errors import DetsampleError
from detsample.models.base import ModelError


class ModelOutputError(ModelError):
    """A model's ``forward`` returned something other than the protocol's logits (a
    defect of the model, not of one input)."""


def _what(x: Any) -> str:
    if isinstance(x, torch.Tensor):
        return f"a {x.dtype} tensor of shape {list(x.shape)}"
    return f"a {type(x).__name__}"


class CheckedLM:
    """``model`` (a CausalLM built by the user's factory ``name``) with its forward's
    results checked; every other attribute passes through, and ``isinstance`` sees the
    wrapped model's class (``type(m)`` is ``CheckedLM``)."""

    def __init__(self, model: Any, name: str) -> None:
        vocab = getattr(model, "vocab_size", None)
        if isinstance(vocab, bool) or not isinstance(vocab, int) or vocab < 1:
            raise ModelError(f"model {name!r}: vocab_size must be an integer >= 1, got {vocab!r}")
        for attr in ("new_cache", "forward"):
            if not callable(getattr(model, attr, None)):
                raise ModelError(f"model {name!r}: {attr} must be callable, got {_what(getattr(model, attr, None))}")
        self.inner = model
        self.spec = name
        self.name = getattr(model, "name", name)
        self.vocab_size = vocab
        self.max_seq_len = getattr(model, "max_seq_len", None)

    def new_cache(self) -> Any:
        return self.inner.new_cache()

    def forward(self, caches: Sequence[Any], chunks: Sequence[Sequence[int]]) -> list[torch.Tensor]:
        try:
            outs = self.inner.forward(caches, chunks)
        except DetsampleError:
            raise
        except Exception as exc:  # the user's forward: named, never a bare traceback
            raise ModelError(f"model {self.spec!r}: forward raised {type(exc).__name__}: {exc}") from exc
        self._check(outs, chunks)
        return outs

    def _check(self, outs: Any, chunks: Sequence[Sequence[int]]) -> None:
        want = f"a list of {len(chunks)} float tensors of shape (len(chunk), {self.vocab_size})"
        if not isinstance(outs, (list, tuple)) or len(outs) != len(chunks):
            got = f"{_what(outs)} of {len(outs)} entries" if isinstance(outs, (list, tuple)) else _what(outs)
            raise ModelOutputError(f"model {self.spec!r}: forward returned {got}; expected {want}")
        for b, (o, c) in enumerate(zip(outs, chunks)):
            if (
                not isinstance(o, torch.Tensor)
                or not o.is_floating_point()
                or tuple(o.shape) != (len(c), self.vocab_size)
            ):
                raise ModelOutputError(
                    f"model {self.spec!r}: forward returned {_what(o)} for row {b} ({len(c)} tokens); expected {want}"
                )
            self._check_values(o, b, c)

    def _check_values(self, logits: torch.Tensor, row: int, chunk: Sequence[int]) -> None:
        """NaN or +inf logits are no distribution: every logprob sampled from them would be
        made up (the sampler's sanitising floor), so they are the model's defect, named."""
        bad = torch.isnan(logits) | (logits == float("inf"))
        if not bool(bad.any()):
            return
        pos = int(bad.any(-1).nonzero()[0, 0])
        what = "NaN" if bool(torch.isnan(logits[pos]).any()) else "+inf"
        raise ModelOutputError(
            f"model {self.spec!r}: the logits are not a distribution: forward returned {what} "
            f"for row {row} at position {pos} of its {len(chunk)}-token chunk (input token "
            f"{chunk[pos]}; {int(bad.any(-1).sum())} of {len(chunk)} positions have NaN or "
            f"+inf logits)"
        )

    @property  # type: ignore[misc]
    def __class__(self) -> type:  # a transparent proxy: isinstance(m, HFCausalLM) still holds
        return type(self.inner)

    def __getattr__(self, attr: str) -> Any:  # module, padding, device, ... of the inner model
        if attr == "inner":
            raise AttributeError(attr)
        value = getattr(self.inner, attr)
        if attr == "with_padding" and callable(value):
            return lambda padding: CheckedLM(value(padding), self.spec)
        return value
