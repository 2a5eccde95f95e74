"""Column layouts: how a file's columns map onto the audit's, and how padded rows are read.

The audit works on its own column names (the *canonical* names below). A :class:`Layout`
says which column of a file feeds each of them (``--columns dst=src,...``), whether rows
are padded 2-D arrays, on which side they are padded, and where the prompt ends. The
presets (``--preset verl|openrlhf|trl|slime``) are layouts written from what each
framework keeps in a training batch (docs/audit.md, "Presets"; one example file per
preset under tests/data/).

Canonical columns:

==========================  =========  ====================================================
name                        per        meaning
==========================  =========  ====================================================
``id``                      row        reported in the worst-sequence table
``prompt_ids``              token      the prompt
``response_ids``            token      sampled tokens
``engine_logprobs``         token      logprob reported at sampling time
``trainer_logprobs``        token      logprob recomputed by the trainer
``mask``                    token      1 = trained (audited); a product ``a*b`` of columns
``attention_mask``          token      padding mask (1 = real token) of the response, of
                                       prompt + response, or of ``input_ids``
``prompt_attention_mask``   token      padding mask of ``prompt_ids``
``input_ids``               token      prompt + response in one row (instead of the two)
``response_length``         row        response tokens at the end of ``input_ids``
``logprobs_mode``,          value      the row's logprob semantics: they override the
``temperature``, ``top_k``,            rescoring's options for this sequence (null: not
``top_p``, ``min_p``                   stated; :meth:`~detsample.audit.semantics.Semantics.with_row`)
==========================  =========  ====================================================
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from detsample.audit.issues import AuditInputError
from detsample.audit.semantics import ROW_FIELDS

#: canonical column -> "row" (one value per sequence) or "token" (a list per sequence)
ROLES = {
    "id": "row",
    "prompt_ids": "token",
    "response_ids": "token",
    "engine_logprobs": "token",
    "trainer_logprobs": "token",
    "mask": "token",
    "attention_mask": "token",
    "prompt_attention_mask": "token",
    "input_ids": "token",
    "response_length": "row",
    # per-row logprob semantics (role "value": one scalar per sequence, any type, null =
    # not stated), checked by :meth:`detsample.audit.semantics.Semantics.with_row`
    **{c: "value" for c in ROW_FIELDS},
}
SEMANTICS_COLUMNS = ROW_FIELDS
#: the per-token columns of a validated sequence (what readers deliver after the layout)
LIST_COLUMNS = ("prompt_ids", "response_ids", "engine_logprobs", "trainer_logprobs", "mask")
#: the audit columns an OpenAI-compatible record (``--preset openai``) may give
OPENAI_COLUMNS = ("id", *LIST_COLUMNS, *SEMANTICS_COLUMNS)
#: what every sequence needs; ``prompt_ids`` only where a sequence is rescored
REQUIRED_COLUMNS = ("id", "response_ids", "engine_logprobs")
#: numpy dtype kinds accepted per column
COLUMN_KINDS = {
    "prompt_ids": "iu",
    "response_ids": "iu",
    "input_ids": "iu",
    "engine_logprobs": "fiu",
    "trainer_logprobs": "fiu",
    "mask": "bfiu",  # floats too: a float mask of 0.0 / 1.0 is a mask (others are bad_mask)
    "attention_mask": "bfiu",
    "prompt_attention_mask": "bfiu",
    "response_length": "iu",
}
#: columns whose source may be a product of 0/1 columns ("completion_mask*tool_mask")
MASK_COLUMNS = ("mask", "attention_mask", "prompt_attention_mask")
#: a source that stands for the row number (0-based) when a file has no id column
ROW_NUMBER = "<row>"
PADDING_SIDES = ("auto", "left", "right")
PRESET_NAMES = ("verl", "openrlhf", "trl", "slime", "openai")
#: how a file's records are read: as they are, or as OpenAI-compatible responses
RECORD_FORMATS = ("plain", "openai")
SPLITS = ("columns", "response_length", "first_mask")


@dataclass(frozen=True)
class Source:
    """Where one canonical column comes from: candidate specs, the first present wins.

    A spec is a column name, a product ``"a*b"`` of 0/1 columns (mask columns only) or
    :data:`ROW_NUMBER`. ``required``: the file must have one of the candidates (else a
    fatal error naming the file, the column and the layout)."""

    candidates: tuple[str, ...]
    required: bool = False


@dataclass(frozen=True)
class Layout:
    """How to read a file's columns (validated at construction).

    name: the preset's name, "default", or "custom".
    sources: canonical column -> :class:`Source` (columns not listed are read under their
        canonical name when the file has them).
    padded: True = per-token columns are padded 2-D rows; False = ragged lists; None =
        decide per file (2-D arrays, or an attention mask column, mean padded).
    response_padding / prompt_padding: "right", "left" or "auto" (detected from the
        attention mask; "right" where there is only a loss mask).
    split: "columns" (``prompt_ids`` and ``response_ids`` are separate columns),
        "response_length" (``input_ids`` holds prompt + response; the response is its
        last ``response_length`` tokens) or "first_mask" (``input_ids`` holds prompt +
        response; per-token columns have one entry fewer, entry j describing token j + 1,
        and the response starts at the first token with mask 1).
    explicit: canonical columns named by ``--columns`` (their source must exist).
    records: "plain" (records hold the columns), or "openai" (each JSONL record is an
        OpenAI-compatible completion response, :mod:`detsample.audit.inputs.openai`).
    """

    name: str = "default"
    sources: tuple[tuple[str, Source], ...] = ()
    padded: bool | None = None
    response_padding: str = "auto"
    prompt_padding: str = "auto"
    split: str = "columns"
    explicit: frozenset[str] = frozenset()
    records: str = "plain"

    def __post_init__(self) -> None:
        for dst, src in self.sources:
            if dst not in ROLES:
                raise ValueError(f"layout {self.name}: unknown column {dst!r} (expected one of {', '.join(ROLES)})")
            for spec in src.candidates:
                _check_spec(dst, spec)
        for field in ("response_padding", "prompt_padding"):
            if getattr(self, field) not in PADDING_SIDES:
                raise ValueError(f"{field} must be one of {PADDING_SIDES}, got {getattr(self, field)!r}")
        if self.split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {self.split!r}")
        if self.records not in RECORD_FORMATS:
            raise ValueError(f"records must be one of {RECORD_FORMATS}, got {self.records!r}")

    def source(self, dst: str) -> Source:
        for name, src in self.sources:
            if name == dst:
                return src
        return Source((dst,))

    def describe(self) -> str:
        """How errors name the layout: "preset verl", "--columns", "preset verl, --columns"."""
        parts = (
            []
            if self.name in ("default", "custom")
            else [f"preset {self.name}"]
            if self.name in PRESET_NAMES
            else [self.name]
        )
        if self.explicit:
            parts.append("--columns")
        return ", ".join(parts) or "default columns"

    def with_columns(self, mapping: Mapping[str, str]) -> Layout:
        """This layout with ``mapping`` (canonical -> source spec) taking precedence."""
        if not mapping:
            return self
        sources = dict(self.sources)
        for dst, spec in mapping.items():
            if dst not in ROLES:
                raise ValueError(f"--columns: unknown column {dst!r} (expected one of {', '.join(ROLES)})")
            sources[dst] = Source((spec,), required=True)
        name = self.name if self.name != "default" else "custom"
        return Layout(
            name,
            tuple(sources.items()),
            self.padded,
            self.response_padding,
            self.prompt_padding,
            self.split,
            self.explicit | frozenset(mapping),
            self.records,
        )


def _check_spec(dst: str, spec: str) -> None:
    if not isinstance(spec, str) or not spec:
        raise ValueError(f"column {dst}: a source must be a non-empty column name, got {spec!r}")
    if spec == ROW_NUMBER and dst != "id":
        raise ValueError(f"column {dst}: {ROW_NUMBER} stands only for the id column")
    if "*" in spec and dst not in MASK_COLUMNS:
        raise ValueError(f"column {dst}: a product of columns ({spec!r}) is allowed only for {', '.join(MASK_COLUMNS)}")
    if any(not part for part in spec.split("*")):
        raise ValueError(f"column {dst}: malformed product {spec!r}")


def parse_columns(text: str | Mapping[str, str] | None) -> dict[str, str]:
    """``"dst=src,dst2=src2"`` (or a mapping) -> {canonical: source spec}, validated.

    Raises ValueError naming the bad entry: no "=", an unknown canonical name, a
    canonical name given twice, an empty source."""
    if text is None:
        return {}
    if isinstance(text, Mapping):
        items: Iterable[tuple[str, str]] = text.items()
    else:
        items = []
        for part in str(text).split(","):
            part = part.strip()
            if not part:
                continue
            if "=" not in part:
                raise ValueError(f"--columns: expected dst=src, got {part!r}")
            dst, _, src = part.partition("=")
            items.append((dst.strip(), src.strip()))  # type: ignore[union-attr]
    out: dict[str, str] = {}
    for dst, src in items:
        if dst not in ROLES:
            raise ValueError(f"--columns: unknown column {dst!r} (expected one of {', '.join(ROLES)})")
        if dst in out:
            raise ValueError(f"--columns: {dst} given twice ({out[dst]!r} and {src!r})")
        _check_spec(dst, src)
        out[dst] = src
    return out


def _src(*candidates: str, required: bool = False) -> Source:
    return Source(tuple(candidates), required)


#: The presets: each framework's own names and padding (docs/audit.md, "Presets").
PRESETS: dict[str, Layout] = {
    # verl DataProto.batch: prompts left-padded [B, P], responses right-padded [B, R],
    # attention_mask [B, P+R], response_mask [B, R] (0 on padding and tool tokens),
    # rollout_log_probs [B, R] (engine, 0.0 on padding), old_log_probs [B, R] (trainer);
    # non_tensor_batch["uid"] groups the samples of one prompt.
    "verl": Layout(
        "verl",
        (
            ("id", _src("uid", ROW_NUMBER)),
            ("prompt_ids", _src("prompts")),
            ("response_ids", _src("responses", required=True)),
            ("engine_logprobs", _src("rollout_log_probs", required=True)),
            ("trainer_logprobs", _src("old_log_probs")),
            ("mask", _src("response_mask")),
            ("attention_mask", _src("attention_mask")),
        ),
        padded=True,
        response_padding="right",
        prompt_padding="left",
    ),
    # OpenRLHF Experience: sequences [B, T] (prompt + response, right-padded),
    # attention_mask [B, T]; action_mask, rollout_log_probs (engine), action_log_probs
    # (trainer) [B, T-1], entry j describing token j + 1; the response starts at the
    # first action token.
    "openrlhf": Layout(
        "openrlhf",
        (
            ("id", _src("index", ROW_NUMBER)),
            ("input_ids", _src("sequences", required=True)),
            ("attention_mask", _src("attention_mask")),
            ("mask", _src("action_mask", required=True)),
            ("engine_logprobs", _src("rollout_log_probs", required=True)),
            ("trainer_logprobs", _src("action_log_probs")),
        ),
        padded=True,
        response_padding="right",
        split="first_mask",
    ),
    # TRL GRPOTrainer inputs: prompt_ids / prompt_mask left-padded [B, P], completion_ids /
    # completion_mask right-padded [B, C], sampling_per_token_logps (engine, vLLM),
    # old_per_token_logps (trainer) [B, C]; tool_mask (0 on tool-result tokens, padded
    # with 1) multiplies the loss mask.
    "trl": Layout(
        "trl",
        (
            ("id", _src("id", ROW_NUMBER)),
            ("prompt_ids", _src("prompt_ids")),
            ("prompt_attention_mask", _src("prompt_mask")),
            ("response_ids", _src("completion_ids", required=True)),
            ("attention_mask", _src("completion_mask")),
            ("mask", _src("completion_mask*tool_mask", "completion_mask")),
            ("engine_logprobs", _src("sampling_per_token_logps", required=True)),
            ("trainer_logprobs", _src("old_per_token_logps")),
        ),
        padded=True,
        response_padding="right",
        prompt_padding="left",
    ),
    # slime samples (the --save-debug-train-data / --save-debug-rollout-data dumps):
    # ragged; tokens = prompt + response, response_length(s), loss_mask(s),
    # rollout_log_probs (engine) and log_probs (trainer) over the response.
    "slime": Layout(
        "slime",
        (
            ("id", _src("sample_index", "index", ROW_NUMBER)),
            ("input_ids", _src("tokens", required=True)),
            ("response_length", _src("response_lengths", "response_length", required=True)),
            ("mask", _src("loss_masks", "loss_mask")),
            ("engine_logprobs", _src("rollout_log_probs", required=True)),
            ("trainer_logprobs", _src("log_probs")),
        ),
        padded=False,
        split="response_length",
    ),
    # OpenAI-compatible /v1/completions and /v1/chat/completions responses with logprobs
    # (vLLM, SGLang), one per JSONL line: read into the audit's own columns.
    "openai": Layout("openai", padded=False, records="openai"),
}

DEFAULT_LAYOUT = Layout()


def make_layout(
    preset: str | None = None, columns: str | Mapping[str, str] | None = None, padding: str | None = None
) -> Layout:
    """The layout of ``--preset``, ``--columns`` and ``--padding`` (each optional).

    padding overrides the response padding side ("left", "right" or "auto")."""
    if preset is None:
        base = DEFAULT_LAYOUT
    elif preset in PRESETS:
        base = PRESETS[preset]
    else:
        raise ValueError(f"preset must be one of {', '.join(PRESETS)}, got {preset!r}")
    layout = base.with_columns(parse_columns(columns))
    if padding is not None:
        if padding not in PADDING_SIDES:
            raise ValueError(f"padding must be one of {PADDING_SIDES}, got {padding!r}")
        layout = Layout(
            layout.name,
            layout.sources,
            layout.padded,
            padding,
            layout.prompt_padding,
            layout.split,
            layout.explicit,
            layout.records,
        )
    return layout


@dataclass(frozen=True)
class Resolved:
    """A layout applied to one file's column names: canonical -> concrete spec (a name,
    a product "a*b", ROW_NUMBER) for the columns the file has, and the effective split."""

    layout: Layout
    specs: tuple[tuple[str, str], ...]
    split: str = "columns"

    def spec(self, dst: str) -> str | None:
        for name, spec in self.specs:
            if name == dst:
                return spec
        return None

    def wants(self) -> tuple[tuple[str, str], ...]:
        """(file column, canonical column) pairs to read, each file column once, in the
        canonical order (the product parts of a mask column name that mask column)."""
        out: list[tuple[str, str]] = []
        seen: set[str] = set()
        for dst, spec in self.specs:
            if spec == ROW_NUMBER:
                continue
            for part in spec.split("*"):
                if part not in seen:
                    seen.add(part)
                    out.append((part, dst))
        return tuple(out)

    @property
    def id_column(self) -> str | None:
        """The file's id column, or None when ids are row numbers."""
        spec = self.spec("id")
        return None if spec in (None, ROW_NUMBER) else spec

    def required(self) -> tuple[str, ...]:
        """File columns every record must have (the rest may be absent per row)."""
        need = ("response_ids", "engine_logprobs", "input_ids", "response_length")
        if self.split == "first_mask":
            need += ("mask",)  # it marks where the prompt ends
        return tuple(spec for dst, spec in self.specs if dst in need)

    def label(self, dst: str) -> str:
        """How errors name a column: "'rollout_log_probs' (engine_logprobs, preset verl)"."""
        spec = self.spec(dst) or dst
        if self.layout.name == "from_tensors":
            return f"argument {spec} of from_tensors"
        return f"column '{spec}' ({dst}, {self.layout.describe()})"


#: canonical columns that must come from different file columns: the two logprob sides
#: (one column compared with itself passes every gate), and a prompt and its response
DISTINCT_COLUMNS = (("engine_logprobs", "trainer_logprobs"), ("prompt_ids", "response_ids"))


def _refuse_shared(specs: Mapping[str, str], path: str, layout: Layout) -> None:
    """AuditInputError when a pair of :data:`DISTINCT_COLUMNS` reads one file column."""
    for a, b in DISTINCT_COLUMNS:
        if a in specs and specs.get(a) == specs.get(b):
            raise AuditInputError(
                f"{path}: {a} and {b} both read column {specs[a]!r} "
                f"({layout.describe()}): the audit would compare a column "
                f"with itself; map them to different columns"
            )


def resolve(layout: Layout, available: Iterable[str], path: str) -> Resolved:
    """Pick each canonical column's source among the file's columns ``available``.

    Fatal :class:`AuditInputError` (file, column and layout named) when an explicit
    ``--columns`` source or a required preset source is missing, or when neither
    ``prompt_ids``/``response_ids`` nor ``input_ids`` can be found."""
    names = set(available)
    split = layout.split
    if split == "columns" and "input_ids" in layout.explicit:
        split = "response_length"  # --columns input_ids=...,response_length=...
    specs: list[tuple[str, str]] = []
    for dst in ROLES:
        if split == "columns" and dst in ("input_ids", "response_length"):
            continue
        if split != "columns" and dst in ("prompt_ids", "response_ids"):
            continue
        src = layout.source(dst)
        chosen = next((c for c in src.candidates if c == ROW_NUMBER or all(p in names for p in c.split("*"))), None)
        if chosen is None and layout.name == "default" and dst in ("id",) + LIST_COLUMNS:
            chosen = dst  # absent: every sequence is excluded and counted (missing_column)
        if chosen is None and dst in SEMANTICS_COLUMNS:  # optional in every row, so read
            chosen = src.candidates[0]  # where any row has it (a JSONL's first may not)
        if chosen is None:
            if dst in layout.explicit or src.required:
                want = " or ".join(repr(c) for c in src.candidates)
                raise AuditInputError(
                    f"{path}: column {want} ({dst}, {layout.describe()}) not found; the file "
                    f"has: {', '.join(sorted(names)) or 'no columns'}"
                )
            continue
        specs.append((dst, chosen))
    _refuse_shared(dict(specs), path, layout)
    got = {d for d, _ in specs}
    if split != "columns" and "input_ids" not in got:
        raise AuditInputError(
            f"{path}: column {layout.source('input_ids').candidates[0]!r} (input_ids, {layout.describe()}) not found"
        )
    if split == "response_length" and "response_length" not in got:
        raise AuditInputError(
            f"{path}: input_ids (prompt + response in one row) needs a response_length column ({layout.describe()})"
        )
    if split == "first_mask" and "mask" not in got:
        raise AuditInputError(
            f"{path}: column {layout.source('mask').candidates[0]!r} (mask, "
            f"{layout.describe()}) not found: it marks where the prompt ends"
        )
    return Resolved(layout, tuple(specs), split)
