"""Derived forms of a model's weights, computed once per weight and kept beside it.

A product's ``B`` is usually a view of an ``nn.Parameter`` (``F.linear`` hands ``mm`` the
weight transposed). The mode sometimes needs ``B`` in another form: a contiguous copy
(when the verified plan for its layout says so), float32 (a bfloat16 weight), or in the
float64 form with block norms of :mod:`detsample.invariant.exact` (the portable product). Recomputing
that at every call would cost a pass over the weight per token; :func:`derived` keeps one
per (weight, view, form) instead.

The cache holds the parameter weakly (``torch.utils.weak.WeakTensorKeyDictionary``): the
derived forms go when the model does. An entry is keyed by the view's storage offset,
shape, strides and dtype and by the weight's version counter, so an in-place update of the
weight (an optimizer step) is never served a stale form. Only views of ``nn.Parameter``s
are cached; other operands (activations) are converted at each call.

Memory: a contiguous copy costs the weight's size again, the portable form twice it
(float64): docs/batch-invariant.md.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import torch
from torch.utils.weak import WeakTensorKeyDictionary

_LOCK = threading.Lock()
_CACHE: WeakTensorKeyDictionary = WeakTensorKeyDictionary()


def owner(t: torch.Tensor) -> torch.Tensor | None:
    """The parameter ``t`` is (a view of), or None. (Inside a kernel, below autograd, a
    view made there does not record its base: take the owner of the argument the kernel
    received and pass it to :func:`derived` for its slices.)"""
    base = t._base if t._base is not None else t
    return base if isinstance(base, torch.nn.Parameter) else None


def cache_owner(t: torch.Tensor, of: torch.Tensor | None = None) -> torch.Tensor | None:
    """The parameter :func:`derived` keeps ``t``'s forms beside (``of``, or ``t``'s
    :func:`owner`, when ``t`` lies in its storage), or None: ``t``'s forms are computed
    at each call."""
    owner_ = of if of is not None else owner(t)
    if owner_ is not None and t.untyped_storage().data_ptr() != owner_.untyped_storage().data_ptr():
        return None  # not a view of it after all: no caching
    return owner_


def derived(t: torch.Tensor, form: str, make: Callable[[torch.Tensor], Any], of: torch.Tensor | None = None) -> Any:
    """``make(t)``, cached per parameter view and ``form`` when ``t`` views a parameter
    (``of``: that parameter, when ``t`` cannot tell: a slice made inside a kernel; ``t``
    must then lie in its storage)."""
    owner_ = cache_owner(t, of)
    if owner_ is None:
        return make(t)
    key = (form, t.storage_offset(), tuple(t.shape), t.stride(), t.dtype, owner_._version)
    with _LOCK:
        forms = _CACHE.get(owner_)
        if forms is None:
            forms = _CACHE[owner_] = {}
        hit = forms.get(key)
    if hit is not None:
        return hit
    value = make(t)
    with _LOCK:
        stale = [k for k in forms if k[0] == form and k[1:5] == key[1:5] and k[5] != key[5]]
        for k in stale:  # forms of an older version of the weight
            del forms[k]
        forms[key] = value
    return value


def clear() -> None:
    """Drop every derived form (tests; memory)."""
    with _LOCK:
        _CACHE.clear()
