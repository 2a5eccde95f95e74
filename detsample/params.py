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
import math
import numbers
import secrets
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from detsample.errors import InvalidSamplingParams

LOGPROBS_MODES = ("raw", "scaled", "processed")
GRAMMAR_FIELDS = ("json_schema", "regex", "ebnf", "structural_tag")
SEED_BITS = 63  # seeds are non-negative int64


def _fail(msg: str) -> None:
    raise InvalidSamplingParams(msg)


def _is_int(v: Any) -> bool:
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)


def _check_float(name: str, v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, numbers.Real):
        _fail(f"{name} must be a real number, got {v!r}")
    f = float(v)
    if math.isnan(f) or math.isinf(f):
        _fail(f"{name} must be finite, got {v!r}")
    return f


def _check_int(name: str, v: Any) -> int:
    if not _is_int(v):
        _fail(f"{name} must be an integer, got {v!r}")
    return int(v)


def _token_id(name: str, v: Any) -> int:
    """An integer token id; strings such as "42" are accepted (JSON keys)."""
    if _is_int(v):
        tid = int(v)
    elif isinstance(v, str):
        s = v.strip()
        try:
            tid = int(s, 10)
        except ValueError:
            _fail(f"{name} keys must be integer token ids, got {v!r}")
    else:
        _fail(f"{name} keys must be integer token ids, got {v!r}")
    if tid < 0:
        _fail(f"{name} token ids must be >= 0, got {v!r}")
    return tid


def _normalise_bias(bias: Mapping[Any, Any] | None) -> tuple[tuple[int, float], ...] | None:
    if bias is None:
        return None
    if isinstance(bias, tuple) and all(isinstance(kv, tuple) and len(kv) == 2 for kv in bias):
        bias = dict(bias) if len({k for k, _ in bias}) == len(bias) else bias  # own form
    if not isinstance(bias, Mapping):
        _fail(f"logit_bias must be a mapping of token id to bias, got {type(bias).__name__}")
    out: dict[int, float] = {}
    spelled: dict[int, Any] = {}
    for k, v in bias.items():
        tid = _token_id("logit_bias", k)
        if tid in out:
            _fail(f"logit_bias names token {tid} twice ({spelled[tid]!r} and {k!r})")
        out[tid] = _check_float(f"logit_bias[{k!r}]", v)
        spelled[tid] = k
    return tuple(sorted(out.items()))


def _normalise_ids(name: str, ids: Any) -> tuple[int, ...]:
    if ids is None:
        return ()
    if isinstance(ids, (str, bytes)) or not isinstance(ids, Sequence) and not hasattr(ids, "__iter__"):
        _fail(f"{name} must be a sequence of token ids, got {ids!r}")
    out = []
    for v in ids:
        if not _is_int(v) or int(v) < 0:
            _fail(f"{name} must hold non-negative integer token ids, got {v!r}")
        out.append(int(v))
    return tuple(out)


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

    def __post_init__(self) -> None:
        set_ = lambda k, v: object.__setattr__(self, k, v)  # noqa: E731
        t = _check_float("temperature", self.temperature)
        if t < 0:
            _fail(f"temperature must be >= 0, got {self.temperature!r}")
        set_("temperature", t)
        k = _check_int("top_k", self.top_k)
        if k == 0 or k < -1:
            _fail(f"top_k must be -1 (disabled) or >= 1, got {self.top_k!r}")
        set_("top_k", k)
        p = _check_float("top_p", self.top_p)
        if not 0.0 < p <= 1.0:
            _fail(f"top_p must be in (0, 1], got {self.top_p!r}")
        set_("top_p", p)
        mp = _check_float("min_p", self.min_p)
        if not 0.0 <= mp <= 1.0:
            _fail(f"min_p must be in [0, 1], got {self.min_p!r}")
        set_("min_p", mp)
        rp = _check_float("repetition_penalty", self.repetition_penalty)
        if rp <= 0:
            _fail(f"repetition_penalty must be > 0, got {self.repetition_penalty!r}")
        set_("repetition_penalty", rp)
        set_("frequency_penalty", _check_float("frequency_penalty", self.frequency_penalty))
        set_("presence_penalty", _check_float("presence_penalty", self.presence_penalty))
        mnt = _check_int("min_new_tokens", self.min_new_tokens)
        if mnt < 0:
            _fail(f"min_new_tokens must be >= 0, got {self.min_new_tokens!r}")
        set_("min_new_tokens", mnt)
        if self.max_new_tokens is not None:
            mx = _check_int("max_new_tokens", self.max_new_tokens)
            if mx < 1:
                _fail(f"max_new_tokens must be >= 1, got {self.max_new_tokens!r}")
            set_("max_new_tokens", mx)
        set_("stop_token_ids", _normalise_ids("stop_token_ids", self.stop_token_ids))
        set_("logit_bias", _normalise_bias(self.logit_bias))
        if self.allowed_token_ids is not None:
            ids = _normalise_ids("allowed_token_ids", self.allowed_token_ids)
            if not ids:
                _fail("allowed_token_ids must not be empty, got ()")
            set_("allowed_token_ids", tuple(sorted(set(ids))))
        bw = []
        for seq in self.bad_words or ():
            s = _normalise_ids("bad_words", seq)
            if not s:
                _fail(f"bad_words entries must be non-empty, got {seq!r}")
            bw.append(s)
        set_("bad_words", tuple(bw))
        lp = _check_int("logprobs", self.logprobs)
        if lp < 0:
            _fail(f"logprobs must be >= 0, got {self.logprobs!r}")
        set_("logprobs", lp)
        if self.logprobs_mode not in LOGPROBS_MODES:
            _fail(f"logprobs_mode must be one of {LOGPROBS_MODES}, got {self.logprobs_mode!r}")
        if self.seed is None:
            set_("seed", secrets.randbits(SEED_BITS))
        else:
            s = _check_int("seed", self.seed)
            if not 0 <= s < 2**SEED_BITS:
                _fail(f"seed must be in [0, 2**63), got {self.seed!r}")
            set_("seed", s)
        kinds = [f for f in GRAMMAR_FIELDS if getattr(self, f) is not None]
        if len(kinds) > 1:
            _fail(f"at most one of {GRAMMAR_FIELDS} may be set, got {kinds}")
        if self.json_schema is not None and not isinstance(self.json_schema, (str, dict, bool)):
            _fail(f"json_schema must be a str or dict, got {type(self.json_schema).__name__}")
        for name in ("regex", "ebnf"):
            v = getattr(self, name)
            if v is not None and not isinstance(v, str):
                _fail(f"{name} must be a str, got {type(v).__name__}")
        if self.structural_tag is not None and not isinstance(self.structural_tag, (str, dict)):
            _fail(f"structural_tag must be a str or dict, got {type(self.structural_tag).__name__}")

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
    def has_penalties(self) -> bool:
        return (self.repetition_penalty != 1.0 or self.frequency_penalty != 0.0
                or self.presence_penalty != 0.0)

    def replace(self, **changes: Any) -> "SamplingParams":
        """A validated copy with some fields changed (the seed is kept unless given)."""
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
            _fail(f"params must be a SamplingParams, got {type(self.params).__name__}")
        self.prompt_ids = list(_normalise_ids("prompt_ids", self.prompt_ids))
        self.output_ids = list(_normalise_ids("output_ids", self.output_ids))

    @property
    def seed(self) -> int:
        return self.params.seed  # type: ignore[return-value]
