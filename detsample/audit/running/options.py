"""The audit's options, one frozen object validated at construction (:class:`AuditOptions`).

Every entry point (:func:`detsample.audit.audit`, :func:`detsample.audit.from_tensors`,
the CLI, worker processes and Ray tasks) passes this one object down, so an option is
checked once and read in one place.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields, replace

from detsample.audit.analysis.frameworks import FrameworkOptions
from detsample.audit.analysis.metrics import COMPARE_DTYPES
from detsample.audit.inputs.layout import DEFAULT_LAYOUT, Layout, make_layout
from detsample.audit.inputs.readers import DEFAULT_CHUNK_TOKENS
from detsample.audit.running.rescore import RescoreSpec, check_rescore_spec, resolve_rescorer

JSONL_PARSERS = ("auto", "python")
#: the ``ray`` option value that means "a local Ray" (or the one this process already joined)
LOCAL_RAY = "local"


@dataclass(frozen=True)
class AuditOptions:
    """How to audit (every field validated here; the report never depends on ``workers``,
    ``chunk_tokens``, ``jsonl_parser`` or ``ray``).

    rescore: None, a callable ``(prompt_ids, response_ids) -> logprobs`` for sequences
        without trainer logprobs (``detsample.audit.running.rescore.ModelRescorer(spec,
        batch_invariant=True)`` for a model under the batch-invariant mode), or a model
        spec ("refmodel", "hf-tiny-llama", "pkg.module:factory", ...); resolved by
        :func:`detsample.audit.running.rescore.resolve_rescorer` (:meth:`rescorer`).
    strict: the first bad sequence is fatal instead of excluded.
    workers: shards (processes, or Ray tasks with ``ray``).
    chunk_tokens: tokens per chunk read at once (>= 1).
    jsonl_parser: "auto" (pyarrow blocks, :mod:`json` for blocks with bad lines) or "python".
    compare_dtype: None (the promoted dtype of the two columns) or "float16" / "float32" /
        "float64": both logprobs rounded to it before comparing.
    layout: how the files' columns map onto the audit's (presets, ``--columns``, padding).
    ray: None (no Ray), :data:`LOCAL_RAY`, or a Ray cluster address.
    frameworks: the thresholds of the RL frameworks' metrics (verl's rollout_is_threshold,
        rollout_rs, rollout_rs_threshold), :class:`detsample.audit.analysis.frameworks.FrameworkOptions`.
    """

    rescore: RescoreSpec = None
    strict: bool = False
    workers: int = 1
    chunk_tokens: int = DEFAULT_CHUNK_TOKENS
    jsonl_parser: str = "auto"
    compare_dtype: str | None = None
    layout: Layout = DEFAULT_LAYOUT
    ray: str | None = None
    frameworks: FrameworkOptions = FrameworkOptions()

    def __post_init__(self) -> None:
        check_rescore_spec(self.rescore)
        if not isinstance(self.strict, bool):
            raise ValueError(f"strict must be a bool, got {self.strict!r}")
        for name in ("workers", "chunk_tokens"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {v!r}")
        if self.jsonl_parser not in JSONL_PARSERS:
            raise ValueError(f"jsonl_parser must be one of {JSONL_PARSERS}, got {self.jsonl_parser!r}")
        if self.compare_dtype not in COMPARE_DTYPES:
            raise ValueError(f"compare_dtype must be one of {COMPARE_DTYPES}, got {self.compare_dtype!r}")
        if not isinstance(self.layout, Layout):
            raise ValueError(f"layout must be a Layout, got {type(self.layout).__name__}")
        if not isinstance(self.frameworks, FrameworkOptions):
            raise ValueError(f"frameworks must be a FrameworkOptions, got {type(self.frameworks).__name__}")
        if self.ray is not None and (not isinstance(self.ray, str) or not self.ray):
            raise ValueError(f"ray must be None, {LOCAL_RAY!r} or a cluster address, got {self.ray!r}")

    def rescorer(self):
        """The rescoring callable (a named rescorer is built here, in the worker)."""
        return resolve_rescorer(self.rescore)

    @classmethod
    def make(
        cls,
        *,
        preset: str | None = None,
        columns: str | Mapping[str, str] | None = None,
        padding: str | None = None,
        base: AuditOptions | None = None,
        **values: object,
    ) -> AuditOptions:
        """Options from keywords: the fields above, plus ``preset`` / ``columns`` /
        ``padding`` (which build the layout, see :func:`detsample.audit.inputs.layout.make_layout`);
        ``base`` supplies the fields not given. Unknown keywords are a TypeError."""
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - names)
        if unknown:
            raise TypeError(f"unknown audit option(s): {', '.join(unknown)}")
        if values.get("ray") is True:
            values["ray"] = LOCAL_RAY
        if values.get("ray") is False:
            values["ray"] = None
        if preset is not None or columns is not None or padding is not None:
            if "layout" in values:
                raise ValueError("give layout, or preset/columns/padding, not both")
            values["layout"] = make_layout(preset, columns, padding)
        return replace(base, **values) if base is not None else cls(**values)  # type: ignore[arg-type]


def options_of(options: AuditOptions | None, fields_: dict) -> AuditOptions:
    """The options of an entry point called with ``options`` or with its fields as
    keywords (plus preset / columns / padding), not both."""
    if options is None:
        return AuditOptions.make(**fields_)
    if fields_:
        raise ValueError(f"pass options or {sorted(fields_)}, not both")
    if not isinstance(options, AuditOptions):
        raise ValueError(f"options must be an AuditOptions, got {type(options).__name__}")
    return options
