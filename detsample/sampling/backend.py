"""Who computes the sampler's hot steps: the torch ops, or their Triton kernel twins.

A :class:`Backend` names the callees of the steps that have two implementations
(sanitising, temperature, the masses' ``exp``, ``log_softmax``, the uniforms, and the
Triton backend's fused thresholds-and-draw); ``Sampler(backend=...)`` binds its choice
once, when it is built (:func:`resolve`), and every step calls ``backend.<step>``
instead of testing which one runs. :data:`TORCH` is :mod:`detsample.ops` and
:mod:`detsample.rng`; :func:`triton` is :mod:`detsample.kernels.sampler_ops` (the same
contracts; docs/gpu.md says what each guarantees).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from detsample import arith, kernels
from detsample.errors import InvalidSamplingParams
from detsample.ops import logprobs as lp_ops
from detsample.ops.sanitize import sanitize_rows_flagged
from detsample.ops.temperature import scale_logits
from detsample.rng import row_uniforms

BACKENDS = ("auto", "torch", "triton")


@dataclass(frozen=True)
class Backend:
    """The callees of the steps with two implementations.

    sanitize: (B, V) float32 -> ``(clean, status, row_max, all_finite)``
    (:func:`~detsample.ops.sanitize.sanitize_rows_flagged`); scale: ``scale_logits``;
    exp: the ``exp`` of the masses (the min-p test of the "processed" logprobs uses the
    one its draw used); log_softmax: ``(x, out=None) -> (rows, V)``; log_softmax_at:
    ``(x, ids) -> (rows,)`` its values at one token id per row; uniforms:
    ``row_uniforms``; fused_cut: the Triton kernels' thresholds-and-draw (steps 8-9 in
    one kernel), None for the torch ops (the sampler's kept-set strategies).
    """

    name: str
    sanitize: Callable
    scale: Callable
    exp: Callable
    log_softmax: Callable
    log_softmax_at: Callable
    uniforms: Callable
    fused_cut: Callable | None = None


def _log_softmax(x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    return lp_ops.log_softmax(x, out=out)


def _log_softmax_at(x: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    return lp_ops.log_softmax(x, at=ids)


TORCH = Backend("torch", sanitize_rows_flagged, scale_logits, arith.exp, _log_softmax, _log_softmax_at, row_uniforms)


def triton() -> Backend:
    """The Triton kernels (:mod:`detsample.kernels.sampler_ops`; needs triton)."""
    from detsample.kernels import sampler_ops as k

    def sanitize(x: torch.Tensor):
        return (*k.sanitize_rows(x), False)

    def log_softmax_at(x: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        # the rows' normalisers by the kernel, then the tokens' values: the bits of
        # log_softmax_rows at those entries, one pass, no (B, V) output
        return lp_ops.log_softmax(x, at=ids, norm=k.normalisers_rows(x))

    return Backend(
        "triton",
        sanitize,
        k.scale_logits,
        k.exp,
        k.log_softmax_rows,
        log_softmax_at,
        k.row_uniforms,
        k.thresholds_and_draw,
    )


@dataclass(frozen=True)
class BackendChoice:
    """A Sampler's backend, bound once: ``kernels``: the Triton kernels may run (else the
    torch ops always); ``cuda_only``: they run on CUDA tensors only ("auto")."""

    name: str
    kernels: bool
    cuda_only: bool

    def for_device(self, device: torch.device) -> Backend:
        """The backend for tensors on ``device`` (one test per call)."""
        if not self.kernels or (self.cuda_only and device.type != "cuda"):
            return TORCH
        from detsample.kernels import sampler_ops

        try:
            sampler_ops.check_device(device)
        except ValueError as e:
            raise InvalidSamplingParams(f"backend={self.name!r}: {e}") from None
        return triton()


def resolve(backend: str) -> BackendChoice:
    """The choice of ``Sampler(backend=...)``: "torch", "triton" (the kernels on every
    tensor; needs triton) or "auto" (the kernels on CUDA tensors when triton is
    installed, the torch ops otherwise)."""
    if not isinstance(backend, str) or backend not in BACKENDS:
        raise InvalidSamplingParams(f"backend must be one of {BACKENDS}, got {backend!r}")
    if backend == "triton" and not kernels.available():
        raise InvalidSamplingParams(
            "backend='triton' needs the triton package (pip install triton), which is not installed"
        )
    use = backend == "triton" or (backend == "auto" and kernels.available())
    return BackendChoice(backend, use, backend == "auto")
