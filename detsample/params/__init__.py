"""Per-request sampling parameters and the request record.

``SamplingParams`` is a frozen dataclass validated at construction: every rule raises
:class:`~detsample.errors.InvalidSamplingParams` naming the field and the value
("top_p must be in (0, 1], got 1.5"). Nothing is clamped.

A request created without a seed receives one drawn from OS entropy
(:func:`secrets.randbits`), stored in ``params.seed`` so that the run can be replayed;
there is no shared default seed.
"""

from __future__ import annotations

import dataclasses
import json
import secrets
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from detsample.params.validation import fail, id_sequence, int_field, real_field, sequence_of, token_id_key

#: "raw": log_softmax of the model's logits; "scaled": after steps 1-7 (temperature);
#: "processed": vLLM's processed logprobs, log_softmax over the kept set of the logits
#: divided by the temperature (-inf elsewhere); "processed_fixed": detsample's own exact
#: form of the same distribution, z_i - log(Q 2**-F) with the draw's fixed-point kept mass
#: Q (the two differ by a few ulps: docs/sampling.md, "Logprob modes")
LOGPROBS_MODES = ("raw", "scaled", "processed", "processed_fixed")
#: the modes of the final filtered, renormalised distribution (one-hot on greedy rows)
PROCESSED_MODES = ("processed", "processed_fixed")
GRAMMAR_FIELDS = ("json_schema", "regex", "ebnf", "structural_tag")
SEED_BITS = 63  # seeds are non-negative int64


def _bias_items(bias: Any) -> list[tuple[Any, Any]]:
    """``(key, value)`` pairs of a logit_bias given as a mapping or in the normalised
    form ``((token_id, bias), ...)`` that SamplingParams stores (so ``replace`` and
    ``SamplingParams(**dataclasses.asdict(p))`` round-trip)."""
    if isinstance(bias, Mapping):
        return list(bias.items())
    if isinstance(bias, (tuple, list)) and all(isinstance(kv, (tuple, list)) and len(kv) == 2 for kv in bias):
        return [tuple(kv) for kv in bias]
    fail(f"logit_bias must be a mapping of token id to bias, got {type(bias).__name__}")


def _normalise_bias(bias: Any) -> tuple[tuple[int, float], ...] | None:
    if bias is None:
        return None
    out: dict[int, float] = {}
    spelled: dict[int, Any] = {}
    for k, v in _bias_items(bias):
        tid = token_id_key("logit_bias", k)
        if tid in out:
            fail(f"logit_bias names token {tid} twice ({spelled[tid]!r} and {k!r})")
        out[tid] = real_field(f"logit_bias[{k!r}]", v)
        spelled[tid] = k
    return tuple(sorted(out.items()))


#: (field, its type rule, the range it must be in, that range in words) of the scalar
#: fields, in field order; logprobs last
_SCALARS: tuple[tuple[str, Callable[[str, Any], Any], Callable[[Any], bool], str], ...] = (
    ("temperature", real_field, lambda v: v >= 0, ">= 0"),
    ("top_k", int_field, lambda v: v == -1 or v >= 1, "-1 (disabled) or >= 1"),
    ("top_p", real_field, lambda v: 0.0 < v <= 1.0, "in (0, 1]"),
    ("min_p", real_field, lambda v: 0.0 <= v <= 1.0, "in [0, 1]"),
    ("repetition_penalty", real_field, lambda v: v > 0, "> 0"),
    ("frequency_penalty", real_field, lambda v: True, "a real number"),
    ("presence_penalty", real_field, lambda v: True, "a real number"),
    ("min_new_tokens", int_field, lambda v: v >= 0, ">= 0"),
    ("logprobs", int_field, lambda v: v >= 0, ">= 0"),
)


@dataclass(frozen=True)
class FilterOption:
    """How the harness spells one step-8 filter of :class:`SamplingParams`: ``name`` (its
    field; ``--top-k`` on the command line), ``kind`` (int or float), ``metavar`` and
    ``help`` (the command line's), ``grid`` (the values the audit's diagnosis tries with
    it alone, and each with every top-p value). Its "off" value is the field's default
    (:attr:`neutral`)."""

    name: str
    kind: type
    metavar: str
    help: str
    grid: tuple = ()

    @property
    def neutral(self) -> Any:
        """The value that turns the filter off: the field's default."""
        return SamplingParams.__dataclass_fields__[self.name].default

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")


#: every step-8 filter, in pipeline order (top-k, top-p, then the element-wise filters of
#: ``rules.ELEMENT_FILTERS``): the one table the command line (``--top-k``, ...), the
#: audit's semantics and diagnosis and the rollout read their filters from, at call time.
#: A new filter adds its row here (docs/architecture.md, "How to add a sampling parameter").
FILTER_OPTIONS: tuple[FilterOption, ...] = (
    FilterOption("top_k", int, "K", "top-k filter K (-1: off)", (1, 5, 10, 20, 40, 50, 100)),
    FilterOption("top_p", float, "P", "top-p (nucleus) filter P (1: off)", (0.5, 0.7, 0.8, 0.9, 0.95, 0.98, 0.99)),
    FilterOption("min_p", float, "M", "min-p filter M (0: off)", (0.01, 0.02, 0.05, 0.1, 0.2)),
)


def filter_options() -> tuple[FilterOption, ...]:
    """:data:`FILTER_OPTIONS`, read when called (so a test's extension of it is seen)."""
    return FILTER_OPTIONS


@dataclass(frozen=True)
class SamplingParams:
    """Sampling parameters of one request (frozen, validated at construction).

    ``docs/sampling.md`` gives each field's semantics and formula.
    ``top_k=-1`` and ``top_p=1.0`` and ``min_p=0.0`` disable the filter;
    ``temperature=0`` (or ``top_k=1``) is greedy.
    """

    temperature: float = 1.0
    top_k: int = -1
    top_p: float = 1.0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    min_new_tokens: int = 0
    stop_token_ids: tuple[int, ...] = ()
    logit_bias: Any = None
    seed: int | None = None
    logprobs: int = 0
    logprobs_mode: str = "raw"
    json_schema: Any = None
    regex: str | None = None
    ebnf: str | None = None
    structural_tag: Any = None
    # Extensions beyond the core list (documented in docs/sampling.md).
    max_new_tokens: int | None = None
    allowed_token_ids: tuple[int, ...] | None = None
    bad_words: tuple[tuple[int, ...], ...] = ()
    logits_processor: Any = None  # per-request processor (grouped by identity)
    # per-request arguments of logits processors (vLLM extra_args, SGLang custom_params)
    extra_args: Any = None
    # SGLang's require_reasoning: the grammar starts after the end-of-thinking token
    require_reasoning: bool = False

    def __post_init__(self) -> None:
        """Validate and normalise every field, in field order (the first bad one is named)."""
        for name, read, ok, what in _SCALARS[:8]:
            self._scalar(name, read, ok, what)
        if self.max_new_tokens is not None:
            self._scalar("max_new_tokens", int_field, lambda v: v >= 1, ">= 1")
        self._token_lists()
        self._scalar(*_SCALARS[8])
        if self.logprobs_mode not in LOGPROBS_MODES:
            fail(f"logprobs_mode must be one of {LOGPROBS_MODES}, got {self.logprobs_mode!r}")
        if self.seed is None:
            self._set("seed", secrets.randbits(SEED_BITS))
        else:
            self._scalar("seed", int_field, lambda v: 0 <= v < 2**SEED_BITS, "in [0, 2**63)")
        if not isinstance(self.require_reasoning, bool):
            fail(f"require_reasoning must be a bool, got {self.require_reasoning!r}")
        self._extra_args()
        self._grammar_fields()

    def _set(self, name: str, value: Any) -> None:
        object.__setattr__(self, name, value)

    def _scalar(self, name: str, read: Callable[[str, Any], Any], ok: Callable[[Any], bool], what: str) -> None:
        """``name`` read by ``read`` (its type rule), then ``ok`` or "<name> must be <what>"."""
        raw = getattr(self, name)
        value = read(name, raw)
        if not ok(value):
            fail(f"{name} must be {what}, got {raw!r}")
        self._set(name, value)

    def _token_lists(self) -> None:
        self._set("stop_token_ids", id_sequence("stop_token_ids", self.stop_token_ids))
        self._set("logit_bias", _normalise_bias(self.logit_bias))
        if self.allowed_token_ids is not None:
            ids = id_sequence("allowed_token_ids", self.allowed_token_ids)
            if not ids:
                fail("allowed_token_ids must not be empty, got ()")
            self._set("allowed_token_ids", tuple(sorted(set(ids))))
        bw = []
        for seq in sequence_of("bad_words", self.bad_words or ()):
            s = id_sequence("bad_words", seq)
            if not s:
                fail(f"bad_words entries must be non-empty, got {seq!r}")
            bw.append(s)
        self._set("bad_words", tuple(bw))

    def _extra_args(self) -> None:
        if self.extra_args is None:
            return
        if not isinstance(self.extra_args, Mapping):
            fail(f"extra_args must be a mapping of str to values, got {type(self.extra_args).__name__}")
        bad = [k for k in self.extra_args if not isinstance(k, str)]
        if bad:
            fail(f"extra_args keys must be str, got {bad[0]!r}")
        self._set("extra_args", dict(self.extra_args))

    def _grammar_fields(self) -> None:
        kinds = [f for f in GRAMMAR_FIELDS if getattr(self, f) is not None]
        if len(kinds) > 1:
            fail(f"at most one of {GRAMMAR_FIELDS} may be set, got {kinds}")
        if self.json_schema is not None and not isinstance(self.json_schema, (str, dict, bool)):
            fail(f"json_schema must be a str or dict, got {type(self.json_schema).__name__}")
        for name in ("regex", "ebnf"):
            v = getattr(self, name)
            if v is not None and not isinstance(v, str):
                fail(f"{name} must be a str, got {type(v).__name__}")
        if self.structural_tag is not None and not isinstance(self.structural_tag, (str, dict)):
            fail(f"structural_tag must be a str or dict, got {type(self.structural_tag).__name__}")

    # -- derived ---------------------------------------------------------------------
    @property
    def is_greedy(self) -> bool:
        """Pipeline step 6: temperature 0 or top_k 1."""
        return self.temperature == 0.0 or self.top_k == 1

    @property
    def grammar(self) -> tuple[str, str] | None:
        """``(kind, text)`` of the request's grammar, or None."""
        for kind in GRAMMAR_FIELDS:
            v = getattr(self, kind)
            if v is not None:
                if isinstance(v, (dict, bool)):
                    v = json.dumps(v)  # key order kept: xgrammar emits properties in schema order
                return kind, v
        return None

    @property
    def custom_params(self) -> dict | None:
        """SGLang's name for :attr:`extra_args` (the processors' per-request arguments)."""
        return self.extra_args

    @property
    def has_penalties(self) -> bool:
        return self.repetition_penalty != 1.0 or self.frequency_penalty != 0.0 or self.presence_penalty != 0.0

    def replace(self, **changes: Any) -> SamplingParams:
        """A validated copy with some fields changed (the seed is kept unless given).

        Every field round-trips, the normalised ``logit_bias`` included: ``p.replace()``,
        ``dataclasses.replace(p)`` and ``SamplingParams(**dataclasses.asdict(p))`` all equal
        ``p`` (``asdict`` deep-copies a ``logits_processor`` object, and per-request
        processors are grouped by identity, so pass the original object back if several
        requests must share one call)."""
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable form (used in golden manifests and reports)."""
        d = {}
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if f.name == "logit_bias" and v is not None:
                v = {str(k): b for k, b in v}
            elif f.name == "logits_processor":
                v = None if v is None else type(v).__name__
            elif isinstance(v, tuple):
                v = [list(x) if isinstance(x, tuple) else x for x in v]
            d[f.name] = v
        return d


#: fields other engines' SamplingParams have that detsample spells or places otherwise
ELSEWHERE = {
    "n": "a request is one sequence: ask n samples with detsample.params.child_requests("
    "request, n) (sample j uses seed + j, vLLM's child seeds) or `detsample rollout --n N`",
    "max_tokens": "detsample's field is max_new_tokens",
    "min_tokens": "detsample's field is min_new_tokens",
}


def _reject_unknown(init):
    """``init`` with unknown keywords (and extra positionals) raising
    :class:`~detsample.errors.InvalidSamplingParams` naming them, not a bare TypeError."""
    names = tuple(f.name for f in dataclasses.fields(SamplingParams))

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        if len(args) > len(names):
            fail(f"SamplingParams takes at most {len(names)} positional fields, got {len(args)}")
        for key in kwargs:
            if key not in names:
                hint = ELSEWHERE.get(key, f"the fields are {', '.join(names)}")
                fail(f"SamplingParams has no field {key!r} (got {key}={kwargs[key]!r}): {hint}")
        init(self, *args, **kwargs)

    __init__.__doc__, __init__.__wrapped__ = init.__doc__, init  # type: ignore[attr-defined]
    return __init__


SamplingParams.__init__ = _reject_unknown(SamplingParams.__init__)  # type: ignore[method-assign]


def child_seed(seed: int, j: int) -> int:
    """The seed of sample ``j`` (0-based) of a request with seed ``seed`` asking for n
    samples: ``seed + j``, vLLM's child seeds (``_get_child_sampling_params``), so
    detsample's n samples are the n requests a vLLM user would name; an error when it
    leaves the seed range instead of wrapping."""
    s = int_field("seed", seed) + int_field("j", j)
    if j < 0 or not 0 <= s < 2**SEED_BITS:
        fail(f"child seed {seed} + {j} must be in [0, 2**63)")
    return s


@dataclass
class Request:
    """One request: its id, parameters, prompt and the tokens generated so far.

    ``output_ids`` may be non-empty at creation (a resumed request); those tokens count
    for penalties and ``min_new_tokens`` like generated ones.
    """

    rid: str
    params: SamplingParams = field(default_factory=SamplingParams)
    prompt_ids: list[int] = field(default_factory=list)
    output_ids: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not isinstance(self.params, SamplingParams):
            fail(f"params must be a SamplingParams, got {type(self.params).__name__}")
        self.prompt_ids = list(id_sequence("prompt_ids", self.prompt_ids))
        self.output_ids = list(id_sequence("output_ids", self.output_ids))

    @property
    def seed(self) -> int:
        return self.params.seed  # type: ignore[return-value]


def child_requests(request: Request, n: int) -> list[Request]:
    """``n`` requests sampling ``request``'s prompt: sample j has rid ``"{rid}/{j}"`` and
    seed :func:`child_seed` ``(seed, j)`` (vLLM's n > 1; every sample its own stream)."""
    k = int_field("n", n)
    if k < 1:
        fail(f"n must be >= 1, got {n!r}")
    return [
        Request(
            f"{request.rid}/{j}",
            request.params.replace(seed=child_seed(request.seed, j)),
            list(request.prompt_ids),
            list(request.output_ids),
        )
        for j in range(k)
    ]
