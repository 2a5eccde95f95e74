"""Column containers that readers produce before the layout is applied, and the ragged /
padded index arithmetic they share (pure numpy, no I/O).

A reader turns a run of consecutive rows of a file into a :class:`TableChunk`: the file's
own columns, each :class:`Ragged` (flat values + per-row lengths), :class:`Padded` (a 2-D
array, one row per sequence) or :class:`PerRow` (one value per sequence).
:mod:`detsample.audit.inputs.assemble` then maps them onto the audit's columns, giving a
:class:`RawChunk`, which :mod:`detsample.audit.running.validate` checks.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from detsample.audit.issues import Issue


@dataclass
class RawChunk:
    """Consecutive sequences in the audit's own columns, as parsed (not yet validated).

    ids: S ids (str). lines: int64 [S] locations. values[c]: flat values of column c over
    the sequences that have it; lengths[c]: int64 [S], -1 where the sequence lacks c (a
    column absent from the whole chunk may be missing from both dicts).
    flagged: sequence index -> parse issue (those sequences are excluded).
    row_values[c]: object [S] of a per-row value column c (the stated logprob semantics,
    :data:`~detsample.audit.inputs.layout.SEMANTICS_COLUMNS`; None where a row states none).
    """

    source: str
    unit: str
    ids: list[str]
    lines: np.ndarray
    values: dict[str, np.ndarray]
    lengths: dict[str, np.ndarray]
    flagged: dict[int, Issue] = field(default_factory=dict)
    row_values: dict[str, np.ndarray] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.ids)


@dataclass
class Ragged:
    """values: flat [T]; lengths: int64 [n] (-1: the row lacks this column)."""

    values: np.ndarray
    lengths: np.ndarray


@dataclass
class Padded:
    """array: [n, W], row i is sequence i (padding positions hold anything)."""

    array: np.ndarray


@dataclass
class PerRow:
    """values: [n] (a numpy array, or a list for ids)."""

    values: object


Column = Ragged | Padded | PerRow


@dataclass
class TableChunk:
    """Consecutive rows of one file, its own column names, not yet mapped or validated.

    lines: int64 [n] locations (1-based JSONL lines, 0-based rows elsewhere);
    flagged: row -> parse issue (those rows are excluded)."""

    source: str
    unit: str
    lines: np.ndarray
    cols: dict[str, Column]
    flagged: dict[int, Issue] = field(default_factory=dict)

    def __len__(self) -> int:
        return int(self.lines.size)


def offsets_from_lengths(lengths: np.ndarray) -> np.ndarray:
    """int64 [S+1] offsets of S segments of ``lengths`` (a length < 0, an absent
    column, counts as 0)."""
    out = np.zeros(lengths.size + 1, dtype=np.int64)
    np.cumsum(np.maximum(lengths, 0), out=out[1:])
    return out


def slice_rows(values: np.ndarray, lengths: np.ndarray, starts: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Flat values of the per-row sub-slices ``row[starts[i] : starts[i] + counts[i]]``
    of a ragged column (rows with ``lengths < 0`` must have ``counts == 0``)."""
    counts = np.asarray(counts, dtype=np.int64)
    total = int(counts.sum())
    if total == values.size and total == int(np.maximum(lengths, 0).sum()):
        return values  # every row whole
    src = offsets_from_lengths(lengths)[:-1] + starts
    dst = offsets_from_lengths(counts)[:-1]
    idx = np.arange(total, dtype=np.int64) + np.repeat(src - dst, counts)
    return values[idx]


def window_mask(width: int, starts: np.ndarray, counts: np.ndarray) -> np.ndarray | None:
    """bool [n, width]: True on ``[starts[i], starts[i] + counts[i])``, or None when every
    row is whole (start 0, count width)."""
    if bool((counts == width).all()):
        return None
    col = np.arange(width, dtype=np.int64)
    if not starts.any():  # right padding: one compare
        return col < counts[:, None]
    return (col >= starts[:, None]) & (col < (starts + counts)[:, None])


def unpad(array: np.ndarray, keep: np.ndarray | None) -> np.ndarray:
    """The kept entries of a 2-D array in row-major order (a flat view when keep is None)."""
    if keep is None:
        return array.reshape(-1)
    return array[keep]


def ones_run(mask: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """For a 0/1 matrix [n, W] (bool or integers 0 and 1 only): (count of ones, first
    one, last one + 1, is one run).

    Rows without a one have first = last = 0 (every row of a width-0 matrix: an empty
    row is one run of no ones). ``is one run``: the ones are contiguous."""
    m = mask  # 0/1 (checked by the caller): argmax finds the first 1 without a bool copy
    n, w = m.shape
    count = np.count_nonzero(m, axis=1).astype(np.int64)
    if w == 0:  # argmax has no answer on an empty row
        zero = np.zeros(n, dtype=np.int64)
        return count, zero, zero.copy(), np.ones(n, dtype=bool)
    has = count > 0
    first = np.where(has, m.argmax(axis=1), 0).astype(np.int64)
    last = np.where(has, w - m[:, ::-1].argmax(axis=1), 0).astype(np.int64)
    return count, first, last, (last - first) == count


@dataclass
class AuditBatch:
    """Valid sequences of one chunk, with one shared offsets array.

    offsets: int64 [S+1]; response_ids: int64 [T]; engine, trainer: float [T] (their own
    dtypes, compared after promotion to a common dtype); mask: bool [T]; lines: int64 [S].
    """

    source: str
    unit: str
    ids: list[str]
    lines: np.ndarray
    offsets: np.ndarray
    response_ids: np.ndarray
    engine: np.ndarray
    trainer: np.ndarray
    mask: np.ndarray

    def __len__(self) -> int:
        return len(self.ids)
