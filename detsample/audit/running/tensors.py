"""The audit inside a training step: :func:`from_tensors` on the padded batch a trainer holds.

``from_tensors(response_ids, engine_logprobs, trainer_logprobs, mask)`` takes torch
tensors (any device; bfloat16 widened to float32 exactly) or numpy arrays of shape
[B, R], and returns the same report :func:`detsample.audit.audit` gives for the same rows
in a file: the batch goes through the same unpadding, validation and exact accumulators
(:mod:`detsample.audit.inputs.assemble`). Nothing is copied into Python lists: each argument is
copied once to host memory as an array, in blocks of rows.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np

from detsample.audit.analysis.metrics import AuditAccumulator
from detsample.audit.inputs.layout import Layout, resolve
from detsample.audit.inputs.table import Padded, PerRow, TableChunk
from detsample.audit.issues import AuditInputError
from detsample.audit.running.options import AuditOptions, options_of
from detsample.audit.running.run import consume

#: the arguments, by the audit's column names
_ARGS = (
    "response_ids",
    "engine_logprobs",
    "trainer_logprobs",
    "mask",
    "attention_mask",
    "prompt_ids",
    "prompt_attention_mask",
)


def _host(name: str, x: object) -> np.ndarray:
    """A tensor or array as a 2-D numpy array (a torch tensor on any device is copied to
    host once; bfloat16 becomes float32)."""
    if hasattr(x, "detach") and hasattr(x, "dtype"):
        from detsample.audit.inputs.torchfile import to_numpy

        a = to_numpy(x)
    else:
        a = np.asarray(x)
    if a.ndim != 2:
        raise AuditInputError(f"from_tensors: {name} must be 2-D [batch, length], got shape {a.shape}")
    return a


def _tables(
    arrays: dict[str, np.ndarray], ids: Sequence | None, source: str, rows_per_chunk: int
) -> Iterator[TableChunk]:
    n = arrays["response_ids"].shape[0]
    for i in range(0, n, rows_per_chunk):
        j = min(i + rows_per_chunk, n)
        cols: dict = {k: Padded(a[i:j]) for k, a in arrays.items()}
        if ids is not None:
            cols["id"] = PerRow([str(x) for x in ids[i:j]])
        yield TableChunk(source, "row", np.arange(i, j, dtype=np.int64), cols)


def tensors_accumulator(
    response_ids: object,
    engine_logprobs: object,
    trainer_logprobs: object,
    mask: object = None,
    *,
    attention_mask: object = None,
    prompt_ids: object = None,
    prompt_attention_mask: object = None,
    ids: Sequence | None = None,
    padding: str = "auto",
    prompt_padding: str = "auto",
    source: str = "<tensors>",
    options: AuditOptions | None = None,
    **kwargs: object,
) -> AuditAccumulator:
    """Like :func:`from_tensors` but returns the accumulator (to merge several batches)."""
    opts = options_of(options, kwargs)
    given = {
        "response_ids": response_ids,
        "engine_logprobs": engine_logprobs,
        "trainer_logprobs": trainer_logprobs,
        "mask": mask,
        "attention_mask": attention_mask,
        "prompt_ids": prompt_ids,
        "prompt_attention_mask": prompt_attention_mask,
    }
    arrays = {k: _host(k, v) for k, v in given.items() if v is not None}
    n, width = arrays["response_ids"].shape
    if "prompt_ids" not in arrays:  # prompts are needed only to rescore
        arrays["prompt_ids"] = np.zeros((n, 0), dtype=np.int64)
    if ids is not None and len(ids) != n:
        raise AuditInputError(f"from_tensors: ids has {len(ids)} entries for {n} rows")
    layout = Layout("from_tensors", padded=True, response_padding=padding, prompt_padding=prompt_padding)
    resolved = resolve(layout, list(arrays) + (["id"] if ids is not None else []), source)
    acc = AuditAccumulator(opts.compare_dtype, opts.frameworks)
    acc.add_source(source)
    consume(
        acc,
        _tables(arrays, ids, source, max(opts.chunk_tokens // max(width, 1), 1)),
        resolved,
        opts.rescorer(),
        opts.strict,
    )
    return acc


def from_tensors(
    response_ids: object, engine_logprobs: object, trainer_logprobs: object, mask: object = None, **kwargs: object
) -> dict:
    """Audit one padded training batch; returns the report of :func:`detsample.audit.audit`.

    response_ids, engine_logprobs, trainer_logprobs: [B, R] (torch tensors on any device,
    or numpy arrays); mask: [B, R] loss mask (1 = trained), or None (every token).
    Keywords: attention_mask ([B, R] response padding mask, or [B, P+R] with prompt_ids);
    prompt_ids ([B, P], needed only to rescore) and prompt_attention_mask; ids (one per
    row; default the row numbers); padding / prompt_padding ("auto", "left", "right");
    source (the name reports use, default "<tensors>"); options (an
    :class:`~detsample.audit.running.options.AuditOptions`) or its fields as keywords.

    Without an attention mask a row ends at its last mask 1 (right padding) or starts at
    its first (left padding): pass ``attention_mask`` to keep trailing masked tokens.
    The report is byte-equal to the file audit of the same rows (same ``source``).
    """
    return tensors_accumulator(response_ids, engine_logprobs, trainer_logprobs, mask, **kwargs).report()
