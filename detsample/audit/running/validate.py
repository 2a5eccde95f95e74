"""Validation of parsed audit chunks: every bad sequence is named and excluded, never dropped.

:func:`validate` turns a :class:`~detsample.audit.inputs.table.RawChunk` into an
:class:`~detsample.audit.inputs.table.AuditBatch`
holding only the valid sequences, plus one :class:`~detsample.audit.issues.Issue` per excluded
sequence (its first problem, in the order of the checks below). Checks, vectorised over
the chunk's columns:

1. parse issues from the reader (bad JSON, wrong types, nulls);
2. required columns present (``response_ids``, ``engine_logprobs``); ``trainer_logprobs``
   present, or recomputed by the ``rescore`` callable (which needs ``prompt_ids``: only
   a sequence to rescore requires a prompt) in the row's stated logprob semantics (the
   per-row columns ``logprobs_mode``, ``temperature``, ``top_k``, ``top_p``, ``min_p``,
   judged first by the rule of a sampling option: ``bad_semantics``, ``top_p must be in
   (0, 1], got 1.5``);
3. ``engine_logprobs`` / ``trainer_logprobs`` count == ``response_ids`` count
   (kind ``count_mismatch``); ``mask`` count == ``response_ids`` count (kind ``ragged``);
4. values: of the column's kind in every format (``bad_type``,
   :mod:`detsample.audit.inputs.values`: token ids integers in the int64 range, logprobs
   numbers, masks 0/1 or bools); logprobs not NaN (``nan``), not infinite
   (``non_finite``), not > 0 (``positive_logprob``); mask only 0/1 (``bad_mask``); token
   ids >= 0 (``negative_token_id``).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from detsample.audit.inputs.layout import SEMANTICS_COLUMNS
from detsample.audit.inputs.table import AuditBatch, RawChunk, offsets_from_lengths
from detsample.audit.inputs.values import kind_problems, value_message
from detsample.audit.issues import Issue
from detsample.audit.running.rescore import RescoreModelError, semantics_of
from detsample.audit.semantics import RAW, Semantics
from detsample.errors import InvalidSamplingParams

RescoreFn = Callable[[list[int], list[int]], "np.ndarray | list[float]"]


def stated_semantics(raw: RawChunk, base: Semantics, bad: dict[int, Issue]) -> dict[int, Semantics]:
    """Row -> its semantics (``base`` with the row's stated fields,
    :meth:`~detsample.audit.semantics.Semantics.with_row`) for the rows of ``raw`` that
    state any; a bad value excludes its row (``bad_semantics``, the field and the value
    named; recorded in ``bad``). Rows already excluded are skipped."""
    cols = [(c, raw.row_values[c]) for c in SEMANTICS_COLUMNS if c in raw.row_values]
    out: dict[int, Semantics] = {}
    if not cols:
        return out
    memo: dict[tuple, Semantics | Issue] = {}
    for i in range(len(raw)):
        fields = {c: v[i] for c, v in cols if v[i] is not None}
        if i in bad or not fields:
            continue
        got = _not_scalar(fields)
        if got is None:
            key = tuple((c, type(v).__name__, v) for c, v in fields.items())
            got = memo.get(key)
            if got is None:
                got = memo[key] = _row_semantics(base, fields)
        if isinstance(got, Semantics):
            out[i] = got
        else:
            bad[i] = Issue(raw.source, int(raw.lines[i]), got.field, got.kind, got.message, raw.unit)
    return out


def _not_scalar(fields: dict) -> Issue | None:
    """An Issue naming the first field whose value is not one number, string or bool (a
    list, an object, a tensor: ``"temperature": [0.7]``), else None."""
    for c, v in fields.items():
        if not isinstance(v, (bool, int, float, str, np.generic)):
            shown = repr(v) if len(repr(v)) <= 60 else repr(v)[:57] + "..."
            return Issue("", 0, c, "bad_semantics", f"{c} must be a number, got {type(v).__name__} {shown}")
    return None


def _row_semantics(base: Semantics, fields: dict) -> Semantics | Issue:
    """``base.with_row(**fields)``, or an Issue (its location filled by the caller) naming
    the first bad field, fields checked one at a time in column order."""
    for c, v in fields.items():
        try:
            RAW.with_row(**{c: v})
        except InvalidSamplingParams as exc:
            return Issue("", 0, c, "bad_semantics", str(exc))
    return base.with_row(**fields)


def _rescore_row(rescore: RescoreFn, prompt: list, resp: list, stated: Semantics | None):
    """One rescoring: in the row's stated semantics when it states any (a model rescorer
    takes them; a plain callable only rows whose semantics are raw logprobs)."""
    if stated is None:
        return rescore(prompt, resp)
    if semantics_of(rescore) is not None:
        return rescore(prompt, resp, semantics=stated)  # type: ignore[call-arg]
    if stated != RAW:
        raise _NoSemantics(
            f"the row states {stated.describe()}, but the rescore callable takes "
            f"no logprob semantics: rescore with a model (--rescore MODEL, "
            f"ModelRescorer) or give trainer_logprobs"
        )
    return rescore(prompt, resp)


class _NoSemantics(Exception):
    """A row's stated semantics that a plain rescore callable cannot follow."""


def _rescored_row(
    raw: RawChunk, i: int, rescore: RescoreFn, stated: Semantics | None, offsets: tuple[np.ndarray, np.ndarray]
) -> np.ndarray | Issue:
    """Row ``i``'s rescored logprobs (float64), or the Issue that excludes it; a model that
    cannot rescore at all (RescoreModelError) is fatal, raised as it is."""
    p_off, r_off = offsets
    prompt = raw.values["prompt_ids"][p_off[i] : p_off[i + 1]]
    resp = raw.values["response_ids"][r_off[i] : r_off[i + 1]]

    def issue(kind: str, text: str) -> Issue:
        return Issue(raw.source, int(raw.lines[i]), "trainer_logprobs", kind, text, raw.unit)

    try:
        lp = np.asarray(_rescore_row(rescore, prompt.tolist(), resp.tolist(), stated))
    except RescoreModelError:
        raise  # the model cannot rescore at all: fatal, named once
    except _NoSemantics as exc:
        return issue("rescore_failed", str(exc))
    except Exception as exc:  # noqa: BLE001 - any rescoring failure names the sequence
        return issue("rescore_failed", f"rescoring failed: {type(exc).__name__}: {exc}")
    if lp.ndim != 1 or (lp.size and lp.dtype.kind not in "fiu"):
        return issue("bad_type", f"rescore returned shape {lp.shape} dtype {lp.dtype}")
    return lp.astype(np.float64)


def _rescore(
    raw: RawChunk, rescore: RescoreFn | None, bad: dict[int, Issue], stated: dict[int, Semantics] | None = None
) -> None:
    """Fill absent trainer_logprobs with ``rescore(prompt_ids, response_ids)`` (in place),
    in each row's ``stated`` semantics where it states them."""
    stated = stated or {}
    lens = raw.lengths.get("trainer_logprobs")
    if lens is None:
        lens = np.full(len(raw), -1, dtype=np.int64)
    need = [i for i in np.flatnonzero(lens < 0).tolist() if i not in bad]
    if not need or rescore is None:
        for i in need:
            bad[i] = Issue(
                raw.source,
                int(raw.lines[i]),
                "trainer_logprobs",
                "missing_column",
                "missing column 'trainer_logprobs' (give a rescore model to compute it)",
                raw.unit,
            )
        return
    p_lens = raw.lengths.get("prompt_ids")
    if p_lens is None:
        p_lens = np.full(len(raw), -1, dtype=np.int64)
    for i in [i for i in need if p_lens[i] < 0]:  # rescoring needs the prompt
        bad[i] = Issue(
            raw.source,
            int(raw.lines[i]),
            "prompt_ids",
            "missing_column",
            "missing column 'prompt_ids' (needed to rescore trainer_logprobs)",
            raw.unit,
        )
    need = [i for i in need if p_lens[i] >= 0]
    if not need:
        return
    old = raw.values.get("trainer_logprobs", np.empty(0, dtype=np.float64))
    old_off = offsets_from_lengths(lens)
    p_off = offsets_from_lengths(p_lens)
    r_off = offsets_from_lengths(raw.lengths["response_ids"])
    parts, new_lens = [], lens.copy()
    needed = set(need)
    for i in range(len(raw)):
        if i in needed:
            got = _rescored_row(raw, i, rescore, stated.get(i), (p_off, r_off))
            if isinstance(got, Issue):
                bad[i], new_lens[i] = got, -1
                continue
            parts.append(got)
            new_lens[i] = got.size
        elif lens[i] >= 0:
            seg = old[old_off[i] : old_off[i + 1]]
            # a row of non-numbers is excluded already (bad_type): keep its place only
            parts.append(seg if seg.dtype.kind in "fiu" else np.zeros(seg.size))
    raw.values["trainer_logprobs"] = np.concatenate(parts) if parts else np.empty(0, dtype=np.float64)
    raw.lengths["trainer_logprobs"] = new_lens


def _flag_values(raw: RawChunk, column: str, bad_tok: np.ndarray, kind: str, what: str, bad: dict[int, Issue]) -> None:
    """Flag every sequence holding a True in ``bad_tok`` (token level, column layout)."""
    if not bad_tok.any():
        return
    lens = raw.lengths[column]
    off = offsets_from_lengths(lens)
    pos = np.flatnonzero(bad_tok)
    seq = np.searchsorted(off, pos, side="right") - 1
    first_seq, first_idx = np.unique(seq, return_index=True)
    vals = raw.values[column]
    for s, k in zip(first_seq.tolist(), pos[first_idx].tolist()):
        if s in bad:
            continue
        bad[s] = Issue(
            raw.source, int(raw.lines[s]), column, kind, value_message(column, k - int(off[s]), vals[k], what), raw.unit
        )


def _flag_kinds(raw: RawChunk, column: str, bad: dict[int, Issue]) -> bool:
    """Flag the sequences holding a value of the wrong kind for ``column`` (one rule for
    every format, :func:`detsample.audit.inputs.values.kind_problems`); True when the column's
    values are numbers the later checks can compare."""
    v = raw.values.get(column)
    if v is None or not v.size:
        return False
    wrong, why = kind_problems(column, v)
    if wrong is not None:
        _flag_values(raw, column, wrong, "bad_type", why, bad)
    return v.dtype.kind in "biuf"


def validate(
    raw: RawChunk, rescore: RescoreFn | None = None, compare_dtype: str | None = None
) -> tuple[AuditBatch, list[Issue]]:
    """Check a parsed chunk; return its valid sequences and one issue per excluded one.
    With ``compare_dtype``, logprobs must also stay finite when rounded to it."""
    n = len(raw)
    bad: dict[int, Issue] = dict(raw.flagged)
    lengths = raw.lengths
    for c in ("response_ids", "engine_logprobs"):  # absent from the whole chunk: every row
        if c not in lengths:  # lacks it (missing_column, below)
            lengths[c] = np.full(n, -1, dtype=np.int64)
            raw.values[c] = np.empty(0, dtype=np.int64 if c == "response_ids" else np.float64)

    def issue(i: int, col: str, kind: str, msg: str) -> None:
        if i not in bad:
            bad[i] = Issue(raw.source, int(raw.lines[i]), col, kind, msg, raw.unit)

    for c in ("response_ids", "engine_logprobs"):  # prompt_ids: only to rescore (below)
        for i in np.flatnonzero(lengths[c] < 0).tolist():
            issue(i, c, "missing_column", f"missing column '{c}'")
    resp = lengths["response_ids"]
    numeric = {c: _flag_kinds(raw, c, bad) for c in ("prompt_ids", "response_ids")}

    def check_logprobs(c: str, kind: str = "count_mismatch") -> None:
        lens = lengths.get(c)
        if lens is None:
            return
        for i in np.flatnonzero((lens >= 0) & (lens != resp)).tolist():
            issue(i, c, kind, f"{lens[i]} values for {resp[i]} response_ids")
        numeric[c] = _flag_kinds(raw, c, bad)
        v = raw.values.get(c)
        if c == "mask" or not numeric[c]:
            return
        if v.dtype.kind == "f":
            _flag_values(raw, c, np.isnan(v), "nan", "NaN logprob", bad)
            _flag_values(raw, c, np.isinf(v), "non_finite", "infinite logprob", bad)
        _flag_values(raw, c, v > 0, "positive_logprob", "a logprob must be <= 0", bad)
        if compare_dtype is not None and v.dtype.kind == "f":
            with np.errstate(over="ignore"):
                out = np.isinf(v.astype(compare_dtype)) & np.isfinite(v)
            _flag_values(raw, c, out, "non_finite", f"out of the {compare_dtype} range", bad)

    check_logprobs("engine_logprobs")
    check_logprobs("mask", "ragged")
    _flag_kinds(raw, "trainer_logprobs", bad)
    stated = stated_semantics(raw, semantics_of(rescore) or RAW, bad)
    _rescore(raw, rescore, bad, stated)  # only for sequences still valid
    check_logprobs("trainer_logprobs")
    m = raw.values.get("mask")
    if numeric.get("mask") and m.dtype.kind != "b":
        _flag_values(raw, "mask", (m != 0) & (m != 1), "bad_mask", "mask must be 0 or 1", bad)
    for c in ("prompt_ids", "response_ids"):
        v = raw.values.get(c)
        if numeric[c] and v.dtype.kind in "if":
            _flag_values(raw, c, v < 0, "negative_token_id", "token ids must be >= 0", bad)
    return _gather(raw, bad), [bad[i] for i in sorted(bad)]


def _take(raw: RawChunk, column: str, keep: np.ndarray) -> np.ndarray:
    lens = raw.lengths[column]
    vals = raw.values[column]
    if keep.all() and (lens >= 0).all():
        return vals
    tok_keep = np.repeat(keep[lens >= 0], lens[lens >= 0])
    return vals[tok_keep]


def _gather(raw: RawChunk, bad: dict[int, Issue]) -> AuditBatch:
    n = len(raw)
    keep = np.ones(n, dtype=bool)
    if bad:
        keep[list(bad)] = False
    resp_len = raw.lengths["response_ids"]
    kept_len = np.where(keep, resp_len, 0)
    offsets = offsets_from_lengths(kept_len[keep])
    total = int(offsets[-1])
    if keep.any():
        response_ids = _take(raw, "response_ids", keep).astype(np.int64, copy=False)
        engine = _take(raw, "engine_logprobs", keep)
        trainer = _take(raw, "trainer_logprobs", keep)
        mlens = raw.lengths.get("mask")
        if mlens is None or not (mlens[keep] >= 0).any():
            mask = np.ones(total, dtype=bool)
        elif (mlens[keep] >= 0).all():
            mask = _take(raw, "mask", keep).astype(bool, copy=False)
        else:  # some kept sequences have a mask, others not (all tokens trained)
            present = _take(raw, "mask", keep & (mlens >= 0)).astype(bool)
            has = np.repeat((mlens >= 0)[keep], kept_len[keep])
            mask = np.ones(total, dtype=bool)
            mask[has] = present
    else:
        response_ids = np.empty(0, dtype=np.int64)
        engine = trainer = np.empty(0, dtype=np.float64)
        mask = np.empty(0, dtype=bool)
    if engine.dtype.kind != "f":
        engine = engine.astype(np.float64)
    if trainer.dtype.kind != "f":
        trainer = trainer.astype(np.float64)
    ids = [raw.ids[i] for i in np.flatnonzero(keep).tolist()] if bad else raw.ids
    return AuditBatch(raw.source, raw.unit, ids, raw.lines[keep], offsets, response_ids, engine, trainer, mask)
