"""Synthetic RL rollouts with known engine/trainer perturbations, and writers for the
audit's input formats (JSONL, NPZ, Parquet). Used by the tests, the benchmark and docs.

A rollout set is column-major: ``{"id": [S] str, C: (values [T_C], offsets [S+1])}`` for
C in prompt_ids, response_ids, engine_logprobs, trainer_logprobs, mask.
"""

from __future__ import annotations

import json

import numpy as np

from detsample.audit.readers import LIST_COLUMNS
from detsample.audit.validate import offsets_from_lengths


def synth_rollouts(num_sequences: int, seed: int, *, mean_len: int = 64, prompt_len: int = 8,
                   mismatch_rate: float = 0.3, scales: tuple[float, ...] = (1e-7, 1e-4, 1e-2, 0.3),
                   mask_rate: float = 0.9, vocab: int = 32000, dtype: str = "float32") -> dict:
    """Random rollouts: engine logprobs log(U), trainer = engine + noise on a
    ``mismatch_rate`` fraction of tokens (noise scale drawn from ``scales``), clipped to
    <= 0, both rounded to ``dtype``; mask 1 with probability ``mask_rate``."""
    if not 0 <= mismatch_rate <= 1:
        raise ValueError(f"mismatch_rate must be in [0, 1], got {mismatch_rate}")
    rng = np.random.default_rng(seed)
    lens = rng.integers(0, 2 * mean_len + 1, num_sequences)
    plens = rng.integers(1, 2 * prompt_len + 1, num_sequences)
    t = int(lens.sum())
    engine = np.log(rng.random(t) * 0.999999 + 1e-6).astype(dtype)
    hit = rng.random(t) < mismatch_rate
    noise = rng.normal(size=t) * np.asarray(scales)[rng.integers(0, len(scales), t)]
    trainer = np.minimum(engine.astype(np.float64) + np.where(hit, noise, 0.0), 0.0).astype(dtype)
    off, poff = offsets_from_lengths(lens), offsets_from_lengths(plens)
    return {
        "id": [f"seq-{seed}-{i}" for i in range(num_sequences)],
        "prompt_ids": (rng.integers(0, vocab, int(plens.sum())), poff),
        "response_ids": (rng.integers(0, vocab, t), off),
        "engine_logprobs": (engine, off),
        "trainer_logprobs": (trainer, off),
        "mask": ((rng.random(t) < mask_rate).astype(np.int8), off),
    }


def from_records(records: list[dict]) -> dict:
    """Column-major rollout set from records (the inverse of :func:`to_records`); the
    float columns keep float64 unless every value is a float32 array."""
    cols: dict = {"id": [str(r["id"]) for r in records]}
    for c in LIST_COLUMNS:
        if not all(c in r for r in records):
            continue
        parts = [np.asarray(r[c]) for r in records]
        off = offsets_from_lengths(np.array([p.size for p in parts], dtype=np.int64))
        dtype = np.int64 if c.endswith("_ids") or c == "mask" else np.float64
        if dtype is np.float64 and parts and all(p.dtype == np.float32 for p in parts):
            dtype = np.float32
        vals = np.concatenate(parts).astype(dtype) if parts else np.empty(0, dtype=dtype)
        cols[c] = (vals, off)
    return cols


def to_records(cols: dict) -> list[dict]:
    """Row-major records (lists of Python numbers) of a rollout set."""
    out = []
    for i, rid in enumerate(cols["id"]):
        rec: dict = {"id": rid}
        for c in LIST_COLUMNS:
            if c in cols:
                v, o = cols[c]
                rec[c] = v[o[i]:o[i + 1]].tolist()
        out.append(rec)
    return out


def write_jsonl(cols: dict, path: str) -> None:
    with open(path, "w") as f:
        for rec in to_records(cols):
            f.write(json.dumps(rec) + "\n")


def write_npz(cols: dict, path: str, compressed: bool = False) -> None:
    arrays = {"id": np.asarray(cols["id"])}
    for c in LIST_COLUMNS:
        if c in cols:
            arrays[c], arrays[f"{c}_offsets"] = cols[c]
    (np.savez_compressed if compressed else np.savez)(path, **arrays)


def write_parquet(cols: dict, path: str, row_group_size: int = 1024) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    data = {"id": pa.array(cols["id"], type=pa.string())}
    for c in LIST_COLUMNS:
        if c in cols:
            v, o = cols[c]
            data[c] = pa.ListArray.from_arrays(pa.array(o.astype(np.int32)), pa.array(v))
    pq.write_table(pa.table(data), path, row_group_size=row_group_size)
