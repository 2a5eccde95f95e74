"""One rule for ids and values, whatever the file format (pure numpy, no I/O).

Every reader (JSONL, NPZ, Parquet, torch ``.pt``, in-memory records) hands its values to
the same rules, so the same value is accepted or rejected the same way in every format,
with the offending value in the message:

* an **id** is a string or an integer (bytes are decoded as UTF-8); a null id, a float,
  a bool or anything else excludes its sequence (``bad_type``, :func:`id_of`);
* a **token id** is an integer in the int64 range: a float, a bool, a string, a null or
  an integer outside [-2**63, 2**63) excludes its sequence (``bad_type``); a negative one
  is ``negative_token_id`` (validation);
* a **logprob** is a number (integers are widened to float64); a bool, a string or a null
  excludes its sequence (``bad_type``); NaN, infinities and values > 0 are validation's;
* a **mask** entry is 0/1 (integer or float) or a bool; a string or a null is
  ``bad_type``, another number ``bad_mask``;
* a **count** (``response_length``, an OpenAI ``usage.prompt_tokens``, an audit log's
  ``tokens``) is a non-negative integer, never a bool (:func:`count_of`);
* a **per-row semantics value** (``temperature``, ``top_k``, ``top_p``, ``min_p``,
  ``logprobs_mode``) is kept as the plain Python scalar it is (:func:`value_column`;
  null: not stated) and judged by the rule of a sampling option
  (:meth:`detsample.audit.semantics.Semantics.with_row`);
* a **metric** read back (an audit log's fractions, |d|, KL and ratios) is a number in
  its range, infinity spelt ``"inf"`` allowed, NaN refused (:func:`number_of`).

Lists read from records (JSONL lines, ``.pt`` records) go through :func:`column_array`,
typed columns (NPZ, Parquet, tensors) keep their dtype; :func:`kind_problems` then finds
the values of the wrong kind in either, one rule for both.
"""

from __future__ import annotations

import math

import numpy as np

from detsample.audit.inputs.layout import COLUMN_KINDS

INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1
OUT_OF_INT64 = "out of the int64 range"


def kind_words(column: str) -> str:
    """What a canonical column holds, for messages: "integers", "numbers", "0/1 or booleans"."""
    return {"iu": "integers", "fiu": "numbers", "bfiu": "0/1 or booleans"}[COLUMN_KINDS[column]]


def value_message(column: str, index: int, value: object, why: str) -> str:
    """How a bad value is named, in every format: ``response_ids[3] = 1.5 (why)``."""
    if isinstance(value, np.generic):
        value = value.item()
    return f"{column}[{index}] = {value!r:.60} ({why})"


def id_of(value: object) -> tuple[str | None, str | None]:
    """(the id as a string, None) or (None, why it is not an id)."""
    value = plain_scalar(value)
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8"), None
        except UnicodeDecodeError:
            return None, f"id must be a string or an integer, got bytes {value!r:.60}"
    if value is None:
        return None, "id is null (ids must be strings or integers)"
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        return None, f"id must be a string or an integer, got {value!r:.60}"
    return str(value), None


def count_of(v: object) -> tuple[int, str, str | None]:
    """A count (response_length, an OpenAI ``usage.prompt_tokens``, a log's tokens):
    (the count, "", None) for a non-negative integer, else (0, "bad_type", why). A bool
    is not a count (``True`` would be taken as 1), nor is a float or a string."""
    v = plain_scalar(v)
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
        return 0, "bad_type", f"must be an integer, got {v!r:.40}"
    if v < 0:
        return 0, "bad_type", f"must be >= 0, got {v}"
    return int(v), "", None


def number_of(v: object, lo: float = 0.0, hi: float = math.inf) -> tuple[float, str, str | None]:
    """A metric of a report or a log (a fraction, a |d|, a KL, a ratio quantile): (the
    value, "", None) for a number in [lo, hi], else (nan, "bad_type", why). Infinity may
    be spelt as JSON-safe reports spell it (the string "inf"); a bool, another string, a
    null and NaN are refused, so a gate never compares against a value nobody measured."""
    if isinstance(v, str) and v in ("inf", "-inf"):
        x = float(v)
    elif isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, float, np.integer, np.floating)):
        return math.nan, "bad_type", f"must be a number, got {v!r:.40}"
    else:
        try:
            x = float(v)
        except OverflowError:
            x = math.inf if v > 0 else -math.inf  # type: ignore[operator]
    if math.isnan(x):
        return math.nan, "bad_type", "must be a number, got NaN"
    if not lo <= x <= hi:
        return math.nan, "bad_type", f"must be in [{lo:g}, {hi:g}], got {v!r:.40}"
    return x, "", None


def plain_scalar(v: object) -> object:
    """A numpy / 0-d array scalar as the Python scalar it holds (str, int, float, bool);
    anything else as it is."""
    if isinstance(v, np.generic) or (hasattr(v, "ndim") and v.ndim == 0 and hasattr(v, "item")):
        return v.item()  # type: ignore[union-attr]
    return v


def value_column(values: object) -> np.ndarray:
    """A per-row value column (a list, or a 1-D array of any dtype) as an object array
    [S] of plain Python scalars (None: the row states no value)."""
    items = values.tolist() if isinstance(values, np.ndarray) else list(values)  # type: ignore
    out = np.empty(len(items), dtype=object)
    for k, x in enumerate(items):  # one by one: numpy would unpack a list held as a value
        out[k] = plain_scalar(x)
    return out


def column_array(column: str, v: object) -> tuple[np.ndarray | None, str, str | None]:
    """One record's list (or array) for canonical column ``column`` as a 1-D array, or
    (None, kind, problem): nested lists (``ragged``), a bool among numbers (numpy would
    read False as 0.0), an integer beyond int64 for a token id or beyond float64 for a
    logprob, a value of the wrong kind (:func:`kind_problems`, the rule typed columns
    follow too) (``bad_type``). Checked per record, so one bad record never changes the
    dtype, or the fate, of its neighbours."""
    kinds = COLUMN_KINDS[column]
    if isinstance(v, (list, tuple)):
        if "b" not in kinds:
            for j, x in enumerate(v):
                if x is True or x is False:
                    return None, "bad_type", value_message(column, j, x, f"values must be {kind_words(column)}")
        if v and kinds == "iu" and all(type(x) is int for x in v):  # Python ints: the range first
            for j, x in enumerate(v):
                if not INT64_MIN <= x <= INT64_MAX:
                    return None, "bad_type", value_message(column, j, x, OUT_OF_INT64)
            return np.array(v, dtype=np.int64), "", None
    try:
        a = np.asarray(v)
    except (ValueError, TypeError) as exc:  # ragged nested lists
        return None, "ragged", f"not a flat list of numbers ({exc})"
    if a.ndim != 1:
        return None, "ragged", f"must be a flat list, got {a.ndim} dimensions"
    if a.size == 0:
        empty = {"iu": np.int64, "fiu": np.float64, "bfiu": bool}[kinds]
        return a.astype(empty), "", None
    if a.dtype.kind == "O" and kinds == "fiu":
        items = a.tolist()
        if all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in items):
            try:  # big integers next to floats: numbers all the same
                return a.astype(np.float64), "", None
            except OverflowError:
                j = next(j for j, x in enumerate(items) if abs(x) > 1e308)
                return None, "bad_type", value_message(column, j, items[j], "out of the float64 range")
    if a.dtype.kind == "O" and kinds == "bfiu" and all(type(x) is int for x in a.tolist()):
        j = next(j for j, x in enumerate(a.tolist()) if x not in (0, 1))  # beyond int64
        return None, "bad_mask", value_message(column, j, a[j], "mask must be 0 or 1")
    wrong, why = kind_problems(column, a)  # one record at a time: never its neighbours
    if wrong is not None:
        j = int(np.argmax(wrong))
        if isinstance(v, (list, tuple)):  # name the list's own value (numpy may have cast it)
            j = next((k for k, x in enumerate(v) if not _of_kind(x, kinds)), j)
            return None, "bad_type", value_message(column, j, v[j], why)
        return None, "bad_type", value_message(column, j, a[j], why)
    if kinds == "fiu" and a.dtype.kind in "iu":
        return a.astype(np.float64), "", None
    return a, "", None


def kind_problems(column: str, v: np.ndarray) -> tuple[np.ndarray | None, str]:
    """Values of ``v`` (flat, column ``column``) of the wrong kind: (bool mask of the bad
    entries, why) or (None, "") when every value is of the column's kind. Token ids of an
    unsigned dtype must also fit int64."""
    kinds = COLUMN_KINDS[column]
    if not v.size:
        return None, ""
    if v.dtype.kind not in kinds:
        if v.dtype.kind == "O":  # only a record list mixing kinds gets here
            ok = np.array([_of_kind(x, kinds) for x in v.tolist()], dtype=bool)
            return (None, "") if ok.all() else (~ok, f"values must be {kind_words(column)}")
        return np.ones(v.size, dtype=bool), f"values must be {kind_words(column)}"
    if kinds == "iu" and v.dtype.kind == "u" and v.dtype.itemsize == 8:
        big = v > np.uint64(INT64_MAX)
        if big.any():
            return big, OUT_OF_INT64
    return None, ""


def _of_kind(x: object, kinds: str) -> bool:
    if isinstance(x, (bool, np.bool_)):
        return "b" in kinds
    if isinstance(x, (int, np.integer)):
        return True
    return isinstance(x, (float, np.floating)) and "f" in kinds
