"""Synthetic RL rollouts with known engine/trainer perturbations, their padded twins under
each framework's layout, and a writer of padded column arrays: test data for the audit's
tests, benchmark and docs (the writers of the audit's own columns are
:mod:`detsample.audit.inputs.writers`, re-exported here).
"""

from __future__ import annotations

import numpy as np

from detsample.audit.inputs.table import offsets_from_lengths
from detsample.audit.inputs.writers import ROW_COLUMNS, from_records, to_records, write_jsonl, write_npz, write_parquet

__all__ = [
    "ROW_COLUMNS",
    "from_records",
    "pad_rows",
    "padded_twin",
    "slime_samples",
    "synth_rollouts",
    "to_records",
    "write_columns",
    "write_jsonl",
    "write_npz",
    "write_parquet",
]


def synth_rollouts(
    num_sequences: int,
    seed: int,
    *,
    mean_len: int = 64,
    prompt_len: int = 8,
    mismatch_rate: float = 0.3,
    scales: tuple[float, ...] = (1e-7, 1e-4, 1e-2, 0.3),
    mask_rate: float = 0.9,
    vocab: int = 32000,
    dtype: str = "float32",
) -> dict:
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


def pad_rows(
    values: np.ndarray, offsets: np.ndarray, width: int, side: str, fill: np.ndarray | float | int = 0
) -> np.ndarray:
    """Ragged rows as a 2-D array [S, width] padded on ``side`` ("left" or "right") with
    ``fill`` (a scalar, or an array [S, width] whose entries show through the padding)."""
    lens = np.diff(offsets)
    if lens.size and width < lens.max():
        raise ValueError(f"width {width} < longest row {lens.max()}")
    out = np.empty((lens.size, width), dtype=values.dtype)
    out[...] = fill
    col = np.arange(width)
    start = np.zeros_like(lens) if side == "right" else width - lens
    keep = (col >= start[:, None]) & (col < (start + lens)[:, None])
    out[keep] = values
    return out


def padded_twin(
    cols: dict,
    preset: str = "default",
    *,
    response_side: str = "right",
    prompt_side: str = "left",
    extra: int = 3,
    seed: int = 0,
) -> dict:
    """The rollouts ``cols`` as one training batch of padded 2-D arrays under a
    framework's names (docs/audit.md, "Presets"): "default" (the audit's names, plus
    ``attention_mask`` over the response), "verl", "trl" or "openrlhf". Padding
    positions hold junk (random ids, NaN or positive logprobs, mask 0) that the audit must
    ignore. ``extra``: padding columns beyond the longest row.

    For "openrlhf" the prompt ends where the first mask 1 is, so every non-empty response
    must start with a trained token."""
    rng = np.random.default_rng(seed)
    n = len(cols["id"])
    rv, ro = cols["response_ids"]
    pv, po = cols["prompt_ids"]
    rlen, plen = np.diff(ro), np.diff(po)
    width = int(rlen.max(initial=0)) + extra
    pwidth = int(plen.max(initial=0)) + extra
    mask = cols["mask"][0] if "mask" in cols else np.ones(rv.size, dtype=np.int8)

    def junk_ids(w: int) -> np.ndarray:
        return rng.integers(0, 50000, (n, w))

    def junk_lp(w: int, dtype) -> np.ndarray:
        j = rng.choice(np.array([np.nan, 1.5, -3.0, 0.0]), (n, w))
        return j.astype(dtype)

    def att(lens: np.ndarray, w: int, side: str) -> np.ndarray:
        return pad_rows(np.ones(int(lens.sum()), np.int64), offsets_from_lengths(lens), w, side)

    e, t = cols["engine_logprobs"][0], cols["trainer_logprobs"][0]
    if preset == "openrlhf":
        first = np.flatnonzero(rlen > 0)
        if first.size and not (mask[ro[first]] != 0).all():
            raise ValueError("openrlhf twins need responses that start with a trained token")
        seq_lens = plen + rlen
        seq_off = offsets_from_lengths(seq_lens)
        seq = np.empty(int(seq_lens.sum()), dtype=np.int64)
        keep_p = np.repeat(seq_off[:-1], plen) + (np.arange(pv.size) - np.repeat(po[:-1], plen))
        keep_r = np.repeat(seq_off[:-1] + plen, rlen) + (np.arange(rv.size) - np.repeat(ro[:-1], rlen))
        seq[keep_p], seq[keep_r] = pv, rv
        total = width + pwidth
        shifted = np.maximum(seq_lens - 1, 0)  # entry j describes token j + 1
        s_off = offsets_from_lengths(shifted)

        def per_token(vals: np.ndarray, fill_prompt) -> np.ndarray:
            flat = np.empty(int(shifted.sum()), dtype=vals.dtype)
            flat[...] = fill_prompt
            idx = np.repeat(s_off[:-1] + np.maximum(plen - 1, 0), rlen) + (
                np.arange(rv.size) - np.repeat(ro[:-1], rlen)
            )
            flat[idx] = vals
            return pad_rows(flat, s_off, total - 1, "right", 0)

        return {
            "index": np.arange(n),
            "sequences": pad_rows(seq, seq_off, total, "right", 0),
            "attention_mask": att(seq_lens, total, "right"),
            "action_mask": per_token(mask.astype(np.int64), 0),
            "rollout_log_probs": per_token(e, 0.0),
            "action_log_probs": per_token(t, 0.0),
        }
    resp = pad_rows(rv, ro, width, response_side, junk_ids(width))
    prompt = pad_rows(pv, po, pwidth, prompt_side, junk_ids(pwidth))
    eng = pad_rows(e, ro, width, response_side, junk_lp(width, e.dtype))
    tra = pad_rows(t, ro, width, response_side, junk_lp(width, t.dtype))
    m = pad_rows(mask.astype(np.int64), ro, width, response_side, 0)
    r_att = att(rlen, width, response_side)
    p_att = att(plen, pwidth, prompt_side)
    if preset == "verl":
        return {
            "uid": np.asarray(cols["id"]),
            "prompts": prompt,
            "responses": resp,
            "attention_mask": np.concatenate([p_att, r_att], axis=1),
            "response_mask": m,
            "rollout_log_probs": eng,
            "old_log_probs": tra,
        }
    if preset == "trl":
        return {
            "prompt_ids": prompt,
            "prompt_mask": p_att,
            "completion_ids": resp,
            "completion_mask": r_att,
            "sampling_per_token_logps": eng,
            "old_per_token_logps": tra,
            "tool_mask": np.where(r_att == 1, m, 1),
        }  # TRL pads tool_mask with 1
    if preset != "default":
        raise ValueError(f"preset must be default, verl, trl or openrlhf, got {preset!r}")
    return {
        "id": np.asarray(cols["id"]),
        "prompt_ids": prompt,
        "prompt_attention_mask": p_att,
        "response_ids": resp,
        "attention_mask": r_att,
        "mask": m,
        "engine_logprobs": eng,
        "trainer_logprobs": tra,
    }


def slime_samples(cols: dict) -> list[dict]:
    """The rollouts as slime sample dicts (tokens = prompt + response, response_length,
    loss_mask, rollout_log_probs, log_probs, index), as its debug dumps hold them."""
    out = []
    for i, rec in enumerate(to_records(cols)):
        out.append(
            {
                "index": i,
                "tokens": rec["prompt_ids"] + rec["response_ids"],
                "response_length": len(rec["response_ids"]),
                "loss_mask": rec.get("mask", [1] * len(rec["response_ids"])),
                "rollout_log_probs": rec["engine_logprobs"],
                "log_probs": rec["trainer_logprobs"],
            }
        )
    return out


def write_columns(arrays: dict, path: str) -> None:
    """A dict of arrays (2-D padded, 1-D per sequence) as NPZ, Parquet (list columns) or a
    torch .pt file (tensors; string ids as a list), by the file's extension."""
    if path.endswith(".npz"):
        np.savez(path, **arrays)
        return
    if path.endswith((".pt", ".pth")):
        import torch

        torch.save(
            {
                k: (v.tolist() if v.dtype.kind in "US" else torch.from_numpy(np.ascontiguousarray(v)))
                for k, v in arrays.items()
            },
            path,
        )
        return
    import pyarrow as pa
    import pyarrow.parquet as pq

    data = {}
    for k, v in arrays.items():
        if v.ndim == 2:
            off = np.arange(0, v.size + 1, max(v.shape[1], 1), dtype=np.int32)[: v.shape[0] + 1]
            data[k] = pa.ListArray.from_arrays(pa.array(off), pa.array(v.reshape(-1)))
        else:
            data[k] = pa.array(v.tolist())
    pq.write_table(pa.table(data), path, row_group_size=16)
