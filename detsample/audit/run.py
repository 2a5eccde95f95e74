"""The audit driver: plan shards, read, validate and accumulate them, merge, gate.

The public names are re-exported by :mod:`detsample.audit`.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from multiprocessing import get_context
from typing import Literal

from detsample.audit.readers import (DEFAULT_CHUNK_TOKENS, AuditInputError, Issue, NpzSource,
                               ParquetSource, detect_format, iter_jsonl_chunks,
                               iter_record_chunks, split_jsonl)
from detsample.audit.metrics import COMPARE_DTYPES, AuditAccumulator
from detsample.audit.validate import RescoreFn, validate

__all__ = ["AuditInputError", "AuditOptions", "Issue", "Shard", "audit", "audit_accumulator",
           "check_gates", "plan_shards", "to_json"]

#: the named rescorers (``rescore="refmodel"``: the bundled reference model)
RESCORERS = ("refmodel",)
Rescore = RescoreFn | Literal["refmodel"] | None
JSONL_PARSERS = ("auto", "python")


@dataclass(frozen=True)
class AuditOptions:
    """How an audit reads, validates and compares (validated at construction).

    rescore: None, a callable ``(prompt_ids, response_ids) -> logprobs`` used for
    sequences without trainer_logprobs, or a name of :data:`RESCORERS`. strict: raise
    :class:`AuditInputError` at the first bad sequence instead of excluding it.
    chunk_tokens: tokens per chunk (memory bound; never changes the report).
    jsonl_parser: "auto" (pyarrow blocks, :mod:`json` for blocks with bad lines) or
    "python" (:mod:`json` only). compare_dtype: None (the promoted dtype of the two
    columns) or a dtype both logprobs are rounded to first.
    """

    rescore: Rescore = None
    strict: bool = False
    chunk_tokens: int = DEFAULT_CHUNK_TOKENS
    jsonl_parser: str = "auto"
    compare_dtype: str | None = None

    def __post_init__(self) -> None:
        r = self.rescore
        if not (r is None or callable(r) or (isinstance(r, str) and r in RESCORERS)):
            raise ValueError(f"rescore must be a callable, one of {RESCORERS} or None, "
                             f"got {r!r}")
        if isinstance(self.chunk_tokens, bool) or not isinstance(self.chunk_tokens, int) \
                or self.chunk_tokens < 1:
            raise ValueError(f"chunk_tokens must be an integer >= 1, got {self.chunk_tokens!r}")
        if self.jsonl_parser not in JSONL_PARSERS:
            raise ValueError(f"jsonl_parser must be one of {JSONL_PARSERS}, "
                             f"got {self.jsonl_parser!r}")
        if self.compare_dtype not in COMPARE_DTYPES:
            raise ValueError(f"compare_dtype must be one of {COMPARE_DTYPES}, "
                             f"got {self.compare_dtype!r}")

    def rescorer(self) -> RescoreFn | None:
        """The rescoring callable (a named rescorer is built here, in the worker)."""
        if isinstance(self.rescore, str):  # "refmodel", the one name
            from detsample.audit.rescore import refmodel_rescorer

            return refmodel_rescorer()
        return self.rescore


@dataclass(frozen=True)
class Shard:
    """A contiguous piece of one input file: JSONL bytes [start, stop) starting at line
    ``first_line``; NPZ rows [start, stop); Parquet row groups [start, stop)."""

    fmt: str
    path: str
    start: int
    stop: int
    first_line: int = 1


def plan_shards(paths: list[str], parts: int) -> list[Shard]:
    """Split every file into at most ``parts`` contiguous shards, in file order."""
    shards: list[Shard] = []
    for path in paths:
        path = os.fspath(path)
        if not os.path.exists(path):
            raise AuditInputError(f"{path}: no such file")
        fmt = detect_format(path)
        if fmt == "jsonl":
            shards += [Shard(fmt, path, a, b, line) for a, b, line in split_jsonl(path, parts)]
            continue
        if fmt == "npz":  # shards of rows
            src = NpzSource(path)
            n = src.num_sequences
            src.close()
        else:  # shards of row groups
            n = len(ParquetSource(path).row_group_rows)
        cuts = sorted({n * k // parts for k in range(parts + 1)})
        shards += [Shard(fmt, path, a, b) for a, b in zip(cuts[:-1], cuts[1:])] or \
            [Shard(fmt, path, 0, 0)]
    return shards


def _consume(acc: AuditAccumulator, chunks: Iterable, rescore: RescoreFn | None,
             strict: bool) -> None:
    for raw in chunks:
        acc.add_source(raw.source)
        batch, issues = validate(raw, rescore, acc.compare_dtype)
        if issues and strict:
            raise AuditInputError(f"{issues[0]} (--strict)")
        acc.add_issues(issues)
        acc.update(batch)


def _shard_chunks(shard: Shard, opts: AuditOptions) -> Iterable:
    if shard.fmt == "jsonl":
        yield from iter_jsonl_chunks(shard.path, shard.start, shard.stop, shard.first_line,
                                     opts.chunk_tokens, opts.jsonl_parser)
    elif shard.fmt == "npz":
        src = NpzSource(shard.path)
        try:
            yield from src.iter_chunks(shard.start, shard.stop, opts.chunk_tokens)
        finally:
            src.close()
    else:
        src = ParquetSource(shard.path)
        yield from src.iter_chunks(list(range(shard.start, shard.stop)),
                                   chunk_rows=max(opts.chunk_tokens // 256, 64))


def run_shard(shard: Shard, options: AuditOptions = AuditOptions()) -> AuditAccumulator:
    """Audit one shard (runs in a worker process when ``workers > 1``)."""
    acc = AuditAccumulator(options.compare_dtype)
    acc.add_source(shard.path)
    _consume(acc, _shard_chunks(shard, options), options.rescorer(), options.strict)
    return acc


def _is_paths(source: object) -> bool:
    if isinstance(source, (str, os.PathLike)):
        return True
    return isinstance(source, (list, tuple)) and bool(source) and all(
        isinstance(s, (str, os.PathLike)) for s in source)


def audit_accumulator(source: object, *, workers: int = 1,
                      options: AuditOptions | None = None, **option_fields) -> AuditAccumulator:
    """Like :func:`audit` but returns the merged accumulator (for custom reports).
    ``options`` (an :class:`AuditOptions`) or its fields as keywords, not both."""
    if options is None:
        options = AuditOptions(**option_fields)
    elif option_fields:
        raise ValueError(f"pass options or {sorted(option_fields)}, not both")
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ValueError(f"workers must be an integer >= 1, got {workers!r}")
    if not _is_paths(source):
        acc = AuditAccumulator(options.compare_dtype)
        _consume(acc, iter_record_chunks(source, chunk_tokens=options.chunk_tokens),  # type: ignore[arg-type]
                 options.rescorer(), options.strict)
        return acc
    paths = [source] if isinstance(source, (str, os.PathLike)) else list(source)
    shards = plan_shards([os.fspath(p) for p in paths], workers)
    total = AuditAccumulator(options.compare_dtype)
    if workers == 1 or len(shards) == 1:
        for shard in shards:
            total.merge(run_shard(shard, options))
        return total
    if callable(options.rescore):
        try:
            import pickle

            pickle.dumps(options.rescore)
        except Exception as exc:  # noqa: BLE001
            raise ValueError(f"rescore must be picklable to use workers > 1 ({exc})") from exc
    with ProcessPoolExecutor(max_workers=workers, mp_context=get_context("spawn")) as pool:
        futures = [pool.submit(run_shard, s, options) for s in shards]
        for fut in futures:  # merged in file order
            total.merge(fut.result())
    return total


def audit(source: object, *, rescore: Rescore = None, strict: bool = False, workers: int = 1,
          chunk_tokens: int = DEFAULT_CHUNK_TOKENS, jsonl_parser: str = "auto",
          compare_dtype: str | None = None) -> dict:
    """Audit engine vs trainer logprobs and return the report (a JSON-ready dict).

    source: a path (.jsonl/.npz/.parquet), a list of paths, or an iterable of records
    (mappings with id, prompt_ids, response_ids, engine_logprobs and optionally
    trainer_logprobs and mask). workers: processes for file inputs; the report is
    identical for every value. The other arguments are the fields of
    :class:`AuditOptions` (rescore, strict, chunk_tokens, jsonl_parser, compare_dtype);
    e.g. compare_dtype="float32" rounds both logprobs to float32 first, for one side
    that wrote float32 values as short decimals and the other as float64 decimals.
    """
    options = AuditOptions(rescore=rescore, strict=strict, chunk_tokens=chunk_tokens,
                           jsonl_parser=jsonl_parser, compare_dtype=compare_dtype)
    return audit_accumulator(source, workers=workers, options=options).report()


def _jsonable(x: object) -> object:
    if isinstance(x, float) and not math.isfinite(x):
        return "nan" if math.isnan(x) else ("inf" if x > 0 else "-inf")
    if isinstance(x, dict):
        return {k: _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    return x


def to_json(report: dict) -> str:
    """Deterministic JSON text of a report (non-finite floats as "inf"/"-inf" strings)."""
    return json.dumps(_jsonable(report), indent=2, allow_nan=False) + "\n"


def check_gates(report: dict, max_abs_diff: float | None = None,
                min_exact_match: float | None = None) -> list[str]:
    """Failed gates, each naming its metric; empty when every gate passes."""
    failures = []
    if max_abs_diff is not None:
        v = report["max_abs_diff"]
        if v is None:
            failures.append("max_abs_diff: no tokens audited")
        elif not v <= max_abs_diff:
            failures.append(f"max_abs_diff = {v!r} > {max_abs_diff!r}")
    if min_exact_match is not None:
        v = report["exact_match_fraction"]
        if v is None:
            failures.append("exact_match_fraction: no tokens audited")
        elif not v >= min_exact_match:
            failures.append(f"exact_match_fraction = {v!r} < {min_exact_match!r}")
    return failures

