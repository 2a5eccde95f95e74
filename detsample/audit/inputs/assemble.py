"""From a file's own columns to the audit's: rename, unpad, split (pure numpy, vectorised).

:func:`assemble` turns a :class:`~detsample.audit.inputs.table.TableChunk` (the file's columns)
into a :class:`~detsample.audit.inputs.table.RawChunk` (the audit's ragged columns), following a
:class:`~detsample.audit.inputs.layout.Resolved` layout:

1. **rename**: each canonical column takes its source (a product ``a*b`` of 0/1 columns
   is multiplied entry by entry);
2. **unpad** (padded layouts): each row keeps the window its padding mask gives: the
   attention mask when there is one (its 1s must form one run, at the start of the row for
   right padding, at the end for left padding; "auto" finds the side, the same for every
   row), else the loss mask (right padding: up to its last 1; left: from its first 1),
   else the whole row. The prompt's window comes from ``prompt_attention_mask`` or from
   the first P columns of an attention mask of width P + R;
3. **split** (``input_ids`` layouts): the prompt is the tokens before the last
   ``response_length`` ones, or up to the first token with mask 1 (per-token columns then
   describe token j + 1 at entry j).

A padded row and its ragged twin give the same :class:`RawChunk`, so validation and every
metric are the same (tested byte for byte on the JSON report). Structural contradictions
(a column of the wrong shape, a mask that is 1 on padding, padding on both sides) are
fatal :class:`~detsample.audit.issues.AuditInputError` naming the file, the column, the
layout and the row; bad values stay per-sequence issues, found by validation.
"""

from __future__ import annotations

import numpy as np

from detsample.audit.inputs.layout import LIST_COLUMNS, SEMANTICS_COLUMNS, Resolved
from detsample.audit.inputs.table import (
    Padded,
    PerRow,
    Ragged,
    RawChunk,
    TableChunk,
    ones_run,
    slice_rows,
    unpad,
    window_mask,
)
from detsample.audit.issues import AuditInputError, Issue

_RESPONSE_TOKEN_COLUMNS = ("engine_logprobs", "trainer_logprobs", "mask")
_MASKS = ("attention_mask", "prompt_attention_mask")


class _Ctx:
    """What error messages need: the file, the layout, the rows' locations."""

    def __init__(self, tc: TableChunk, res: Resolved) -> None:
        self.tc, self.res = tc, res

    def fail(self, dst: str, message: str, row: int | None = None) -> AuditInputError:
        where = "" if row is None else f"{self.tc.unit} {int(self.tc.lines[row])}: "
        return AuditInputError(f"{self.tc.source}: {where}{self.res.label(dst)}: {message}")


def assemble(tc: TableChunk, res: Resolved) -> RawChunk:
    """The audit's columns of one chunk (see the module docstring)."""
    ctx = _Ctx(tc, res)
    flagged = dict(tc.flagged)
    _flag_missing(tc, res, flagged)
    cols: dict[str, Padded | Ragged | PerRow] = {}
    for dst, spec in res.specs:
        if dst == "id":
            continue
        parts = [tc.cols.get(p) for p in spec.split("*")]
        if any(p is None for p in parts):
            continue
        cols[dst] = parts[0] if len(parts) == 1 else _product(ctx, dst, parts, flagged)
    padded = res.layout.padded
    if padded is None:
        padded = any(isinstance(c, Padded) for c in cols.values()) or any(m in cols for m in _MASKS)
    if padded:
        if res.split == "response_length":
            raise ctx.fail(
                "input_ids",
                "a layout split by response_length reads ragged rows; its per-token columns cannot be padded",
            )
        ragged = _unpad_all(ctx, cols, len(tc))
    else:
        ragged = {
            d: (
                Ragged(c.array.reshape(-1), np.full(len(tc), c.array.shape[1], np.int64))
                if isinstance(c, Padded)
                else c
            )
            for d, c in cols.items()
            if d not in _MASKS
        }
    if res.split == "response_length":
        _split_by_length(ctx, ragged, flagged)
    elif res.split == "first_mask":
        _split_at_first_mask(ragged)
    values, lengths = {}, {}
    for c in LIST_COLUMNS:
        col = ragged.get(c)
        if isinstance(col, Ragged):
            values[c], lengths[c] = col.values, col.lengths
    stated = {c: cols[c].values for c in SEMANTICS_COLUMNS if isinstance(cols.get(c), PerRow)}
    return RawChunk(tc.source, tc.unit, _ids(tc, res), tc.lines, values, lengths, flagged, stated)  # type: ignore[arg-type]


def _ids(tc: TableChunk, res: Resolved) -> list[str]:
    col = tc.cols.get(res.id_column) if res.id_column is not None else None
    if isinstance(col, PerRow):
        return list(col.values)  # type: ignore[arg-type]
    return [str(x) for x in tc.lines.tolist()]


def _flag_missing(tc: TableChunk, res: Resolved, flagged: dict[int, Issue]) -> None:
    """Rows lacking a required column (in the layout's order) are excluded and named."""
    n = len(tc)
    for c in res.required():
        for part in c.split("*"):
            col = tc.cols.get(part)
            if col is None:
                rows = np.arange(n)
            elif isinstance(col, Ragged):
                rows = np.flatnonzero(col.lengths < 0)
            elif isinstance(col, PerRow) and isinstance(col.values, np.ndarray):
                rows = np.flatnonzero(col.values < 0)
            else:
                continue
            for k in rows.tolist():
                if k not in flagged:
                    flagged[k] = Issue(
                        tc.source, int(tc.lines[k]), part, "missing_column", f"missing column '{part}'", tc.unit
                    )


def _product(ctx: _Ctx, dst: str, parts: list, flagged: dict[int, Issue]):
    """Entry-by-entry product of 0/1 columns (both padded, or both ragged)."""
    for p in parts:
        vals = p.array if isinstance(p, Padded) else getattr(p, "values", None)
        if isinstance(vals, np.ndarray) and vals.size and vals.dtype.kind not in "biuf":
            raise ctx.fail(dst, f"the factors of a mask product hold 0/1 numbers or booleans, got dtype {vals.dtype}")
    if all(isinstance(p, Padded) for p in parts):
        out = parts[0].array
        for p in parts[1:]:
            if p.array.shape != out.shape:
                raise ctx.fail(dst, f"the factors have shapes {out.shape} and {p.array.shape}")
            out = out * p.array
        return Padded(out)
    if not all(isinstance(p, Ragged) for p in parts):
        raise ctx.fail(dst, "cannot multiply a padded column with a ragged one")
    lens = parts[0].lengths
    same = np.ones(lens.size, dtype=bool)
    for p in parts[1:]:
        same &= p.lengths == lens
    for k in np.flatnonzero(~same & (lens >= 0)).tolist():
        flagged.setdefault(
            k,
            Issue(
                ctx.tc.source,
                int(ctx.tc.lines[k]),
                dst,
                "ragged",
                "the factors of the mask have different lengths",
                ctx.tc.unit,
            ),
        )
    counts = np.where(same, np.maximum(lens, 0), 0)
    zero = np.zeros_like(counts)
    out = slice_rows(parts[0].values, parts[0].lengths, zero, counts)
    for p in parts[1:]:
        out = out * slice_rows(p.values, p.lengths, zero, counts)
    return Ragged(out, np.where(same, lens, -1))


def _as_2d(ctx: _Ctx, dst: str, col) -> np.ndarray:
    """A per-token column of a padded layout as a 2-D array (lists must share one width)."""
    if isinstance(col, Padded):
        return col.array
    if isinstance(col, PerRow):
        raise ctx.fail(dst, "expected a per-token column, got one value per sequence")
    lens = col.lengths
    if lens.size == 0:
        return col.values.reshape(0, 0)
    absent = np.flatnonzero(lens < 0)
    if absent.size:
        raise ctx.fail(dst, "the row is missing from a padded column", int(absent[0]))
    odd = np.flatnonzero(lens != lens[0])
    if odd.size:
        raise ctx.fail(
            dst,
            f"padded rows must share one width: {int(lens[odd[0]])} entries, "
            f"row {int(ctx.tc.lines[0])} has {int(lens[0])}",
            int(odd[0]),
        )
    return col.values.reshape(lens.size, int(lens[0]))


def _check_01(ctx: _Ctx, dst: str, m: np.ndarray) -> None:
    if m.dtype.kind not in "biuf":
        raise ctx.fail(dst, f"padding masks hold 0/1 numbers or booleans, got dtype {m.dtype}")
    if m.dtype.kind == "b" or not m.size or (m.min() >= 0 and m.max() <= 1):
        return  # two reductions, no temporaries; the slow path only names the entry
    bad = (m != 0) & (m != 1)
    if bad.any():
        r, j = np.argwhere(bad)[0]
        raise ctx.fail(dst, f"padding masks hold 0/1, got {m[r, j].item()!r} at position {j}", int(r))


def _windows(ctx: _Ctx, dst: str, m: np.ndarray, side: str) -> tuple[np.ndarray, np.ndarray]:
    """(start, count) per row of the real tokens a padding mask marks, on ``side``."""
    _check_01(ctx, dst, m)
    width = m.shape[1]
    count, first, last, run = ones_run(m)
    right = run & ((first == 0) | (count == 0))
    left = run & ((last == width) | (count == 0))
    if side == "auto":
        side = "right" if right.all() else ("left" if left.all() else "")
    ok = right if side == "right" else left if side == "left" else right | left
    bad = np.flatnonzero(~ok)
    if bad.size:
        r = int(bad[0])
        where = f"real tokens at positions {first[r]}..{last[r] - 1} of {width}"
        if not run[r]:
            why = "its 1s are not one contiguous run (padding inside the row)"
        elif not (right[r] or left[r]):
            why = f"padded on both sides ({where})"
        else:
            why = f"not padded on the {side} as {ctx.res.layout.describe()} reads it ({where})"
        raise ctx.fail(dst, why, r)
    if not side:  # rows disagree: some left-padded, some right-padded
        r = int(np.flatnonzero(~right)[0])
        raise ctx.fail(
            dst,
            f"padded on the left here (row {int(ctx.tc.lines[np.flatnonzero(~left)[0]])} "
            f"is padded on the right): the side must be the same for every row",
            r,
        )
    starts = np.zeros_like(count) if side == "right" else width - count
    return starts, count


def _mask_windows(m: np.ndarray, side: str) -> tuple[np.ndarray, np.ndarray]:
    """Windows from a loss mask alone: right padding ends after its last 1, left padding
    starts at its first 1 (masked tokens past the last 1 are taken for padding)."""
    width = m.shape[1]
    count, first, last, _ = ones_run(m != 0)
    if side == "left":
        return np.where(count > 0, first, width), np.where(count > 0, width - first, 0)
    return np.zeros_like(last), last


def _check_mask_inside(ctx: _Ctx, mask: np.ndarray, kept: np.ndarray, keep: np.ndarray | None, by: str) -> None:
    """A loss mask may be 1 only where the padding mask says real token: its non-zero
    entries all lie inside the windows (``kept``: the mask's entries there)."""
    if keep is None or np.count_nonzero(mask) == np.count_nonzero(kept):
        return
    bad = (mask != 0) & ~keep
    if bad.any():
        r, j = np.argwhere(bad)[0]
        raise ctx.fail(
            "mask", f"is {mask[r, j].item()!r} at position {j}, which {ctx.res.label(by)} marks as padding", int(r)
        )


def _unpad_all(ctx: _Ctx, cols: dict, n: int) -> dict:
    """Ragged columns of a padded chunk."""
    res = ctx.res
    main = "input_ids" if res.split != "columns" else "response_ids"
    out: dict = {d: c for d, c in cols.items() if isinstance(c, PerRow)}
    if main not in cols:
        return out  # absent from the file: every row is excluded (missing_column)
    tokens = _as_2d(ctx, main, cols[main])
    width = tokens.shape[1]
    arrays = {d: _as_2d(ctx, d, c) for d, c in cols.items() if d != main and not isinstance(c, PerRow)}
    for d, a in arrays.items():
        if a.shape[0] != n:
            raise ctx.fail(d, f"has {a.shape[0]} rows, {res.label(main)} has {n}")
    prompt = arrays.get("prompt_ids")
    att, patt = _attention_masks(ctx, arrays, main, tokens.shape)
    per_token = width - 1 if res.split == "first_mask" else width
    mask = arrays.get("mask")
    if mask is not None and mask.size and mask.dtype.kind not in "biuf":
        raise ctx.fail(
            "mask", f"a padded mask holds 0/1 numbers or booleans (it gives the rows' windows), got dtype {mask.dtype}"
        )
    for d in _RESPONSE_TOKEN_COLUMNS:
        a = arrays.get(d)
        if a is not None and a.shape[1] != per_token:
            shift = " (one entry per token after the first)" if res.split == "first_mask" else ""
            raise ctx.fail(
                d,
                f"shape {a.shape} does not match {res.label(main)} {tokens.shape}; expected ({n}, {per_token}){shift}",
            )
    starts, counts = _response_windows(ctx, att, mask, n, width)
    keep = window_mask(width, starts, counts)
    out[main] = Ragged(unpad(tokens, keep), counts)
    tok_counts = np.maximum(counts - 1, 0) if res.split == "first_mask" else counts
    tok_keep = window_mask(per_token, starts, tok_counts)
    for d in _RESPONSE_TOKEN_COLUMNS:
        if d in arrays:
            out[d] = Ragged(unpad(arrays[d], tok_keep), tok_counts)
    if mask is not None and att is not None and res.spec("mask") != res.spec("attention_mask"):
        _check_mask_inside(ctx, mask, out["mask"].values, tok_keep, "attention_mask")
    if prompt is not None:
        out["prompt_ids"] = _unpad_prompt(ctx, prompt, patt)
    return out


def _attention_masks(ctx: _Ctx, arrays: dict, main: str, shape: tuple) -> tuple:
    """(response attention mask, prompt attention mask), either None: a prompt + response
    wide mask split at the prompt's width; a response mask of another width than the
    tokens' is a named failure."""
    res, width = ctx.res, shape[1]
    prompt = arrays.get("prompt_ids")
    att = arrays.get("attention_mask")
    patt = arrays.get("prompt_attention_mask")
    if (
        att is not None
        and res.split == "columns"
        and prompt is not None
        and att.shape[1] == prompt.shape[1] + width
        and att.shape[1] != width
    ):
        patt = att[:, : prompt.shape[1]] if patt is None else patt
        att = att[:, prompt.shape[1] :]
    if att is not None and att.shape[1] != width:
        want = (
            f"{width}"
            if prompt is None or res.split != "columns"
            else f"{width} (response) or {prompt.shape[1] + width} (prompt + response)"
        )
        raise ctx.fail(
            "attention_mask", f"shape {att.shape} does not match {res.label(main)} {shape}: expected width {want}"
        )
    return att, patt


def _response_windows(ctx: _Ctx, att, mask, n: int, width: int) -> tuple:
    """(starts, counts) of each row's response tokens: from the attention mask, else the
    mask, else the whole width."""
    side = ctx.res.layout.response_padding
    if att is not None:
        return _windows(ctx, "attention_mask", att, side)
    if mask is not None:
        starts, counts = _mask_windows(mask, side)
        if ctx.res.split == "first_mask":
            counts = np.where(counts > 0, counts + 1, 0)
        return starts, counts
    return np.zeros(n, np.int64), np.full(n, width, np.int64)


def _unpad_prompt(ctx: _Ctx, prompt: np.ndarray, patt) -> Ragged:
    """The prompts' ragged ids, windowed by their attention mask where there is one."""
    res = ctx.res
    if patt is None:
        return Ragged(unpad(prompt, None), np.full(prompt.shape[0], prompt.shape[1], np.int64))
    if patt.shape != prompt.shape:
        raise ctx.fail(
            "prompt_attention_mask", f"shape {patt.shape} does not match {res.label('prompt_ids')} {prompt.shape}"
        )
    p_starts, p_counts = _windows(ctx, "prompt_attention_mask", patt, res.layout.prompt_padding)
    return Ragged(unpad(prompt, window_mask(prompt.shape[1], p_starts, p_counts)), p_counts)


def _split_by_length(ctx: _Ctx, cols: dict, flagged: dict[int, Issue]) -> None:
    """prompt_ids / response_ids from input_ids and response_length (in place)."""
    inp = cols.get("input_ids")
    rl = cols.get("response_length")
    if not isinstance(inp, Ragged) or not isinstance(rl, PerRow):
        return
    total = inp.lengths
    want = np.asarray(rl.values, dtype=np.int64)
    ok = (total >= 0) & (want >= 0) & (want <= total)
    label = ctx.res.spec("response_length")
    for k in np.flatnonzero((total >= 0) & (want > total)).tolist():
        flagged.setdefault(
            k,
            Issue(
                ctx.tc.source,
                int(ctx.tc.lines[k]),
                str(label),
                "count_mismatch",
                f"response_length {int(want[k])} > {int(total[k])} tokens in '{ctx.res.spec('input_ids')}'",
                ctx.tc.unit,
            ),
        )
    p = np.where(ok, total - want, 0)
    r = np.where(ok, want, 0)
    cols["prompt_ids"] = Ragged(slice_rows(inp.values, total, np.zeros_like(p), p), np.where(ok, p, -1))
    cols["response_ids"] = Ragged(slice_rows(inp.values, total, p, r), np.where(ok, r, -1))


def _split_at_first_mask(cols: dict) -> None:
    """prompt_ids / response_ids from input_ids, cut after the token before the first
    mask 1; per-token columns (entry j = token j + 1) keep their entries from there."""
    inp, mask = cols.get("input_ids"), cols.get("mask")
    if not isinstance(inp, Ragged) or not isinstance(mask, Ragged):
        return
    total = inp.lengths
    mlen = mask.lengths
    first = np.maximum(mlen, 0).copy()
    numeric = mask.values.dtype.kind in "biuf"  # else validation excludes the rows (bad_type)
    nz = np.flatnonzero(mask.values != 0) if numeric else np.zeros(0, dtype=np.int64)
    if nz.size:
        off = np.zeros(mlen.size + 1, dtype=np.int64)
        np.cumsum(np.maximum(mlen, 0), out=off[1:])
        row = np.searchsorted(off, nz, side="right") - 1
        rows, idx = np.unique(row, return_index=True)
        first[rows] = nz[idx] - off[rows]
    ok = total >= 0
    p = np.where(ok, np.minimum(first + 1, np.maximum(total, 0)), 0)
    r = np.where(ok, np.maximum(total - first - 1, 0), 0)
    cols["prompt_ids"] = Ragged(slice_rows(inp.values, total, np.zeros_like(p), p), np.where(ok, p, -1))
    cols["response_ids"] = Ragged(slice_rows(inp.values, total, np.minimum(p, total.clip(0)), r), np.where(ok, r, -1))
    for d in _RESPONSE_TOKEN_COLUMNS:
        col = cols.get(d)
        if isinstance(col, Ragged):
            has = col.lengths >= 0
            start = np.where(has, np.minimum(first, np.maximum(col.lengths, 0)), 0)
            cnt = np.where(has, np.maximum(col.lengths - start, 0), 0)
            cols[d] = Ragged(slice_rows(col.values, col.lengths, start, cnt), np.where(has, cnt, -1))
