"""torch ``.pt`` audit inputs, loaded with ``torch.load(weights_only=True, mmap=True)``:
only tensors, lists, dicts, strings and numbers are read, never arbitrary objects.

Two shapes of file:

* a dict of columns (what ``torch.save({k: batch[k] ...})`` writes from a training step):
  a 2-D tensor is a padded per-token column [S, W]; a list of 1-D tensors or lists is a
  ragged per-token column; a 1-D tensor or a list of numbers / strings is a per-sequence
  column (``id``, ``response_length``);
* records: a list of dicts, or a dict whose ``"samples"`` entry is one (slime's debug
  dumps), one dict per sequence.

bfloat16 tensors are widened to float32 (exactly); the other dtypes are kept.
"""

from __future__ import annotations

import pickle
import re
from collections.abc import Iterator, Mapping

import numpy as np

from detsample.audit.inputs.layout import COLUMN_KINDS, ROLES, Resolved
from detsample.audit.inputs.readers import DEFAULT_CHUNK_TOKENS, ids_column, iter_record_chunks
from detsample.audit.inputs.source import Source
from detsample.audit.inputs.table import Padded, PerRow, Ragged, TableChunk
from detsample.audit.inputs.values import column_array, count_of, kind_words, value_column
from detsample.audit.issues import AuditInputError, Issue


def to_numpy(t) -> np.ndarray:
    """A tensor (any device) as a numpy array; bfloat16 widened to float32 (exact). Only
    for tensors :func:`tensor_problem` accepts (the file's were checked at load)."""
    import torch

    if t.dtype == torch.bfloat16:
        t = t.float()
    return t.detach().cpu().numpy()


#: what the audit reads from a tensor
READABLE = "dense tensors of a bool, integer or float dtype"


def tensor_problem(t) -> str | None:
    """Why tensor ``t`` cannot be read as audit values (a nested, sparse, quantized or
    meta tensor; a dtype numpy has no twin of, like float8 or complex), or None."""
    import torch

    if t.is_nested:
        return "a nested tensor"
    if t.layout != torch.strided:
        return f"a {str(t.layout).removeprefix('torch.')} tensor"
    if t.is_quantized:
        return f"a quantized tensor ({t.dtype})"
    if t.device.type == "meta":
        return "a meta tensor (it holds no values)"
    if t.dtype not in _readable_dtypes():
        return f"a tensor of dtype {t.dtype}"
    return None


def _readable_dtypes() -> frozenset:
    import torch

    names = (
        "bool",
        "uint8",
        "uint16",
        "uint32",
        "uint64",
        "int8",
        "int16",
        "int32",
        "int64",
        "float16",
        "bfloat16",
        "float32",
        "float64",
    )
    return frozenset(getattr(torch, n) for n in names if hasattr(torch, n))


def unreadable_tensor(path: str, obj: object) -> str | None:
    """The first tensor anywhere in the loaded ``obj`` (dicts, lists and tuples walked,
    without recursion) that :func:`tensor_problem` refuses, as a message naming the file
    and where the tensor sits (``samples[3]['engine_logprobs']``); None when all are
    readable."""
    import torch

    stack: list[tuple[str, object]] = [("", obj)]
    while stack:
        where, v = stack.pop()
        if isinstance(v, torch.Tensor):
            problem = tensor_problem(v)
            if problem:
                return f"{path}: {where or 'the file'}: {problem}; the audit reads {READABLE}"
        elif isinstance(v, Mapping):
            stack.extend((f"{where}[{k!r}]", x) for k, x in reversed(list(v.items())))
        elif isinstance(v, (list, tuple)) and not set(map(type, v)) <= _SCALARS:
            stack.extend(
                (f"{where}[{k}]", x)
                for k, x in reversed(list(enumerate(v)))
                if isinstance(x, (torch.Tensor, Mapping, list, tuple))
            )
    return None


#: the types a list of values holds when nothing inside it needs walking (a fast path:
#: ``set(map(type, v))`` runs in C, a Mapping check per element does not)
_SCALARS = frozenset({int, float, str, bool, bytes, type(None)})


_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_GLOBAL = re.compile(r"GLOBAL ([\w.]+)")


def refusal_message(path: str, exc: BaseException) -> str:
    """Why ``torch.load(path, weights_only=True)`` refused, in one sentence: the Python
    globals the file would need (a weights-only load never runs them), else the first
    line of torch's reason, without its terminal colour codes."""
    import torch

    needed: list[str] = []
    if isinstance(exc, pickle.UnpicklingError):
        try:
            needed = sorted(set(torch.serialization.get_unsafe_globals_in_checkpoint(path)))
        except Exception:  # noqa: BLE001 - not a zip checkpoint: read torch's message
            needed = sorted(set(_GLOBAL.findall(_ANSI.sub("", str(exc)))))
    if needed:
        return (
            f"{path}: refused: loading it would run the Python global(s) "
            f"{', '.join(needed)}, which a weights_only load never does; the audit reads "
            f"tensors, lists, dicts, strings and numbers only (save the columns as tensors "
            f"or lists, docs/audit.md)"
        )
    lines = [ln.strip() for ln in _ANSI.sub("", str(exc)).splitlines() if ln.strip()]
    boiler = ("Weights only load failed", "Please file an issue", "Check the documentation")
    why = next((ln for ln in lines if not ln.startswith(boiler)), lines[0] if lines else type(exc).__name__)
    return f"{path}: not a readable torch file with weights_only=True ({type(exc).__name__}: {why})"


def _plain(v: object) -> object:
    """Tensors inside a record as numpy arrays; everything else unchanged."""
    import torch

    return to_numpy(v) if isinstance(v, torch.Tensor) else v


class TorchSource(Source):
    """A ``.pt`` audit input (columns or records), checked at :meth:`bind`."""

    def __init__(self, path: str) -> None:
        import torch

        self.path = str(path)
        try:
            try:
                obj = torch.load(self.path, map_location="cpu", weights_only=True, mmap=True)
            except RuntimeError as exc:  # a legacy (non-zip) file cannot be mapped: load it
                if "mmap" not in str(exc):
                    raise
                obj = torch.load(self.path, map_location="cpu", weights_only=True)
        except (
            pickle.UnpicklingError,
            RuntimeError,
            OSError,
            EOFError,
            ValueError,
            KeyError,
            TypeError,
            AttributeError,
            IndexError,
            UnicodeDecodeError,
            RecursionError,
            NotImplementedError,
        ) as exc:
            raise AuditInputError(refusal_message(self.path, exc)) from exc
        problem = unreadable_tensor(self.path, obj)
        if problem:
            raise AuditInputError(problem)
        if isinstance(obj, Mapping) and isinstance(obj.get("samples"), list):
            obj = obj["samples"]
        self.records: list | None = None
        self.data: dict = {}
        if isinstance(obj, list) and obj and not any(isinstance(r, Mapping) for r in obj):
            kinds = sorted({type(r).__name__ for r in obj})
            raise AuditInputError(
                f"{self.path}: expected a dict of columns or a list of "
                f"records (dicts), got a list of {', '.join(kinds)}"
            )
        if isinstance(obj, list):
            self.records = obj
            self.num_sequences = len(obj)
        elif isinstance(obj, Mapping):
            self.data = dict(obj)
            self.num_sequences = 0
        else:
            raise AuditInputError(
                f"{self.path}: expected a dict of columns or a list of records, got {type(obj).__name__}"
            )
        self.resolved: Resolved | None = None

    def columns(self) -> list[str]:
        if self.records is not None:
            first = next((r for r in self.records if isinstance(r, Mapping)), {})
            return [str(k) for k in first]
        return [str(k) for k in self.data]

    def bind(self, resolved: Resolved) -> TorchSource:
        """Check the columns ``resolved`` reads (fatal errors name file and column)."""
        import torch

        self.resolved = resolved
        if self.records is not None:
            return self
        rows: dict[str, int] = {}
        id_col = resolved.id_column
        if id_col is not None and id_col not in self.data:
            raise AuditInputError(f"{self.path}: missing column '{id_col}'")
        for c, dst in ([(id_col, "id")] if id_col else []) + list(resolved.wants()):
            if c not in self.data or (dst != "id" and c == id_col):
                continue
            v = self.data[c]
            if isinstance(v, torch.Tensor):
                want = 1 if ROLES[dst] in ("row", "value") else 2
                if v.dim() != want:
                    what = (
                        "one value per sequence (1-D)" if want == 1 else "a padded 2-D tensor, or a list of 1-D tensors"
                    )
                    raise AuditInputError(f"{self.path}: {c}: expected {what}, got shape {tuple(v.shape)}")
                kind = np.dtype(to_numpy(v[:0]).dtype).kind
                if ROLES[dst] == "row" and dst in COLUMN_KINDS and kind not in COLUMN_KINDS[dst]:
                    raise AuditInputError(f"{self.path}: {c}: values must be {kind_words(dst)}, got dtype {v.dtype}")
                rows[c] = int(v.shape[0])
            elif isinstance(v, (list, tuple)):
                rows[c] = len(v)
            else:
                raise AuditInputError(f"{self.path}: {c}: expected a tensor or a list, got {type(v).__name__}")
        if not rows:
            raise AuditInputError(f"{self.path}: none of the columns {resolved.layout.describe()} reads is in the file")
        first = id_col if id_col is not None else next(iter(rows))
        self.num_sequences = rows[first]
        for c, n in rows.items():
            if n != self.num_sequences:
                raise AuditInputError(
                    f"{self.path}: column '{c}' has {n} rows, '{first}' has "
                    f"{self.num_sequences} ({resolved.layout.describe()})"
                )
        return self

    def iter_chunks(
        self, start: int = 0, stop: int | None = None, chunk_tokens: int = DEFAULT_CHUNK_TOKENS
    ) -> Iterator[TableChunk]:
        """Chunks of sequences [start, stop) (0-based rows)."""
        assert self.resolved is not None
        stop = self.num_sequences if stop is None else stop
        if self.records is not None:
            wanted = {c for c, _ in self.resolved.wants()} | {self.resolved.id_column}
            recs = (
                {k: _plain(v) for k, v in r.items() if k in wanted} if isinstance(r, Mapping) else r
                for r in self.records[start:stop]
            )
            yield from iter_record_chunks(recs, self.resolved, self.path, chunk_tokens, start)
            return
        width = max(
            [
                self.data[c].shape[1]
                for c, _ in self.resolved.wants()
                if c in self.data and getattr(self.data[c], "dim", lambda: 0)() == 2
            ]
            or [64]
        )
        step = max(chunk_tokens // width, 1)
        for i in range(start, stop, step):
            yield self._chunk(i, min(i + step, stop))

    def _chunk(self, i: int, j: int) -> TableChunk:
        import torch

        assert self.resolved is not None
        cols: dict = {}
        lines = np.arange(i, j, dtype=np.int64)
        flagged: dict[int, Issue] = {}
        id_col = self.resolved.id_column
        if id_col is not None:
            v = self.data[id_col]
            vals = to_numpy(v[i:j]).tolist() if isinstance(v, torch.Tensor) else list(v[i:j])
            cols[id_col] = PerRow(ids_column(vals, id_col, self.path, "row", lines, flagged))
        for c, dst in self.resolved.wants():
            if c == id_col or c not in self.data:
                continue
            v = self.data[c]
            if ROLES[dst] == "value":  # a tensor [S] or a list of scalars
                vals = to_numpy(v[i:j]) if isinstance(v, torch.Tensor) else [_plain(x) for x in v[i:j]]
                cols[c] = PerRow(value_column(vals))
            elif isinstance(v, torch.Tensor):
                a = to_numpy(v[i:j])
                cols[c] = PerRow(a.astype(np.int64)) if ROLES[dst] == "row" else Padded(a)
            elif ROLES[dst] == "row":
                cols[c] = PerRow(_counts(self.path, c, v[i:j], lines, flagged))
            else:
                cols[c] = _ragged(self.path, c, dst, v[i:j], lines, flagged)
        return TableChunk(self.path, "row", lines, cols, flagged)


def _counts(path: str, c: str, items: list, lines: np.ndarray, flagged: dict[int, Issue]) -> np.ndarray:
    """A per-row count column from a list (None: absent, -1); a value that is not a
    non-negative integer excludes its row (the rule JSONL records follow)."""
    out = np.full(len(items), -1, dtype=np.int64)
    for k, x in enumerate(items):
        if x is None:
            continue
        n, kind, problem = count_of(_plain(x))
        if problem:
            flagged.setdefault(k, Issue(path, int(lines[k]), c, kind, problem, "row"))
        else:
            out[k] = n
    return out


def _ragged(path: str, c: str, dst: str, items: list, lines: np.ndarray, flagged: dict[int, Issue]) -> Ragged:
    """A ragged column from a list of 1-D tensors / lists / None (absent). Each row goes
    through :func:`detsample.audit.inputs.values.column_array`, the rule of every format: a row
    of the wrong shape or kind is excluded and named (``flagged``), its neighbours read."""
    parts, lens = [], []
    for k, x in enumerate(items):
        if x is None:
            lens.append(-1)
            continue
        a, kind, problem = column_array(dst, _plain(x) if not isinstance(x, (list, tuple)) else [_plain(e) for e in x])
        if problem:
            flagged.setdefault(k, Issue(path, int(lines[k]), c, kind, problem, "row"))
            lens.append(-1)
            continue
        parts.append(a)
        lens.append(a.size)
    values = np.concatenate(parts) if parts else np.empty(0, dtype=np.float64)
    return Ragged(values, np.asarray(lens, dtype=np.int64))
