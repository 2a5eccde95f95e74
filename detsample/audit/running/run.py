"""The audit driver: plan shards, read, map, validate and accumulate them, merge, gate.

The public names are re-exported by :mod:`detsample.audit`.
"""

from __future__ import annotations

import itertools
import json
import math
import os
from collections.abc import Iterable, Iterator, Mapping
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from multiprocessing import get_context

from detsample.audit.analysis.diagnose import MAX_TOKENS, Sequence, diagnose
from detsample.audit.analysis.metrics import AuditAccumulator
from detsample.audit.inputs.assemble import assemble
from detsample.audit.inputs.formats import format_of
from detsample.audit.inputs.layout import OPENAI_COLUMNS, Layout, Resolved, resolve
from detsample.audit.inputs.readers import iter_record_chunks
from detsample.audit.inputs.source import Source
from detsample.audit.inputs.table import RawChunk, TableChunk, offsets_from_lengths
from detsample.audit.issues import AuditInputError, Issue, audit_file
from detsample.audit.running.gates import check_gates
from detsample.audit.running.options import AuditOptions, options_of
from detsample.audit.running.rescore import ModelRescorer, TPRescorer, semantics_of
from detsample.audit.running.validate import RescoreFn, stated_semantics, validate
from detsample.audit.semantics import RAW, Semantics
from detsample.inputs import AUDIT_SEQUENCE_BYTES, memory_problem, thread_problem
from detsample.inputs.signals import children_ignore_ctrl_c

__all__ = [
    "AuditInputError",
    "AuditOptions",
    "Issue",
    "Shard",
    "audit",
    "audit_accumulator",
    "check_gates",
    "consume",
    "plan_shards",
    "run_shard",
    "to_json",
]


@dataclass(frozen=True)
class Shard:
    """A contiguous piece of one input file: JSONL bytes [start, stop) starting at line
    ``first_line``; NPZ and .pt rows [start, stop); Parquet row groups [start, stop)."""

    fmt: str
    path: str
    start: int
    stop: int
    first_line: int = 1


def open_source(path: str, layout: Layout) -> tuple[Source, Resolved]:
    """(source, resolved layout) of one file, by the format table
    (:data:`~detsample.audit.inputs.formats.FORMATS`); structural errors are fatal here,
    before any shard runs, and close the source. The caller closes it (``with src:``)."""
    fmt = format_of(audit_file(path))  # a FIFO or a device would block or never end
    if layout.records == "openai" and fmt.name != "jsonl":
        raise AuditInputError(
            f"{path}: preset openai reads JSONL (one OpenAI-compatible response per line), got a .{fmt.name} file"
        )
    src = fmt.source(path)
    try:
        names = OPENAI_COLUMNS if layout.records == "openai" else src.columns()
        resolved = resolve(layout, names, path)
        src.bind(resolved)
    except BaseException:
        src.close()
        raise
    return src, resolved


def plan_shards(paths: list[str], parts: int, layout: Layout | None = None) -> list[Shard]:
    """Split every file into at most ``parts`` contiguous shards, in file order."""
    layout = AuditOptions().layout if layout is None else layout
    shards: list[Shard] = []
    counted = 0
    for path in paths:
        path = os.fspath(path)
        src, _ = open_source(path, layout)
        with src:
            counted += src.num_sequences
            _sequences_fit(path, counted)
            fmt = format_of(path).name
            shards += [Shard(fmt, path, a, b, line) for a, b, line in src.shards(parts)]
    return shards


def _sequences_fit(path: str, counted: int) -> None:
    """AuditInputError before any value is read when the sequences counted so far (a
    format that knows its row count: NPZ, Parquet, .pt; JSONL counts 0 here) would not
    fit in memory at :data:`~detsample.inputs.AUDIT_SEQUENCE_BYTES` each."""
    problem = memory_problem(counted * AUDIT_SEQUENCE_BYTES, f"auditing {counted:,} sequences")
    if problem:
        raise AuditInputError(f"{path}: {problem}; split the file and audit the parts")


def consume(
    acc: AuditAccumulator, chunks: Iterable[TableChunk], resolved: Resolved, rescore: RescoreFn | None, strict: bool
) -> None:
    """Map, validate and accumulate table chunks (the one loop every entry point runs)."""
    for tc in chunks:
        acc.add_source(tc.source)
        batch, issues = validate(assemble(tc, resolved), rescore, acc.compare_dtype)
        if issues and strict:
            raise AuditInputError(f"{issues[0]} (--strict)")
        acc.add_issues(issues)
        acc.update(batch)


def _shard_chunks(shard: Shard, opts: AuditOptions) -> tuple[Iterator[TableChunk], Resolved]:
    src, resolved = open_source(shard.path, opts.layout)

    def chunks() -> Iterator[TableChunk]:
        with src:
            yield from src.chunks(shard.start, shard.stop, shard.first_line, opts.chunk_tokens, opts.jsonl_parser)

    return chunks(), resolved


def run_shard(shard: Shard, opts: AuditOptions | None = None) -> AuditAccumulator:
    """Audit one shard (in this process, a worker process or a Ray task)."""
    opts = AuditOptions() if opts is None else opts
    acc = AuditAccumulator(opts.compare_dtype, opts.frameworks)
    acc.add_source(shard.path)
    chunks, resolved = _shard_chunks(shard, opts)
    consume(acc, chunks, resolved, opts.rescorer(), opts.strict)
    return acc


def _is_paths(source: object) -> bool:
    if isinstance(source, (str, os.PathLike)):
        return True
    return isinstance(source, (list, tuple)) and bool(source) and all(isinstance(s, (str, os.PathLike)) for s in source)


def _records_accumulator(records: Iterable[object], opts: AuditOptions) -> AuditAccumulator:
    acc = AuditAccumulator(opts.compare_dtype, opts.frameworks)
    it = iter(records)
    first = next(it, None)
    if first is None:
        return acc
    keys = list(first) if isinstance(first, Mapping) else []
    if opts.layout.records == "openai":
        keys = list(OPENAI_COLUMNS)
    resolved = resolve(opts.layout, keys, "<records>")
    chunks = iter_record_chunks(itertools.chain([first], it), resolved, chunk_tokens=opts.chunk_tokens)
    consume(acc, chunks, resolved, opts.rescorer(), opts.strict)
    return acc


def audit_accumulator(source: object, options: AuditOptions | None = None, **kwargs: object) -> AuditAccumulator:
    """Like :func:`audit` but returns the merged accumulator (for custom reports)."""
    opts = options_of(options, kwargs)
    if isinstance(opts.rescore, str):
        opts.rescorer()  # an unknown name fails before any file is read
    if not _is_paths(source):
        return _records_accumulator(source, opts)  # type: ignore[arg-type]
    paths = [os.fspath(p) for p in ([source] if isinstance(source, (str, os.PathLike)) else source)]
    total = AuditAccumulator(opts.compare_dtype, opts.frameworks)
    if opts.ray is not None:
        from detsample.audit.running.ray_runner import cluster_cpus, ray_session, run_tasks

        with ray_session(opts.ray) as ray:
            parts = opts.workers if opts.workers > 1 else cluster_cpus(ray)
            shards = plan_shards(paths, parts, opts.layout)
            for acc in run_tasks(ray, run_shard, shards, opts):  # merged in file order
                total.merge(acc)
        return total
    shards = plan_shards(paths, opts.workers, opts.layout)
    if opts.workers == 1 or len(shards) == 1:
        for shard in shards:
            total.merge(run_shard(shard, opts))
        return total
    if opts.rescore is not None and not isinstance(opts.rescore, str):
        try:
            import pickle

            pickle.dumps(opts.rescore)
        except Exception as exc:  # noqa: BLE001
            raise ValueError(f"rescore must be picklable to use workers > 1 ({exc})") from exc
    too_many = thread_problem(opts.workers)  # local processes, one per worker
    if too_many:
        raise AuditInputError(f"workers {too_many}")
    pool = ProcessPoolExecutor(max_workers=opts.workers, mp_context=get_context("spawn"))
    try:
        with children_ignore_ctrl_c():  # the parent alone handles Ctrl-C
            futures = [pool.submit(run_shard, s, opts) for s in shards]
        for fut in futures:  # merged in file order
            total.merge(fut.result())
    except BaseException:  # an error or Ctrl-C: stop the other shards now, not at their end
        for proc in list(getattr(pool, "_processes", {}).values()):
            proc.terminate()
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    pool.shutdown()
    return total


def audit(source: object, options: AuditOptions | None = None, **kwargs: object) -> dict:
    """Audit engine vs trainer logprobs and return the report (a JSON-ready dict).

    source: a path (.jsonl/.npz/.parquet/.pt), a list of paths, or an iterable of records
    (mappings with id, prompt_ids, response_ids, engine_logprobs and optionally
    trainer_logprobs and mask, or the columns a layout names). options: an
    :class:`AuditOptions`; or keywords: its fields (rescore, strict, workers,
    chunk_tokens, jsonl_parser, compare_dtype, layout, ray) and ``preset`` / ``columns``
    / ``padding``, not both. The report is identical
    for every ``workers``, ``chunk_tokens``, ``jsonl_parser`` and ``ray``.

    When max |d| is beyond kernel noise the report's ``"diagnosis"`` says which logprob
    semantics explains the engine's numbers (:mod:`detsample.audit.analysis.diagnose`; with a
    model rescorer, searched over the logits of its forwards of the first sequences).
    """
    opts = options_of(options, kwargs)
    if isinstance(opts.rescore, str):  # one rescorer object: its kept logits are reused
        opts = AuditOptions.make(base=opts, rescore=ModelRescorer(opts.rescore))
    rescorer = opts.rescore if isinstance(opts.rescore, (ModelRescorer, TPRescorer)) else None
    if rescorer is not None and opts.workers == 1 and opts.ray is None:
        rescorer.keep = DIAGNOSIS_SEQUENCES
    report = audit_accumulator(source, opts).report()
    if rescorer is not None:  # the search over the model's logits
        report["diagnosis"] = diagnose(report, rescorer, first_sequences(source, opts))
        rescorer.keep, rescorer.kept = 0, {}
    return report


#: sequences whose rescoring logits are kept for the diagnosis (it reads their tokens)
DIAGNOSIS_SEQUENCES = 16


def first_sequences(source: object, opts: AuditOptions) -> list[Sequence]:
    """The first sequences of ``source`` (at most :data:`MAX_TOKENS` trained tokens, in
    file order) with a prompt and engine logprobs that pass the per-sequence checks, for
    the diagnosis. A one-shot iterator of records cannot be read twice: none."""
    if _is_paths(source):
        paths = [os.fspath(p) for p in ([source] if isinstance(source, (str, os.PathLike)) else source)]
        chunks, resolved = _shard_chunks(plan_shards(paths[:1], 1, opts.layout)[0], opts)
    elif isinstance(source, (list, tuple)) and source:
        first = source[0]
        keys = (
            list(OPENAI_COLUMNS)
            if opts.layout.records == "openai"
            else (list(first) if isinstance(first, Mapping) else [])
        )
        resolved = resolve(opts.layout, keys, "<records>")
        chunks = iter_record_chunks(iter(source), resolved, chunk_tokens=opts.chunk_tokens)
    else:
        return []
    out: list[Sequence] = []
    tokens = 0
    base = semantics_of(opts.rescore) or RAW
    for tc in chunks:
        for seq in _chunk_sequences(assemble(tc, resolved), base):
            out.append(seq)
            tokens += sum(1 for m in seq.mask if m)
            if tokens >= MAX_TOKENS or len(out) >= DIAGNOSIS_SEQUENCES:
                return out
    return out


def _chunk_sequences(raw: RawChunk, base: Semantics) -> Iterator[Sequence]:
    """The sequences of one assembled chunk the diagnosis can read (a prompt, engine
    logprobs of the response's length, finite, a 0/1 mask, good stated semantics over
    ``base``), with the semantics they state; the rest are skipped (the audit itself
    names them)."""
    need = ("prompt_ids", "response_ids", "engine_logprobs")
    if any(c not in raw.lengths for c in need):
        return
    bad = dict(raw.flagged)
    stated = stated_semantics(raw, base, bad)
    off = {c: offsets_from_lengths(raw.lengths[c]) for c in (*need, "mask") if c in raw.lengths}
    for i in range(len(raw)):
        if i in bad:
            continue
        seg = {c: raw.values[c][off[c][i] : off[c][i + 1]] for c in off if raw.lengths[c][i] >= 0}
        if any(c not in seg for c in need) or not seg["prompt_ids"].size:
            continue
        n = seg["response_ids"].size
        mask = seg.get("mask", [1] * n)
        if seg["engine_logprobs"].size != n or len(mask) != n or seg["engine_logprobs"].dtype.kind not in "fiu":
            continue
        eng = [float(v) for v in seg["engine_logprobs"]]
        if not all(math.isfinite(v) for v in eng):
            continue
        yield Sequence(
            [int(v) for v in seg["prompt_ids"]],
            [int(v) for v in seg["response_ids"]],
            eng,
            [1 if m else 0 for m in mask],
            stated.get(i),
        )


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
