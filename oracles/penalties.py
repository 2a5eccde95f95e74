"""Reference for pipeline step 3 (penalties and token constraints): numpy, per-row
loops, no torch. Mirrors detsample/ops/penalties.py and its docstring's rules.

``dtype=np.float64`` (default) is the mathematical reference; ``dtype=np.float32``
performs the exact float32 operation chain that detsample specifies (rounded once per
operation), so it can be compared bit for bit.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import numpy as np


def penalize_row(
    x: np.ndarray,
    prompt_ids: Sequence[int],
    output_ids: Sequence[int],
    frequency: float,
    presence: float,
    repetition: float,
    dtype=np.float64,
) -> np.ndarray:
    """One row: additive penalties on output tokens, then repetition scaling on tokens
    seen in the prompt or the output. x: (V,). Returns a new (V,) array of ``dtype``."""
    out = np.array(x, dtype=dtype)
    f, p, r = dtype(frequency), dtype(presence), dtype(repetition)
    counts = Counter(int(t) for t in output_ids)
    for t, c in counts.items():
        if out[t] == -np.inf:
            continue
        out[t] = (out[t] - f * dtype(c)) - p
    for t in set(int(t) for t in prompt_ids) | set(counts):
        out[t] = out[t] / r if out[t] > 0 else out[t] * r
    return out


def stop_ids(stop_token_ids: Sequence[int], eos_token_ids: Sequence[int]) -> list[int]:
    """The ids that min_new_tokens blocks: the request's stop ids and the EOS ids."""
    return sorted(set(int(t) for t in stop_token_ids) | set(int(t) for t in eos_token_ids))


def min_tokens_row(x: np.ndarray, n_output: int, min_new_tokens: int, stops: Sequence[int]) -> np.ndarray:
    """-inf on ``stops`` while ``n_output < min_new_tokens``."""
    out = np.array(x)
    if n_output < min_new_tokens:
        for t in stops:
            out[t] = -np.inf
    return out


def allowed_row(x: np.ndarray, allowed: Sequence[int] | None) -> np.ndarray:
    """Tokens outside ``allowed`` become -inf (None: no restriction)."""
    out = np.array(x)
    if allowed is None:
        return out
    keep = set(int(t) for t in allowed)
    for t in range(out.shape[0]):
        if t not in keep:
            out[t] = -np.inf
    return out


def banned_by_bad_words(output_ids: Sequence[int], bad_words: Sequence[Sequence[int]]) -> set[int]:
    """Last ids of the bad-word sequences whose prefix ends the output."""
    banned = set()
    out = [int(t) for t in output_ids]
    for seq in bad_words:
        prefix = [int(t) for t in seq[:-1]]
        if len(prefix) <= len(out) and (not prefix or out[len(out) - len(prefix) :] == prefix):
            banned.add(int(seq[-1]))
    return banned


def bad_words_row(x: np.ndarray, output_ids: Sequence[int], bad_words: Sequence[Sequence[int]]) -> np.ndarray:
    out = np.array(x)
    for t in banned_by_bad_words(output_ids, bad_words):
        out[t] = -np.inf
    return out


def penalties_and_constraints_row(
    x: np.ndarray,
    params,
    prompt_ids: Sequence[int],
    output_ids: Sequence[int],
    eos_token_ids: Sequence[int],
    dtype=np.float64,
) -> np.ndarray:
    """The whole step 3 for one row, in the contract's order: additive, scaling,
    min_new_tokens, then allowed_token_ids and bad_words. ``params`` is any object with
    the SamplingParams field names."""
    out = penalize_row(
        x, prompt_ids, output_ids, params.frequency_penalty, params.presence_penalty, params.repetition_penalty, dtype
    )
    out = min_tokens_row(out, len(output_ids), params.min_new_tokens, stop_ids(params.stop_token_ids, eos_token_ids))
    out = allowed_row(out, params.allowed_token_ids)
    return bad_words_row(out, output_ids, params.bad_words)


def penalties_and_constraints(
    x: np.ndarray, rows: Sequence[tuple], eos_token_ids: Sequence[int], dtype=np.float64
) -> np.ndarray:
    """x: (B, V); rows[i] = (params, prompt_ids, output_ids). Per-row loop."""
    return (
        np.stack([penalties_and_constraints_row(x[i], *rows[i], eos_token_ids, dtype) for i in range(len(rows))])
        if len(rows)
        else np.array(x, dtype=dtype)
    )
