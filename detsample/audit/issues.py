"""What the audit reports about bad input: a fatal :class:`AuditInputError` (the file
cannot be read as asked: file, column and layout named) or one :class:`Issue` per
excluded sequence (location, field, kind, message)."""

from __future__ import annotations

from dataclasses import dataclass

from detsample.inputs import InputError, input_file


class AuditInputError(InputError):
    """An audit input is malformed (file, line/row and field named)."""


def audit_file(path: str) -> str:
    """``path`` when it is a regular file (:func:`detsample.inputs.input_file`: a FIFO, a
    device or a directory is refused before it is opened), else an AuditInputError."""
    try:
        return input_file(path)
    except InputError as exc:
        raise AuditInputError(str(exc)) from None


@dataclass(frozen=True)
class Issue:
    """One rejected sequence: where it is, which field, what is wrong."""

    source: str
    line: int
    field: str
    kind: str
    message: str
    unit: str = "line"  # "line" (1-based, JSONL) or "row" (0-based, NPZ/Parquet/records)

    def __str__(self) -> str:
        return f"{self.source}:{self.unit} {self.line}: {self.field}: {self.message}"

    def to_json(self) -> dict:
        return {
            "source": self.source,
            self.unit: self.line,
            "field": self.field,
            "kind": self.kind,
            "message": self.message,
        }
