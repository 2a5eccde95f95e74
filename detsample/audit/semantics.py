"""The logprob semantics an engine reports in, as the audit's rescoring speaks them.

An engine's sampling-time logprobs are "raw" (log_softmax of the model's logits, what a
trainer computes at temperature 1) or "processed" (vLLM's meaning: log_softmax over the
kept set of the logits divided by the temperature, after top-k / top-p / min-p). A
:class:`Semantics` names one of them with its temperature and filters;
``detsample audit --rescore MODEL --logprobs-mode processed --temperature 0.7 --top-p 0.9``
rescores in it, so an engine's processed logprobs are compared with processed logprobs.

Modes (:data:`detsample.params.LOGPROBS_MODES`): ``raw``; ``scaled`` (log_softmax of the
logits divided by the temperature, no filter); ``processed`` (vLLM's, bit for bit on the
same logits and kept set); ``processed_fixed`` (detsample's own exact form of the same
distribution, a few ulps from vLLM's: docs/audit.md, "Logprob semantics").
"""

from __future__ import annotations

from dataclasses import dataclass

from detsample.errors import InvalidSamplingParams
from detsample.params import LOGPROBS_MODES, SamplingParams, filter_options

#: vLLM's names of its logprob modes (``LLM(logprobs_mode=...)``), accepted in a row
VLLM_MODES = {"raw_logprobs": "raw", "processed_logprobs": "processed"}


def filter_defaults() -> tuple[tuple[str, object], ...]:
    """The fields of a semantics besides its mode, with their "off" values: temperature,
    then every filter of :data:`detsample.params.FILTER_OPTIONS`."""
    return (("temperature", 1.0), *((o.name, o.neutral) for o in filter_options()))


def row_fields() -> tuple[str, ...]:
    """The fields a row may state (its per-row columns, in the order they are checked)."""
    return ("logprobs_mode", *(n for n, _ in filter_defaults()))


#: the two above as the table stood at import (the column names the readers know)
FILTER_DEFAULTS = filter_defaults()
ROW_FIELDS = row_fields()


@dataclass(frozen=True, init=False, repr=False)
class Semantics:
    """One logprob semantics (frozen, validated at construction like SamplingParams:
    ``top_p must be in (0, 1], got 1.5``).

    ``Semantics(logprobs_mode="raw", temperature=1.0, *filters, **named)``: the filters of
    :data:`detsample.params.FILTER_OPTIONS` (``top_k``, ``top_p``, ``min_p``, ...; by
    position in that order or by name), each read as ``s.top_p``; every value as in
    :class:`~detsample.params.SamplingParams`. They change nothing in "raw" mode, so giving
    them there is an error (a file-wide option that would be silently ignored), except
    through :meth:`with_row` (a file may record the sampling temperature beside raw
    logprobs).
    """

    logprobs_mode: str
    temperature: float
    values: tuple  # (name, value) of every filter, in the table's order

    def __init__(self, logprobs_mode: str = "raw", temperature: float = 1.0, *filters: object, **named: object) -> None:
        if logprobs_mode not in LOGPROBS_MODES:
            raise InvalidSamplingParams(f"logprobs_mode must be one of {LOGPROBS_MODES}, got {logprobs_mode!r}")
        names = [o.name for o in filter_options()]
        if len(filters) > len(names):
            raise TypeError(
                f"Semantics takes at most {len(names)} filters by position ({', '.join(names)}), got {len(filters)}"
            )
        given = dict(zip(names, filters))
        for k, v in named.items():
            if k not in names or k in given:
                raise TypeError(f"Semantics got an unexpected or repeated field {k!r} (filters: {', '.join(names)})")
            given[k] = v
        p = SamplingParams(
            temperature=temperature, seed=0, logprobs_mode=logprobs_mode, **given
        )  # every field rule, once
        object.__setattr__(self, "logprobs_mode", logprobs_mode)
        object.__setattr__(self, "temperature", p.temperature)
        object.__setattr__(self, "values", tuple((n, getattr(p, n)) for n in names))

    def __getattr__(self, name: str) -> object:
        for n, v in self.__dict__.get("values", ()):
            if n == name:
                return v
        raise AttributeError(f"Semantics has no field {name!r}")

    def __repr__(self) -> str:
        fields = ", ".join(f"{k}={v!r}" for k, v in self.to_dict().items())
        return f"Semantics({fields})"

    @classmethod
    def of(cls, logprobs_mode: str = "raw", **fields: object) -> Semantics:
        """A semantics from options: filters given with "raw" are refused (raw
        logprobs are log_softmax at temperature 1; they would change nothing)."""
        s = cls(logprobs_mode, **fields)
        given = [n for n, off in filter_defaults() if getattr(s, n) != off]
        if logprobs_mode == "raw" and given:
            raise InvalidSamplingParams(
                f"{', '.join(given)} describe processed logprobs, but logprobs_mode is 'raw' "
                f"(log_softmax of the logits at temperature 1): give logprobs_mode "
                f"'processed' (--logprobs-mode processed)"
            )
        return s

    @classmethod
    def of_params(cls, params: SamplingParams, logprobs_mode: str | None = None) -> Semantics:
        """The semantics of a request's parameters: its temperature and every filter of
        the table, in ``logprobs_mode`` (default the request's own)."""
        return cls(
            logprobs_mode or params.logprobs_mode,
            params.temperature,
            **{o.name: getattr(params, o.name) for o in filter_options()},
        )

    def with_row(self, **stated: object) -> Semantics:
        """This semantics with one row's stated fields (``logprobs_mode``, ``temperature``
        and the filters; None: not stated) taking precedence, field by field;
        :class:`InvalidSamplingParams` naming the field and the value when one is bad (the
        rule of :class:`~detsample.params.SamplingParams`). A row's ``logprobs_mode`` may
        also be spelt as vLLM spells it (:data:`VLLM_MODES`). Unlike :meth:`of`, filters
        beside "raw" logprobs are accepted (a file may record the sampling temperature
        beside raw logprobs): they change nothing, so the result is then :data:`RAW`."""
        unknown = sorted(set(stated) - set(row_fields()))
        if unknown:
            raise InvalidSamplingParams(f"unknown semantics field(s): {', '.join(unknown)}")
        given = {k: _number(k, v) for k, v in stated.items() if v is not None}
        mode = given.pop("logprobs_mode", self.logprobs_mode)
        mode = VLLM_MODES.get(mode, mode) if isinstance(mode, str) else mode
        if not isinstance(mode, str) or mode not in LOGPROBS_MODES:
            raise InvalidSamplingParams(
                f"logprobs_mode must be one of {LOGPROBS_MODES} (or vLLM's {', '.join(VLLM_MODES)}), got {mode!r}"
            )
        fields = {k: v for k, v in self.to_dict().items() if k != "logprobs_mode"}
        out = Semantics(mode, **{**fields, **given})  # every field rule, once
        return RAW if out.logprobs_mode == "raw" else out

    def params(self) -> SamplingParams:
        """The rescoring request's parameters (a fixed seed: nothing is drawn)."""
        return SamplingParams(
            temperature=self.temperature, seed=0, logprobs_mode=self.logprobs_mode, **dict(self.values)
        )

    @property
    def filters(self) -> tuple[tuple[str, object], ...]:
        """(name, value) of the fields that are not off (temperature included)."""
        if self.logprobs_mode == "raw":
            return ()
        return tuple((n, getattr(self, n)) for n, off in filter_defaults() if getattr(self, n) != off)

    def describe(self) -> str:
        """'processed logprobs at temperature 0.7, top_p 0.9' / 'raw logprobs'."""
        parts = [f"{n} {_fmt(v)}" for n, v in self.filters]
        head = f"{self.logprobs_mode} logprobs"
        return f"{head} at {', '.join(parts)}" if parts else head

    def flags(self) -> str:
        """The CLI options that select it: '--logprobs-mode processed --temperature 0.7'."""
        out = [f"--logprobs-mode {self.logprobs_mode}"]
        out += [f"--{n.replace('_', '-')} {_fmt(v)}" for n, v in self.filters]
        return " ".join(out)

    def to_dict(self) -> dict:
        return {"logprobs_mode": self.logprobs_mode, "temperature": self.temperature, **dict(self.values)}


def _number(name: str, v: object) -> object:
    """A stated temperature or float filter (top_p, min_p) given as an integer, as the float it means (a
    JSON reader may hand either for 1 and 1.0: both name the same value, in messages
    too); everything else as it is."""
    floats = {"temperature"} | {o.name for o in filter_options() if o.kind is float}
    if name in floats and isinstance(v, int) and not isinstance(v, bool) and abs(v) < 2**53:
        return float(v)
    return v


def _fmt(v: object) -> str:
    return f"{v:g}" if isinstance(v, float) else str(v)


RAW = Semantics()
