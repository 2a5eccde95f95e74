"""Never silently variant: the coverage check at a model's first forward under the mode.

While the mode is installed, two process-wide module hooks watch every ``nn.Module`` call
(:class:`Guard`). The first time a model (the outermost module of a call) runs under the
mode:

* a layer the mode cannot make invariant raises :class:`RefusedLayerError` naming it.
  Such a layer is found by what it keeps across calls (:mod:`detsample.invariant.recurrent`):
  floating-point state beyond keys and values in a cache the forward took or returned
  (checked after every forward; a first forward without a cache is run once more with
  ``use_cache=True`` to see what its cache would hold), or a module whose tensors the
  first forward replaced or wrote. The known linear-attention and state-space mixers
  (:data:`REFUSED`) are refused by name before they run, as well, where that check cannot
  decide alone (:func:`refused_layers`);
* the forward runs under an op recorder (:class:`~detsample.invariant.coverage.OpRecorder`
  with module paths and shapes); every aten op it ran that is neither overridden by the
  mode nor exact by construction (:func:`~detsample.invariant.coverage.uncovered`) is an
  :class:`UncoveredOpError` naming op, module and shapes, raised when the forward returns
  (``batch_invariant(strict=False)``: a :class:`UncoveredOpWarning` instead).

The verdict is kept per model (weakly) and never recomputed; :func:`findings` gives it
(``detsample probe model`` reports it), :func:`refusal` the refusal. Later forwards run
without the recorder; a refused model raises at every forward.
"""

from __future__ import annotations

import inspect
import sys
import threading
import warnings
import weakref
from dataclasses import dataclass
from typing import Any

import torch

from detsample.invariant.coverage import OpRecorder, uncovered
from detsample.invariant.mixers import Patches, cover_of, covered
from detsample.invariant.recurrent import cache_state, describe, holders, mutated, snapshot
from detsample.invariant.state import config
from detsample.invariant.verify import NotInvariantError

#: (class-name fragment, why) of layers the mode refuses by name -- only in a model the
#: structural check (what a forward keeps, :mod:`detsample.invariant.recurrent`) cannot
#: decide alone (:func:`refused_layers`): a model with no covered mixer, where a name is
#: the only refusal *before any forward* (``detsample probe model`` reports it without
#: running the model) and the only one for a mixer that keeps nothing the check sees (a
#: model that cannot be probed with a cache still runs its chunked scan from each call's
#: first token, so padding moves its chunks); and, in a model with covered mixers, an
#: uncovered one at a covered mixer's layer index, whose state the check would let pass
#: as the covered mixer's (same layer, same cache attribute)
REFUSED: tuple[tuple[str, str], ...] = (
    (
        "GatedDeltaNet",
        "a gated delta-net linear-attention layer: its chunked scan (prefill) "
        "and its recurrent step (decode) sum the state in different orders",
    ),
    (
        "Mamba",
        "a state-space (Mamba) mixer: its chunked scan (prefill) and its recurrent step "
        "(decode) sum the state in different orders",
    ),
    ("LinearAttention", "a linear-attention layer: prefill and decode sum its state in different orders"),
    ("Rwkv", "an RWKV time-mixing layer: prefill and decode sum its state in different orders"),
)


#: classes exempt from :data:`REFUSED` by name. Empty: the exemptions it held (the Mamba
#: models' RMS norms, Kimi-Linear's MLA ``KimiLinearAttention``) all sit in models with a
#: covered mixer, where the structural check decides (:func:`refused_layers`); kept for a
#: class that a fragment names in a model without one and that keeps no state
NOT_MIXERS: frozenset[str] = frozenset()


class RefusedLayerError(NotInvariantError):
    """A model holds a layer the batch-invariant mode cannot make invariant."""


class UncoveredOpError(NotInvariantError):
    """A model's first forward under the mode ran ops the mode neither overrides nor
    knows to be exact."""


class UncoveredOpWarning(UserWarning):
    """:class:`UncoveredOpError` under ``strict=False``."""


@dataclass(frozen=True)
class Finding:
    """One uncovered op of a first forward: the aten op, the module it ran in, shapes."""

    op: str
    module: str
    shapes: tuple

    def text(self) -> str:
        shapes = ", ".join("x".join(map(str, s)) if isinstance(s, tuple) else str(s) for s in self.shapes)
        return f"{self.op} in {self.module or '<model>'} [{shapes}]"

    def to_json(self) -> dict[str, Any]:
        return {
            "op": self.op,
            "module": self.module,
            "shapes": [list(s) if isinstance(s, tuple) else s for s in self.shapes],
        }


def refused_layers(model: torch.nn.Module) -> list[str]:
    """``"path (Class): why"`` for every layer of ``model`` that :data:`REFUSED` names, that
    the mode does not cover (:mod:`detsample.invariant.mixers`) and that the structural
    check cannot decide (:func:`_undecided`)."""
    out = []
    layers = covered(model)
    for name, mod in model.named_modules():
        cls = type(mod).__name__
        if cls in NOT_MIXERS or any(cover_of(m) is not None for m in mod.modules()):
            continue  # covered, or a layer holding a covered mixer
        if not _undecided(mod, layers):
            continue
        why = next((w for frag, w in REFUSED if frag.lower() in cls.lower()), None)
        if why is not None:
            out.append(f"{name or '<model>'} ({cls}): {why}")
    return out


def _undecided(mod: torch.nn.Module, layers: dict[int, frozenset[str]]) -> bool:
    """Whether the structural check cannot decide ``mod`` alone: its model has no covered
    mixer (``layers``, :func:`~detsample.invariant.mixers.covered`, empty), or ``mod`` sits
    at a covered mixer's layer index (its state would pass as that mixer's). In a model
    with covered mixers any other state is refused by what it is, at every forward: the
    Mamba models' norms and Kimi-Linear's MLA keep none and run."""
    return not layers or getattr(mod, "layer_idx", None) in layers


class _Recorder(OpRecorder):
    """:class:`OpRecorder` that also keeps, per op, the innermost module running and the
    argument shapes of its first call."""

    def __init__(self, guard: Guard) -> None:
        super().__init__()
        self.guard = guard
        self.where: dict[str, tuple[str, tuple]] = {}

    def record(self, name: str, args: tuple) -> None:
        if name not in self.where:
            shapes = tuple(tuple(a.shape) for a in args if isinstance(a, torch.Tensor))
            self.where[name] = (self.guard.current(), shapes)


class Guard:
    """The hooks' state (one per process while the mode is installed)."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.local = threading.local()
        self.verdicts: weakref.WeakKeyDictionary[torch.nn.Module, list[Finding]] = weakref.WeakKeyDictionary()
        self.refusals: weakref.WeakKeyDictionary[torch.nn.Module, str] = weakref.WeakKeyDictionary()
        self.handles: list[Any] = []
        self.patches = Patches()
        #: per model: its covered mixers' {layer: cache attributes}; the models whose
        #: mixers' patches are in place in this installation
        self.covers: weakref.WeakKeyDictionary[torch.nn.Module, dict] = weakref.WeakKeyDictionary()
        self.patched: weakref.WeakSet[torch.nn.Module] = weakref.WeakSet()

    # -- install -----------------------------------------------------------------------
    def install(self) -> None:
        with self.lock:
            if not self.handles:
                reg = torch.nn.modules.module
                self.handles = [
                    reg.register_module_forward_pre_hook(self._pre),
                    reg.register_module_forward_hook(self._post, with_kwargs=True, always_call=True),
                ]

    def uninstall(self) -> None:
        with self.lock:
            for h in self.handles:
                h.remove()
            self.handles = []
            self.patches.undo()
            self.patched = weakref.WeakSet()

    # -- per-thread call stack ---------------------------------------------------------
    def _frame(self) -> dict:
        f = getattr(self.local, "frame", None)
        if f is None:
            f = self.local.frame = {
                "depth": 0,
                "stack": [],
                "names": {},
                "rec": None,
                "root": None,
                "snap": None,
                "probing": False,
            }
        return f

    def current(self) -> str:
        stack = self._frame()["stack"]
        return stack[-1] if stack else ""

    def _pre(self, module: torch.nn.Module, args: Any) -> None:
        f = self._frame()
        if f["probing"]:
            return
        if f["depth"] == 0:
            self._first(f, module)
        f["depth"] += 1
        if f["rec"] is not None:
            f["stack"].append(f["names"].get(id(module), type(module).__name__))

    def _first(self, f: dict, module: torch.nn.Module) -> None:
        """At an outermost call: raise a standing refusal, or start the first forward's checks."""
        self._cover(module)
        if module in self.refusals:
            raise RefusedLayerError(self.refusals[module])  # every forward, not once
        if self.verdicts.get(module) and config().strict:
            raise UncoveredOpError(_message(self.verdicts[module]))
        if module not in self.verdicts:
            bad = refused_layers(module)
            if bad:
                raise RefusedLayerError(_refused(bad))
            f["names"] = {id(m): n for n, m in module.named_modules()}
            f["root"] = module
            f["snap"] = snapshot(module)
            f["rec"] = _Recorder(self)
            f["rec"].__enter__()

    def _cover(self, root: torch.nn.Module) -> None:
        """Put in place, once per installation, what ``root``'s covered mixers need."""
        with self.lock:
            if root not in self.covers:
                self.covers[root] = covered(root)
            if self.covers[root] and root not in self.patched:
                self.patches.ensure(root)
                self.patched.add(root)

    def _kept(self, root: torch.nn.Module, states: list) -> list:
        """``states`` less those of ``root``'s covered mixers (a function of position)."""
        cov = self.covers.get(root) or {}
        return [s for s in states if s.attr not in cov.get(s.layer, ())]

    def _post(self, module: torch.nn.Module, args: Any, *rest: Any) -> None:
        # (kwargs, output) normally; (output,) when the forward raised (torch's always_call)
        f = self._frame()
        if f["probing"] or f["depth"] == 0:  # a probe, or a module entered before the hooks
            return
        f["depth"] -= 1
        if f["rec"] is not None and f["stack"]:
            f["stack"].pop()
        if f["depth"]:
            return
        rec, root, snap = f["rec"], f["root"], f["snap"]
        f["rec"] = f["root"] = f["snap"] = None
        f["stack"].clear()
        if rec is not None:
            rec.__exit__(None, None, None)
        if sys.exc_info()[0] is not None or len(rest) != 2:  # the forward raised: its error stands
            return
        kwargs, output = rest
        states = [s for h in holders(args, kwargs, output) for s in cache_state(h)]
        if rec is not None:
            states += mutated(module, snap)
            if not holders(args, kwargs, output):
                states += self._probe(f, module, args, kwargs)
        states = self._kept(module, states)
        if states:
            self.refusals[module] = _refused([describe(module, states)], kept=True)
            raise RefusedLayerError(self.refusals[module])
        if rec is not None:
            self._verdict(rec, root)

    def _probe(self, f: dict, root: torch.nn.Module, args: tuple, kwargs: dict) -> list:
        """What a first forward that kept no cache would keep with one: the same call once
        more with ``use_cache=True`` (a model that takes no ``use_cache``, or fails so, is
        not probed)."""
        if not _takes_use_cache(root, kwargs):
            return []
        f["probing"] = True
        try:
            with torch.no_grad():
                out = root(*args, **{**kwargs, "use_cache": True})
        except Exception:  # noqa: BLE001 -- a model that cannot cache has no decode path
            return []
        finally:
            f["probing"] = False
        return [s for h in holders((), {}, out) for s in cache_state(h)]

    def _verdict(self, rec: _Recorder, root: torch.nn.Module) -> None:
        missing = uncovered(rec.ops)
        found = [Finding(op, *rec.where.get(op, ("", ()))) for op in missing]
        self.verdicts[root] = found
        if found:
            if config().strict:
                raise UncoveredOpError(_message(found))
            warnings.warn(_message(found), UncoveredOpWarning, stacklevel=3)


def _takes_use_cache(root: torch.nn.Module, kwargs: dict) -> bool:
    """Whether ``root``'s forward takes ``use_cache``: by name, as this call's argument, or
    through ``**kwargs`` on a model whose config has it (transformers' hybrids)."""
    if "use_cache" in kwargs:
        return True
    try:
        params = inspect.signature(root.forward).parameters
    except (TypeError, ValueError):
        return False
    if "use_cache" in params:
        return True
    return any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()) and hasattr(
        getattr(root, "config", None), "use_cache"
    )


def _refused(bad: list[str], kept: bool = False) -> str:
    why = (
        "it keeps state across calls beyond keys and values, so a decode step and a prefill "
        "compute it by different algorithms: "
        if kept
        else ""
    )
    return (
        "batch-invariant mode: this model cannot run invariant: "
        + why
        + "; ".join(bad)
        + " (docs/batch-invariant.md, 'Architectures')"
    )


def _message(found: list[Finding]) -> str:
    return (
        "batch-invariant mode: the model's first forward ran ops the mode does not cover, "
        "so its logits may depend on the batch: "
        + "; ".join(x.text() for x in found)
        + " (add them to the override table, or run with strict=False to be warned only; "
        "docs/batch-invariant.md)"
    )


GUARD = Guard()


def findings(model: torch.nn.Module) -> list[Finding] | None:
    """The uncovered ops of ``model``'s first forward under the mode (None: not run yet)."""
    return GUARD.verdicts.get(model)
