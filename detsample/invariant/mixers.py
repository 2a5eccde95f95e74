"""Recurrent mixers the mode runs invariantly: one algorithm for a prefill and a decode step.

A linear-attention or state-space mixer keeps a state across calls. transformers computes
a prefill by a *chunked* scan (blocks counted from the call's first token, the state summed
block by block) and a decode step by the *recurrent* update (the state updated one token at
a time), so a position's bits follow how its sequence was split into calls. Under the mode
such a mixer is run by its recurrent update for every position, a prefill included: the
state after position ``t`` is then the same function of positions ``0..t`` whatever the
calls were (one token at a time, one prefill, chunks of any size), and every sum inside the
update is one of the mode's row sums, invariant to the batch and the thread count. The
state a cache keeps for such a mixer is therefore a function of position alone, and the
guard (:mod:`detsample.invariant.guard`) lets it pass where it refuses any other state.

A :class:`Cover` names one family: the mixer class (by the fragment of its class name),
the modeling module's global function its prefill calls (``target``) and the one its
decode step calls (``step``), and the cache attributes its state is kept in. While the mode
is installed, ``target`` is replaced in that modeling module by ``step`` (adapted to
``target``'s signature, :attr:`Cover.adapt`); on the mode's exit the original is restored
(:class:`Patches`). A mixer whose modeling module lacks either function (another
transformers version, a kernel bound from the hub) is not covered: the guard refuses it by
name, as before. Cost: a prefill of ``T`` positions runs ``T`` recurrent steps
(docs/performance.md, "Hybrid models").
"""

from __future__ import annotations

import sys
import threading
from dataclasses import dataclass
from typing import Any, Callable

import torch


def _without_chunk_size(step: Callable) -> Callable:
    """``step`` taking (and ignoring) the chunked function's ``chunk_size``."""
    def run(*args: Any, chunk_size: Any = None, **kwargs: Any) -> Any:
        return step(*args, **kwargs)
    run.__name__ = f"detsample_sequential_{getattr(step, '__name__', 'step')}"
    return run


@dataclass(frozen=True)
class Cover:
    """One family of recurrent mixers the mode runs by their recurrent update.

    fragment: a fragment of the mixer's class name (case-sensitive), e.g. ``"GatedDeltaNet"``.
    target: the modeling module's global the mixer calls for a prefill (the chunked scan).
    step: the global it calls for a decode step (the recurrent update), which replaces
    ``target`` while the mode is installed, adapted by ``adapt``.
    states: the cache attributes its state is kept in (transformers' ``recurrent_states``).
    """

    fragment: str
    target: str
    step: str
    states: frozenset[str]
    adapt: Callable[[Callable], Callable] = _without_chunk_size

    def matches(self, module: torch.nn.Module) -> bool:
        """Whether ``module`` is of this family and its modeling module has both functions."""
        if self.fragment not in type(module).__name__:
            return False
        home = sys.modules.get(type(module).__module__)
        return callable(getattr(home, self.target, None)) and callable(getattr(home, self.step, None))


#: the families the mode covers: gated delta-net (Qwen3-Next, Qwen3.5, Qwen3.5-MoE) and
#: Kimi delta attention (Kimi-Linear)
COVERS: tuple[Cover, ...] = (
    Cover("GatedDeltaNet", "torch_chunk_gated_delta_rule", "torch_recurrent_gated_delta_rule",
          frozenset({"recurrent_states"})),
    Cover("KimiLinearDeltaAttention", "chunk_kimi_delta_attention", "recurrent_kimi_delta_attention",
          frozenset({"recurrent_states"})),
)


def cover_of(module: torch.nn.Module) -> Cover | None:
    """The :class:`Cover` that runs ``module`` invariantly, or None."""
    return next((c for c in COVERS if c.matches(module)), None)


def covered(model: torch.nn.Module) -> dict[int, frozenset[str]]:
    """``{layer index: cache attributes}`` of the covered mixers of ``model`` (their
    ``layer_idx``, by which transformers' caches index state; a mixer without one has
    no state the guard can attribute to it, so none of its state passes)."""
    out: dict[int, frozenset[str]] = {}
    for mod in model.modules():
        c = cover_of(mod)
        layer = getattr(mod, "layer_idx", None)
        if c is not None and isinstance(layer, int):
            out[layer] = out.get(layer, frozenset()) | c.states
    return out


class Patches:
    """The modeling-module globals replaced while the mode is installed, and their originals."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.saved: dict[tuple[str, str], Any] = {}

    def ensure(self, model: torch.nn.Module) -> None:
        """Replace, once, ``target`` by ``step`` in the modeling module of every covered
        mixer of ``model``."""
        for mod in model.modules():
            c = cover_of(mod)
            if c is None:
                continue
            name = type(mod).__module__
            with self.lock:
                if (name, c.target) not in self.saved:
                    home = sys.modules[name]
                    self.saved[(name, c.target)] = getattr(home, c.target)
                    setattr(home, c.target, c.adapt(getattr(home, c.step)))

    def undo(self) -> None:
        """Restore every replaced global."""
        with self.lock:
            for (name, attr), original in self.saved.items():
                setattr(sys.modules[name], attr, original)
            self.saved.clear()
