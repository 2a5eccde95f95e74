"""Fault injection for testing a reproducibility gate: does it catch one moved bit?

``with perturbed_sample(when): ...`` makes every ``Sampler.sample`` call flip the lowest
bit of row 0's logprob whenever ``when(batch)`` is true (e.g. ``lambda b: len(b) > 1``
breaks batch-composition invariance; ``rid="r0"`` flips that request's rows wherever
they sit, which moves a golden without breaking invariance); ``with perturbed_compute_logprobs(): ...`` does
the same to the rescoring path (breaks prefill/decode alignment). Both restore the
Sampler on exit. For tests only: never enter them in production code.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch

from detsample.sampler import Sampler


def flip_low_bit(t: torch.Tensor, indices: Sequence[int] = (0,)) -> torch.Tensor:
    """A copy of float32 tensor ``t`` ([N]) with the lowest bit of ``t[i]`` flipped for
    each i in ``indices``."""
    if t.dtype != torch.float32:
        raise ValueError(f"t must be float32, got {t.dtype}")
    out = t.clone()
    for i in indices:
        out.view(torch.int32)[i] ^= 1
    return out


@contextmanager
def _patched(name: str, wrap: Callable[[Callable[..., Any]], Callable[..., Any]]) -> Iterator[None]:
    real = getattr(Sampler, name)
    setattr(Sampler, name, wrap(real))
    try:
        yield
    finally:
        setattr(Sampler, name, real)


def perturbed_sample(when: Callable[[Any], bool] = lambda batch: True, rid: str | None = None) -> Any:
    """Context manager: ``Sampler.sample`` flips a logprob bit when ``when(batch)``: of
    the rows of request ``rid`` when given (a composition-independent change), else of
    row 0."""

    def wrap(real: Callable[..., Any]) -> Callable[..., Any]:
        def sample(self: Sampler, logits: torch.Tensor, batch: Any, positions: torch.Tensor) -> Any:
            out = real(self, logits, batch, positions)
            if len(batch) and when(batch):
                rows = [0] if rid is None else [i for i, r in enumerate(batch.requests) if r.rid == rid]
                out.logprobs = flip_low_bit(out.logprobs, rows)
            return out

        return sample

    return _patched("sample", wrap)


def perturbed_compute_logprobs() -> Any:
    """Context manager: ``Sampler.compute_logprobs`` flips row 0's bit."""

    def wrap(real: Callable[..., Any]) -> Callable[..., Any]:
        def compute_logprobs(self: Sampler, *args: Any) -> torch.Tensor:
            out = real(self, *args)
            return flip_low_bit(out) if out.numel() else out

        return compute_logprobs

    return _patched("compute_logprobs", wrap)
