"""The stated limits of the input layer (docs/audit.md and docs/golden.md, "Limits").

Sizes are bytes. Thread counts are bounded by the machine: a count far beyond its CPUs
makes OpenMP allocate a stack per thread and crash the process (``torch.set_num_threads
(100000)`` is a segmentation fault), so an option asking for one is refused by name.
"""

from __future__ import annotations

import os

#: one line of an audit JSONL file (a sequence); 200 MB lines are read
AUDIT_LINE_BYTES = 1 << 31
#: one sequence of an NPZ audit input (its ragged offsets or padded width), in tokens: 16 M,
#: beyond any model's context; a 1.4 MB compressed NPZ of one 6e7-token sequence asked
#: for 5 GB before this limit
AUDIT_SEQUENCE_TOKENS = 1 << 24
#: what the audit holds per sequence while it runs (ids, per-sequence metrics and their
#: exact sums): measured ~570 bytes resident, ~660 traced, for 1e6 and 3e7 empty sequences
#: of an NPZ (a 46 MB file of 3e7 sequences took 17 GB before its count was checked)
AUDIT_SEQUENCE_BYTES = 700
#: one line of an audit log (a training step's row is a few hundred bytes)
LOG_LINE_BYTES = 1 << 20
#: one line of a prompts JSONL file (a prompt's ids or text, or its chat messages)
PROMPT_LINE_BYTES = 1 << 26
#: one golden file (tokens, logprobs, manifest, a tensor's bits)
GOLDEN_FILE_BYTES = 1 << 30
#: thread counts may oversubscribe the machine's CPUs by this factor (a 1-vs-N thread
#: probe still runs N = 2 on a one-CPU machine), no more
THREAD_OVERSUBSCRIPTION = 4


def max_threads() -> int:
    """The largest thread count an option may ask for: ``THREAD_OVERSUBSCRIPTION`` x the
    logical CPUs this machine has (at least 1)."""
    return THREAD_OVERSUBSCRIPTION * max(os.cpu_count() or 1, 1)


def thread_problem(n: int) -> str | None:
    """Why ``n`` is not a usable thread count (< 1, or beyond :func:`max_threads`), or None."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        return f"must be an integer >= 1, got {n!r}"
    limit = max_threads()
    if n > limit:
        return (
            f"must be at most {limit} ({THREAD_OVERSUBSCRIPTION} x the {os.cpu_count()} CPUs of this machine), got {n}"
        )
    return None


#: a tensor an option sizes (``bench --batch B --vocab V``: B x V float32 logits) may take
#: at most this fraction of the machine's memory (the sampler holds a few such buffers)
MEMORY_FRACTION = 4


def memory_bytes() -> int | None:
    """The machine's physical memory in bytes, or None where the OS does not say."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def memory_problem(nbytes: int, what: str) -> str | None:
    """Why a buffer of ``nbytes`` (described by ``what``, the options that size it) is
    refused: more than 1/``MEMORY_FRACTION`` of :func:`memory_bytes`; or None."""
    total = memory_bytes()
    if total is None or nbytes * MEMORY_FRACTION <= total:
        return None
    return (
        f"{what} needs {nbytes / 2**30:,.1f} GiB, more than 1/{MEMORY_FRACTION} of this "
        f"machine's {total / 2**30:,.1f} GiB"
    )
