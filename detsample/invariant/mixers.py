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
(:class:`Patches`). A :class:`BoundCover` replaces its functions by ones that read the
mixer whose forward is running (:class:`Running`: its attributes, the cache it was
given), and may replace ``step`` too: the state-space families (:mod:`detsample.invariant.ssm`),
whose prefill function is not given all the decode step is. A :class:`SeededCover`
replaces nothing: its mixer's forward already runs the recurrent update whenever its
cache holds a state, and a forward pre-hook gives it a zero one (MiniMax's lightning
attention; its cache class's past length is read from a layer holding keys while the mode
is installed, so a chunked prefill is correct). A replacement may name a class attribute
(``"Class.method"``), restored -- by deletion where the class only inherited it -- on exit. A mixer
whose modeling module lacks either function, or lacks an attribute the cover reads (another transformers
version, a kernel bound from the hub), is not covered: the guard refuses it by name, or by
the state it keeps, as before. Cost: a prefill of ``T`` positions runs ``T`` recurrent steps; for the gated delta-net,
Kimi delta attention (:class:`FusedCover`), Mamba 2 and Mamba they run in one fused kernel per call
(:mod:`detsample.invariant.scans`); so does lightning attention, whose class's ``forward`` a
:class:`FusedSeededCover` replaces (float32 CPU calls; the others as the modeling code's ops,
position by position) (docs/performance.md, "Hybrid models").
"""

from __future__ import annotations

import inspect
import sys
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from detsample.invariant import scans, ssm


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
    #: attributes the mixer must have (those the replacements read)
    attrs: frozenset[str] = frozenset()
    #: the class name must be ``fragment`` itself (``MambaMixer``, not ``ZambaMambaMixer``,
    #: whose heads call the functions with other arguments)
    exact: bool = False

    def named(self, module: torch.nn.Module) -> bool:
        """Whether ``module``'s class name is of this family and it has :attr:`attrs`."""
        name = type(module).__name__
        return (name == self.fragment if self.exact else self.fragment in name) and all(
            hasattr(module, a) for a in self.attrs
        )

    def matches(self, module: torch.nn.Module) -> bool:
        """Whether ``module`` is of this family (:meth:`named`) and its modeling module has
        both functions."""
        if not self.named(module):
            return False
        home = sys.modules.get(type(module).__module__)
        return callable(getattr(home, self.target, None)) and callable(getattr(home, self.step, None))

    def replacements(self, home: Any, running: Running) -> dict[str, Callable]:
        """``{global: replacement}`` for ``home``, the modeling module (its originals)."""
        return {self.target: self.adapt(getattr(home, self.step))}

    def hook(self, module: torch.nn.Module, running: Running) -> list[Any]:
        """Put on ``module`` the hooks its replacements need; their handles."""
        return []


@dataclass(frozen=True)
class Call:
    """A covered mixer's forward in progress: the module, and the cache it was given (the
    argument with ``get_recurrent_state``; None: none)."""

    module: torch.nn.Module
    cache: Any


class Running:
    """The covered mixer whose forward each thread is in (innermost first), kept by forward
    hooks :class:`Patches` puts on the covered mixers while the mode is installed."""

    def __init__(self) -> None:
        self.local = threading.local()

    def _stack(self) -> list[Call]:
        if not hasattr(self.local, "stack"):
            self.local.stack = []
        return self.local.stack

    def enter(self, module: torch.nn.Module, args: tuple, kwargs: dict) -> None:
        cache = next((a for a in (*args, *kwargs.values()) if hasattr(a, "get_recurrent_state")), None)
        self._stack().append(Call(module, cache))

    def leave(self, module: torch.nn.Module, *rest: Any) -> None:
        stack = self._stack()
        if stack and stack[-1].module is module:
            stack.pop()

    def __call__(self) -> Call:
        """The innermost running covered mixer; RuntimeError outside any."""
        stack = self._stack()
        if not stack:
            raise RuntimeError(
                "batch-invariant mode: a covered mixer's function was called "
                "outside its mixer's forward, so the mixer it serves is unknown"
            )
        return stack[-1]


@dataclass(frozen=True)
class BoundCover(Cover):
    """A :class:`Cover` whose replacements read the running mixer (:class:`Running`).

    prefill: ``(original step, running) -> replacement of target``.
    decode: ``(original step, running) -> replacement of step``, or None to keep ``step``.
    """

    prefill: Callable[[Callable, Callable[[], Call]], Callable] = ssm.mamba2_prefill
    decode: Callable[[Callable, Callable[[], Call]], Callable] | None = None

    def replacements(self, home: Any, running: Running) -> dict[str, Callable]:
        step = getattr(home, self.step)
        out = {self.target: self.prefill(step, running)}
        if self.decode is not None:
            out[self.step] = self.decode(step, running)
        return out

    def hook(self, module: torch.nn.Module, running: Running) -> list[Any]:
        return [
            module.register_forward_pre_hook(running.enter, with_kwargs=True),
            module.register_forward_hook(running.leave, always_call=True),
        ]


def _keyed_layer(cache: Any, layer_idx: int) -> int:
    """``layer_idx``, or -- where that layer of a :class:`SeededCover`'s cache holds a linear
    state (so its key store is empty) -- the first layer that holds keys (none: ``layer_idx``)."""
    linear = getattr(cache, "linear_cache", [])

    def has_state(i: int) -> bool:
        return i < len(linear) and isinstance(linear[i], torch.Tensor)

    if not has_state(layer_idx):
        return layer_idx
    return next(
        (i for i, layer in enumerate(cache.layers) if not has_state(i) and getattr(layer, "is_initialized", False)),
        layer_idx,
    )


def _past_length(original: Callable) -> Callable:
    """``get_seq_length(layer_idx=0)`` read from :func:`_keyed_layer`'s layer (an int)."""

    def get_seq_length(self: Any, layer_idx: int = 0) -> int:
        return original(self, _keyed_layer(self, layer_idx))

    return get_seq_length


def _mask_sizes(original: Callable) -> Callable:
    """``get_mask_sizes(query_length, layer_idx)`` read from :func:`_keyed_layer`'s layer:
    ``(kv_length, kv_offset)``, the cached keys counted."""

    def get_mask_sizes(self: Any, query_length: int, layer_idx: int) -> tuple[int, int]:
        return original(self, query_length, _keyed_layer(self, layer_idx))

    return get_mask_sizes


@dataclass(frozen=True)
class SeededCover(Cover):
    """A mixer whose forward runs its recurrent update, for any number of positions,
    whenever its cache holds a state for its layer, and a blocked prefill otherwise:
    MiniMax's lightning attention (``MiniMaxLightningAttention.forward`` in transformers
    5.24: ``get_linear_cache(layer)`` None -> blocks of ``block_size`` from the call's first
    token; a state -> ``state = exp(-slope) * state + k^T v``, ``out = q state``, position by
    position, the same function of the positions). While the mode is installed a forward
    pre-hook gives the mixer a zero state when its cache has none -- in a throwaway cache
    of the modeling module's ``target`` class when the call brings no cache -- so a prefill
    runs the recurrent update too. ``step`` names the cache's getter (the setter is ``set_``
    + its name after ``get_``).

    The cache class's lengths are replaced while the mode is installed: transformers 5.24's
    ``MiniMaxCache.get_seq_length()`` and the mask's ``get_mask_sizes(q, 0)`` read layer 0,
    a linear layer whose key store is empty, so the full-attention mask of a chunked
    prefill's second call left out the cached keys (wrong logits with the default kernels,
    a bare RuntimeError inside the mode's attention). Under the mode a layer holding a
    linear state is read as the first layer holding keys (:func:`_keyed_layer`), so a
    chunked prefill is correct and equals one prefill bitwise.
    """

    def matches(self, module: torch.nn.Module) -> bool:
        if not self.named(module):
            return False
        cache = getattr(sys.modules.get(type(module).__module__), self.target, None)
        setter = "set_" + self.step.removeprefix("get_")
        return isinstance(cache, type) and all(callable(getattr(cache, f, None)) for f in (self.step, setter))

    def replacements(self, home: Any, running: Running) -> dict[str, Callable]:
        cache = getattr(home, self.target)
        return {
            f"{self.target}.get_seq_length": _past_length(cache.get_seq_length),
            f"{self.target}.get_mask_sizes": _mask_sizes(cache.get_mask_sizes),
        }

    def hook(self, module: torch.nn.Module, running: Running) -> list[Any]:
        return [module.register_forward_pre_hook(self._seed, with_kwargs=True)]

    def _seed(self, module: torch.nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        """A zero state (B, heads, head_dim, head_dim) in the hidden states' dtype for
        ``module``'s layer, in the call's cache or a throwaway one."""
        hidden = kwargs["hidden_states"] if "hidden_states" in kwargs else args[0]
        cache = next((a for a in (*args, *kwargs.values()) if hasattr(a, self.step)), None)
        if cache is None:
            cache = getattr(sys.modules[type(module).__module__], self.target)()
            kwargs = {**kwargs, "cache": cache}
        if getattr(cache, self.step)(module.layer_idx) is None:
            d = module.head_dim
            getattr(cache, "set_" + self.step.removeprefix("get_"))(
                module.layer_idx, hidden.new_zeros(hidden.shape[0], module.num_attention_heads, d, d)
            )
        return args, kwargs


#: what :func:`detsample.invariant.scans.lightning_forward` reads of a lightning attention
_LIGHTNING_PARTS = ("qkv_proj", "act_fn", "norm", "output_gate", "out_proj", "slope_rate", "head_dim")


@dataclass(frozen=True)
class FusedSeededCover(SeededCover):
    """MiniMax's lightning attention with its recurrent update by one fused kernel
    (:func:`detsample.invariant.scans.lightning_forward`): a :class:`SeededCover` (the
    seeded state, the cache's lengths) whose class's ``forward`` is also replaced while the
    mode is installed (restored at its exit). A class of another name, or whose forward
    would read parts the replacement does not know, is not matched: the plain
    :class:`SeededCover` after it runs the update as ops."""

    def matches(self, module: torch.nn.Module) -> bool:
        if type(module).__name__ != self.fragment or not super().matches(module):
            return False
        home = sys.modules.get(type(module).__module__)
        return callable(getattr(home, "apply_mask_to_padding_states", None)) and all(
            hasattr(module, a) for a in _LIGHTNING_PARTS
        )

    def replacements(self, home: Any, running: Running) -> dict[str, Callable]:
        forward = scans.lightning_forward(getattr(home, self.fragment).forward, home)
        return {**super().replacements(home, running), f"{self.fragment}.forward": forward}


@dataclass(frozen=True)
class FusedCover(Cover):
    """A gated delta-net or Kimi delta attention whose two functions (transformers 5.x's
    signatures, and the modeling module's ``l2norm``) are both replaced by one fused kernel
    (:func:`detsample.invariant.scans.gated_delta_rule`,
    :func:`~detsample.invariant.scans.kimi_delta_rule`): a prefill and a decode step by
    one arithmetic, the position-by-position cost gone. A modeling module whose functions
    take other arguments is not matched: the plain :class:`Cover` after it in
    :data:`COVERS` runs the recurrent update instead."""

    def matches(self, module: torch.nn.Module) -> bool:
        if not super().matches(module):
            return False
        home = sys.modules.get(type(module).__module__)
        return callable(getattr(home, "l2norm", None)) and all(
            _parameters(getattr(home, f)) >= _GDN_ARGS for f in (self.target, self.step)
        )

    #: ``(the recurrent original, the module's l2norm) -> replacement`` of both functions
    fused: Callable[[Callable, Callable], Callable] = scans.gated_delta_rule

    def replacements(self, home: Any, running: Running) -> dict[str, Callable]:
        rule = self.fused(getattr(home, self.step), home.l2norm)
        return {self.target: rule, self.step: rule}


def _parameters(fn: Callable) -> set[str]:
    """The parameter names of ``fn`` (of its ``forward`` where it is a module: transformers
    5.x wraps hub-replaceable functions in one); empty where they cannot be read."""
    try:
        return set(inspect.signature(fn.forward if isinstance(fn, torch.nn.Module) else fn).parameters)
    except (TypeError, ValueError):
        return set()


#: the arguments a fused gated delta-net's functions must take
_GDN_ARGS = frozenset(
    {"query", "key", "value", "g", "beta", "initial_state", "output_final_state", "use_qk_l2norm_in_kernel"}
)
_RECURRENT = frozenset({"recurrent_states"})


def _mamba2(fragment: str) -> BoundCover:
    return BoundCover(
        fragment,
        "mamba2_chunk_scan",
        "mamba2_selective_state_update",
        _RECURRENT,
        attrs=frozenset({"time_step_limit"}),
        prefill=ssm.mamba2_prefill,
        decode=ssm.mamba2_decode,
    )


#: the families the mode covers: gated delta-net (Qwen3-Next, Qwen3.5, Qwen3.5-MoE), Kimi
#: delta attention (Kimi-Linear), Mamba 2 (Mamba2, Nemotron-H, Granite-4 hybrid, Bamba,
#: Falcon-H1, Zamba2: its mixer's decode branch calls ``mamba2_selective_state_update`` as
#: Nemotron-H's does), Mamba (Mamba, FalconMamba, Jamba) and lightning attention (MiniMax)
COVERS: tuple[Cover, ...] = (
    FusedCover("GatedDeltaNet", "torch_chunk_gated_delta_rule", "torch_recurrent_gated_delta_rule", _RECURRENT),
    Cover("GatedDeltaNet", "torch_chunk_gated_delta_rule", "torch_recurrent_gated_delta_rule", _RECURRENT),
    FusedCover(
        "KimiLinearDeltaAttention",
        "chunk_kimi_delta_attention",
        "recurrent_kimi_delta_attention",
        _RECURRENT,
        fused=scans.kimi_delta_rule,
    ),
    Cover("KimiLinearDeltaAttention", "chunk_kimi_delta_attention", "recurrent_kimi_delta_attention", _RECURRENT),
    *(
        _mamba2(f)
        for f in ("Mamba2Mixer", "GraniteMoeHybridMambaLayer", "BambaMixer", "FalconH1Mixer", "Zamba2MambaMixer")
    ),
    *(
        BoundCover(
            f,
            "mamba_selective_scan",
            "mamba_selective_state_update",
            _RECURRENT,
            attrs=frozenset({"D", "layer_idx"}),
            prefill=ssm.mamba_prefill,
            decode=ssm.mamba_decode,
            exact=True,
        )
        for f in ("MambaMixer", "FalconMambaMixer", "JambaMambaMixer")
    ),
    *(
        cover(
            "MiniMaxLightningAttention",
            "MiniMaxCache",
            "get_linear_cache",
            frozenset({"linear_cache"}),
            attrs=frozenset({"layer_idx", "head_dim", "num_attention_heads", "slope_rate"}),
        )
        for cover in (FusedSeededCover, SeededCover)
    ),
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


#: what :func:`_swap` returns for an attribute a class only inherited (restored by deleting it)
_INHERITED = object()


def _swap(home: Any, attr: str, value: Any) -> Any:
    """Set ``home``'s ``attr`` (a global, or ``"Class.method"``: a class attribute) to
    ``value`` and return what it was (:data:`_INHERITED` where the class did not define it
    itself); ``value`` :data:`_INHERITED` deletes it, so the inherited one shows again."""
    owner, _, name = attr.rpartition(".")
    obj = getattr(home, owner) if owner else home
    old = obj.__dict__.get(name, _INHERITED) if isinstance(obj, type) else getattr(obj, name)
    if value is _INHERITED:
        delattr(obj, name)
    else:
        setattr(obj, name, value)
    return old


class Patches:
    """The modeling-module globals replaced while the mode is installed, and their originals."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.saved: dict[tuple[str, str], Any] = {}
        self.running = Running()
        #: mixer -> its hook handles
        self.hooks: weakref.WeakKeyDictionary[torch.nn.Module, list] = weakref.WeakKeyDictionary()

    def ensure(self, model: torch.nn.Module) -> None:
        """Replace, once, the :meth:`Cover.replacements` in the modeling module of every
        covered mixer of ``model``, and hook the mixers whose replacements read them."""
        for mod in model.modules():
            c = cover_of(mod)
            if c is None:
                continue
            name = type(mod).__module__
            with self.lock:
                home = sys.modules[name]
                new = c.replacements(home, self.running)  # from the originals
                for attr, fn in new.items():
                    if (name, attr) not in self.saved:
                        self.saved[(name, attr)] = _swap(home, attr, fn)
                if mod not in self.hooks:
                    self.hooks[mod] = c.hook(mod, self.running)

    def undo(self) -> None:
        """Restore every replaced global and remove the mixers' hooks."""
        with self.lock:
            for (name, attr), original in self.saved.items():
                _swap(sys.modules[name], attr, original)
            self.saved.clear()
            for handles in list(self.hooks.values()):
                for h in handles:
                    h.remove()
            self.hooks.clear()
