"""Recurrent state: what a model keeps across calls besides its keys and values.

The mode makes attention invariant because a position's keys and values are stored as
they are and every read sums over them in an order fixed by position. A layer that keeps
anything else across calls -- a linear-attention or state-space state, a convolution
window, a quantised copy of the keys -- computes a decode step by another algorithm than a
prefill (a recurrent update instead of a chunked scan), so its bits follow how the
sequence was split into calls. The guard (:mod:`detsample.invariant.guard`) refuses such a
layer until the mode covers it, and finds it by what it keeps, never by its name:

* **state held by a cache** (:func:`cache_state`): an object passed to the model's
  forward or returned by it (a transformers ``Cache``, or any object of the user's) that
  holds floating-point tensors other than stores of past inputs kept verbatim (keys and
  values, a convolution's window: :data:`KV_STORES`); integer tensors (lengths,
  positions) are bookkeeping;
* **state held by a module** (:func:`snapshot` then :func:`mutated`): a module whose
  tensor attributes (parameters, buffers, plain attributes) are replaced or written in
  place during a forward.

What it cannot see: state a model passes back and forth as bare tensors (``out, s =
model(x, s)``), or keeps outside its modules and arguments; docs/batch-invariant.md says so.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

#: attribute names of stores that hold past inputs verbatim, no arithmetic done on them:
#: per-position keys and values (transformers 5.x ``layers[i].keys``, 4.4x
#: ``key_cache[i]``), read back as stored and summed by the invariant attention; and a
#: convolution's window of its last K inputs (transformers' ``conv_states``, written by
#: copying inputs), convolved by the mode's depthwise convolution, whose windows a decode
#: step and a prefill share (:mod:`detsample.invariant.conv`)
KV_STORES = frozenset({"keys", "values", "key_cache", "value_cache", "conv_states"})

_MAX_DEPTH = 6
_MAX_ITEMS = 20_000
_LEAVES = (str, bytes, int, float, bool, complex, type, torch.dtype, torch.device, torch.nn.Module)


@dataclass(frozen=True)
class State:
    """One piece of state beyond keys and values: where it is held (``"MiniMaxCache
    .linear_cache[0]"``, ``"model.layers.0.mixer.state"``), its shape, and the layer index
    it belongs to where the path names one (transformers caches index by layer)."""

    where: str
    shape: tuple[int, ...]
    layer: int | None = None
    attr: str = ""  # the innermost attribute holding it ("recurrent_states")


def _step(path: tuple, key: Any) -> tuple:
    return path + (key,)


def _walk(obj: Any, path: tuple, depth: int, seen: set[int], budget: list[int]) -> Iterator[tuple]:
    """(path, tensor) for every tensor reachable from ``obj`` through containers and object
    attributes, ``depth`` levels at most (cycles and a total item budget bound the walk)."""
    if isinstance(obj, torch.Tensor):
        yield path, obj
        return
    if depth == 0 or obj is None or isinstance(obj, _LEAVES) or id(obj) in seen or budget[0] <= 0:
        return
    seen.add(id(obj))
    budget[0] -= 1
    if isinstance(obj, dict):
        items = list(obj.items())
    elif isinstance(obj, (list, tuple)):
        items = list(enumerate(obj))
    elif hasattr(obj, "__dict__"):
        items = [(f".{k}", v) for k, v in vars(obj).items()]
    else:
        return
    for key, value in items:
        yield from _walk(value, _step(path, key), depth - 1, seen, budget)


def _text(path: tuple) -> str:
    out = ""
    for step in path:
        out += step if isinstance(step, str) and step.startswith(".") else f"[{step!r}]"
    return out


def _attr(path: tuple) -> str:
    """The innermost attribute name on ``path`` ("" for none)."""
    names = [s[1:] for s in path if isinstance(s, str) and s.startswith(".")]
    return names[-1] if names else ""


def cache_state(holder: Any) -> list[State]:
    """The floating-point tensors ``holder`` (an object a forward took or returned) keeps
    beyond key/value stores; [] for a plain key/value cache."""
    found = []
    for path, t in _walk(holder, (), _MAX_DEPTH, set(), [_MAX_ITEMS]):
        if (t.is_floating_point() or t.is_complex()) and _attr(path) not in KV_STORES:
            layer = next((s for s in path if isinstance(s, int) and not isinstance(s, bool)), None)
            found.append(State(type(holder).__name__ + _text(path), tuple(t.shape), layer, _attr(path)))
    return found


def _fields(output: Any) -> list[Any]:
    """A forward's output as its fields: a dict's values (a transformers ``ModelOutput``),
    a tuple's items, an object's attributes, nothing for a tensor."""
    if output is None or isinstance(output, torch.Tensor):
        return []
    if isinstance(output, dict):
        return list(output.values())
    if isinstance(output, (list, tuple)):
        return list(output)
    return list(vars(output).values()) if hasattr(output, "__dict__") else []


def holders(args: tuple, kwargs: dict, output: Any) -> list[Any]:
    """The objects (not tensors, containers or modules) among a forward's arguments and
    its output's fields: where a model can keep state between calls."""
    found: list[Any] = []
    for value in (*args, *kwargs.values(), *_fields(output)):
        if value is None or isinstance(value, (torch.Tensor, dict, list, tuple, *_LEAVES)):
            continue
        if hasattr(value, "__dict__") and all(value is not h for h in found):
            found.append(value)
    return found


def _module_tensors(mod: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    yield from ((k, v) for k, v in mod._parameters.items() if v is not None)
    yield from ((k, v) for k, v in mod._buffers.items() if v is not None)
    yield from ((k, v) for k, v in vars(mod).items() if isinstance(v, torch.Tensor))


def _version(t: torch.Tensor) -> int:
    try:
        return t._version
    except RuntimeError:  # an inference tensor keeps no version counter
        return -1


def snapshot(model: torch.nn.Module) -> dict[tuple[str, str], tuple[int, int]]:
    """``{(module path, attribute): (id, version)}`` of every module's tensor attributes."""
    return {
        (name, attr): (id(t), _version(t)) for name, mod in model.named_modules() for attr, t in _module_tensors(mod)
    }


def mutated(model: torch.nn.Module, before: dict[tuple[str, str], tuple[int, int]]) -> list[State]:
    """The floating-point tensor attributes of ``model``'s modules that a forward added,
    replaced or wrote in place since :func:`snapshot` gave ``before``."""
    found = []
    for name, mod in model.named_modules():
        for attr, t in _module_tensors(mod):
            if (t.is_floating_point() or t.is_complex()) and before.get((name, attr)) != (id(t), _version(t)):
                found.append(State(f"{name or '<model>'}.{attr}", tuple(t.shape)))
    return found


def owners(model: torch.nn.Module, layer: int | None) -> list[str]:
    """``"path (Class)"`` of the innermost modules of ``model`` whose ``layer_idx`` is
    ``layer`` (transformers numbers the mixers it caches for)."""
    if layer is None:
        return []
    named = [(n, m) for n, m in model.named_modules() if getattr(m, "layer_idx", None) == layer]
    inner = [(n, m) for n, m in named if not any(o != n and o.startswith(n + ".") for o, _ in named)]
    return [f"{n or '<model>'} ({type(m).__name__})" for n, m in inner]


def describe(model: torch.nn.Module, states: list[State]) -> str:
    """One line per piece of state, naming where it is held and the layer that keeps it."""
    parts = []
    for s in states:
        who = owners(model, s.layer)
        shape = "x".join(map(str, s.shape)) or "scalar"
        by = f" kept by {who[0]}" if len(who) == 1 else f" kept by one of {', '.join(who)}" if who else ""
        parts.append(f"{s.where} [{shape}]{by}")
    return "; ".join(parts)
