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

from detsample.audit.readers import (DEFAULT_CHUNK_TOKENS, AuditInputError, Issue, NpzSource,
                               ParquetSource, detect_format, iter_jsonl_chunks,
                               iter_record_chunks, split_jsonl)
from detsample.audit.metrics import AuditAccumulator
from detsample.audit.validate import RescoreFn, validate

__all__ = ["AuditInputError", "Issue", "Shard", "audit", "audit_accumulator", "check_gates",
           "plan_shards", "to_json"]

Rescore = RescoreFn | str | None


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


def _resolve_rescore(rescore: Rescore) -> RescoreFn | None:
    if rescore is None or callable(rescore):
        return rescore
    if rescore == "refmodel":
        from detsample.audit.rescore import refmodel_rescorer

        return refmodel_rescorer()
    raise ValueError(f"rescore must be a callable, 'refmodel' or None, got {rescore!r}")


def _consume(acc: AuditAccumulator, chunks: Iterable, rescore: RescoreFn | None,
             strict: bool) -> None:
    for raw in chunks:
        acc.add_source(raw.source)
        batch, issues = validate(raw, rescore, acc.compare_dtype)
        if issues and strict:
            raise AuditInputError(f"{issues[0]} (--strict)")
        acc.add_issues(issues)
        acc.update(batch)


def _shard_chunks(shard: Shard, chunk_tokens: int, jsonl_parser: str) -> Iterable:
    if shard.fmt == "jsonl":
        yield from iter_jsonl_chunks(shard.path, shard.start, shard.stop, shard.first_line,
                                     chunk_tokens, jsonl_parser)
    elif shard.fmt == "npz":
        src = NpzSource(shard.path)
        try:
            yield from src.iter_chunks(shard.start, shard.stop, chunk_tokens)
        finally:
            src.close()
    else:
        src = ParquetSource(shard.path)
        yield from src.iter_chunks(list(range(shard.start, shard.stop)),
                                   chunk_rows=max(chunk_tokens // 256, 64))


def run_shard(shard: Shard, rescore: Rescore = None, strict: bool = False,
              chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
              jsonl_parser: str = "auto", compare_dtype: str | None = None) -> AuditAccumulator:
    """Audit one shard (runs in a worker process when ``workers > 1``)."""
    acc = AuditAccumulator(compare_dtype)
    acc.add_source(shard.path)
    _consume(acc, _shard_chunks(shard, chunk_tokens, jsonl_parser), _resolve_rescore(rescore),
             strict)
    return acc


def _is_paths(source: object) -> bool:
    if isinstance(source, (str, os.PathLike)):
        return True
    return isinstance(source, (list, tuple)) and bool(source) and all(
        isinstance(s, (str, os.PathLike)) for s in source)


def audit_accumulator(source: object, *, rescore: Rescore = None, strict: bool = False,
                      workers: int = 1, chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
                      jsonl_parser: str = "auto",
                      compare_dtype: str | None = None) -> AuditAccumulator:
    """Like :func:`audit` but returns the merged accumulator (for custom reports)."""
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    if chunk_tokens < 1:
        raise ValueError(f"chunk_tokens must be >= 1, got {chunk_tokens}")
    if not _is_paths(source):
        acc = AuditAccumulator(compare_dtype)
        _consume(acc, iter_record_chunks(source, chunk_tokens=chunk_tokens),  # type: ignore[arg-type]
                 _resolve_rescore(rescore), strict)
        return acc
    paths = [source] if isinstance(source, (str, os.PathLike)) else list(source)
    shards = plan_shards([os.fspath(p) for p in paths], workers)
    total = AuditAccumulator(compare_dtype)
    if workers == 1 or len(shards) == 1:
        for shard in shards:
            total.merge(run_shard(shard, rescore, strict, chunk_tokens, jsonl_parser,
                                  compare_dtype))
        return total
    if rescore is not None and not isinstance(rescore, str):
        try:
            import pickle

            pickle.dumps(rescore)
        except Exception as exc:  # noqa: BLE001
            raise ValueError(f"rescore must be picklable to use workers > 1 ({exc})") from exc
    with ProcessPoolExecutor(max_workers=workers, mp_context=get_context("spawn")) as pool:
        futures = [pool.submit(run_shard, s, rescore, strict, chunk_tokens, jsonl_parser,
                               compare_dtype) for s in shards]
        for fut in futures:  # merged in file order
            total.merge(fut.result())
    return total


def audit(source: object, *, rescore: Rescore = None, strict: bool = False, workers: int = 1,
          chunk_tokens: int = DEFAULT_CHUNK_TOKENS, jsonl_parser: str = "auto",
          compare_dtype: str | None = None) -> dict:
    """Audit engine vs trainer logprobs and return the report (a JSON-ready dict).

    source: a path (.jsonl/.npz/.parquet), a list of paths, or an iterable of records
    (mappings with id, prompt_ids, response_ids, engine_logprobs and optionally
    trainer_logprobs and mask). rescore: None, a callable
    ``(prompt_ids: list[int], response_ids: list[int]) -> logprobs [len(response_ids)]``
    used for sequences without trainer_logprobs, or "refmodel". strict: raise
    :class:`AuditInputError` at the first bad sequence instead of excluding it.
    workers: processes for file inputs; the report is identical for every value.
    jsonl_parser: "auto" (pyarrow blocks, :mod:`json` for blocks with bad lines) or
    "python" (:mod:`json` only); the report is identical for both.
    compare_dtype: None compares each pair in the promoted dtype of the two columns;
    "float32" (or "float16"/"float64") rounds both logprobs to it first - e.g. when one
    side wrote float32 values as short decimals and the other as float64 decimals.
    """
    return audit_accumulator(source, rescore=rescore, strict=strict, workers=workers,
                             chunk_tokens=chunk_tokens, jsonl_parser=jsonl_parser,
                             compare_dtype=compare_dtype).report()


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

