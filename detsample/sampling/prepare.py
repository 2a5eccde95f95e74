"""Pipeline steps 1-5 of one call: processors, sanitising, penalties and constraints, the
grammar mask and the logit bias (:func:`prepare`), and what they hand on (:class:`Prepared`).

Every step is row-local. A step that changes logits works on a copy (or a scratch
buffer), never on the caller's tensor, so ``x is`` the sanitised logits means "nothing
changed them" and the row maxima of step 2 still hold; a penalty or a bias that
overflows a finite logit to +inf is sanitised again.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from detsample.grammar import batching as grammar_hooks
from detsample.ops.bias import apply_logit_bias_
from detsample.processors.penalties import apply_penalties_and_constraints
from detsample.sampling.backend import TORCH, Backend


@dataclass(frozen=True)
class Prepared:
    """Steps 1-5 of one call (B rows, V tokens), all float32 unless noted."""

    raw: torch.Tensor  # (B, V) sanitised model logits (may alias the caller's)
    x: torch.Tensor  # (B, V) after steps 1-5 (may alias ``raw``)
    status: torch.Tensor  # (B,) int32 STATUS_* flags
    row_max: torch.Tensor  # (B, 1) max of ``x`` (-inf on a fully masked row)
    all_valid: bool  # host flag: every row finite, status all zero (the common case)
    backend: Backend = TORCH  # who computes the hot steps (detsample.sampling.backend)
    columns: dict | None = None  # {row: int64 numpy columns, ascending}: grammar rows of
    #                              ``x`` that are -inf outside them (step 4)
    column_values: dict | None = None  # {row: float32 numpy}: ``x`` at those columns, when
    #                                    nothing changed ``x`` after the mask (else None)
    raw_max: torch.Tensor | None = None  # (B, 1) max of ``raw`` (None: not known)


def prepare(logits: torch.Tensor, batch, *, backend: Backend, runner, masker, scratch: Callable) -> Prepared:
    """Steps 1-5 of the (B, V) float32 ``logits`` of ``batch`` (a SamplingBatch; the
    logits checked and upcast already): ``runner`` the Sampler's processor runner (step
    1), ``masker`` its grammar masker (step 4), ``scratch`` ``(name, like) -> tensor`` a
    reused buffer, ``backend`` who sanitises. The caller's logits are never written."""
    sanitize = backend.sanitize
    x = runner.run(logits, batch)  # step 1 (detsample.processors.base)
    raw, status, m, valid = sanitize(logits)  # step 2 ("raw" = sanitised model logits)
    raw_max = m
    if x is logits:
        x = raw
    else:
        x, st, m, fine = sanitize(x)
        status, valid = (status, valid) if fine and valid else (status | st, False)
    after_sanitize = x
    # Steps 3-5 never write into ``after_sanitize`` (it may alias the caller's logits):
    # a step that changes logits works on a copy, so ``x is after_sanitize`` means
    # "unchanged" and the row maxima of step 2 still hold.
    x = apply_penalties_and_constraints(  # step 3
        x, batch, lambda: scratch("constrained", x)
    )
    unchanged = x is after_sanitize
    mask_max = allowed = None
    if batch.has_grammars:  # step 4: grammar mask
        before = status
        x, status, mask_max, allowed = grammar_hooks.grammar_step(
            masker, batch, x, status, lambda: scratch("mask", x), row_max=m if unchanged else None
        )
        valid = valid and status is before
    coo = batch.logit_bias_coo()  # step 5
    if coo is not None:
        x = apply_logit_bias_(x.clone() if x is after_sanitize else x, *coo)
    if x is not after_sanitize:  # a penalty or a bias can overflow a finite logit to +inf
        if unchanged and coo is None and mask_max is not None:
            m = mask_max  # only the mask changed x: its exact maxima (no +inf, no NaN)
        else:
            x, st, m, fine = sanitize(x)
            if not fine:
                status, valid = status | st, False
    # (a bias adds finite values and re-sanitising keeps -inf: rows stay -inf outside
    # their columns; the mask's values at them hold when only the mask changed x)
    columns, values = allowed if allowed is not None else (None, None)
    only_mask = unchanged and coo is None and mask_max is not None
    return Prepared(
        raw=raw,
        x=x,
        status=status,
        row_max=m,
        all_valid=valid,
        backend=backend,
        columns=columns or None,
        column_values=values if only_mask and columns else None,
        raw_max=raw_max,
    )
