"""Deterministic weight generation and the safetensors file format of the reference model.

Weights are int64 fixed-point tensors drawn from a counter-based hash (SplitMix64 of
``sha256(seed, tensor name)`` + element index), so a seed gives the same weights on every
platform and numpy/torch version; no global or stateful RNG is involved.
"""

from __future__ import annotations

import hashlib
import json
import math
import os

import numpy as np
import torch

from detsample.outputs import write_file
from detsample.refmodel.config import ACT_FRAC, GAIN_FRAC, W_FRAC, RefModelConfig, RefModelError
from detsample.refmodel.intops import exp_table

FORMAT = "detsample-refmodel/1"
META_KEY = "detsample_refmodel"
LOGIT_GAIN = 3.0  # lm_head scale: logits have a standard deviation of about 3


def _splitmix64(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        z = x + np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def uniform_ints(seed: int, name: str, shape: tuple[int, ...], low: int, high: int) -> torch.Tensor:
    """int64 tensor of ``shape``, entries in ``[low, high]``, a pure function of (seed, name)."""
    key = int.from_bytes(hashlib.sha256(f"{seed}:{name}".encode()).digest()[:8], "little")
    n = math.prod(shape)
    with np.errstate(over="ignore"):
        h = _splitmix64(np.arange(n, dtype=np.uint64) + np.uint64(key))
    vals = (h % np.uint64(high - low + 1)).astype(np.int64) + low
    return torch.from_numpy(vals.reshape(shape))


def _matrix(seed: int, name: str, fan_in: int, fan_out: int, gain: float = 1.0) -> torch.Tensor:
    a = int(round(2**W_FRAC * gain * math.sqrt(3.0 / fan_in)))  # std = gain / sqrt(fan_in)
    return uniform_ints(seed, name, (fan_in, fan_out), -a, a)


def _gain(seed: int, name: str, d: int) -> torch.Tensor:
    one = 2**GAIN_FRAC
    return uniform_ints(seed, name, (d,), one - one // 5, one + one // 5)


def generate(config: RefModelConfig) -> dict[str, torch.Tensor]:
    """All weights of ``config`` (name -> int64 tensor), a pure function of the config."""
    s, d, ff, v = config.seed, config.d_model, config.d_ff, config.vocab_size
    one = 2**ACT_FRAC
    w = {
        "tok_emb": uniform_ints(s, "tok_emb", (v, d), -one, one),
        "pos_emb": uniform_ints(s, "pos_emb", (config.max_seq_len, d), -one // 2, one // 2),
        "final_norm": _gain(s, "final_norm", d),
        "lm_head": _matrix(s, "lm_head", d, v, LOGIT_GAIN),
        "exp_table": exp_table(config.exp_table_len, config.att_step),
    }
    for i in range(config.n_layers):
        p = f"layers.{i}."
        w[p + "attn_norm"] = _gain(s, p + "attn_norm", d)
        for m in ("wq", "wk", "wv", "wo"):
            w[p + m] = _matrix(s, p + m, d, d)
        w[p + "mlp_norm"] = _gain(s, p + "mlp_norm", d)
        w[p + "w1"] = _matrix(s, p + "w1", d, ff)
        w[p + "w2"] = _matrix(s, p + "w2", ff, d)
    return w


def expected_shapes(config: RefModelConfig) -> dict[str, tuple[int, ...]]:
    d, ff = config.d_model, config.d_ff
    shapes = {
        "tok_emb": (config.vocab_size, d),
        "pos_emb": (config.max_seq_len, d),
        "final_norm": (d,),
        "lm_head": (d, config.vocab_size),
        "exp_table": (config.exp_table_len,),
    }
    for i in range(config.n_layers):
        p = f"layers.{i}."
        shapes.update(
            {
                p + "attn_norm": (d,),
                p + "wq": (d, d),
                p + "wk": (d, d),
                p + "wv": (d, d),
                p + "wo": (d, d),
                p + "mlp_norm": (d,),
                p + "w1": (d, ff),
                p + "w2": (ff, d),
            }
        )
    return shapes


def save(path: str | os.PathLike, config: RefModelConfig, weights: dict[str, torch.Tensor]) -> None:
    """Write ``weights`` and ``config`` to a safetensors file atomically
    (:func:`detsample.outputs.write_file`: temp file + rename)."""
    from safetensors.torch import save as to_bytes

    # One metadata key: safetensors does not keep the order of several, and two saves of
    # the same model must be byte-identical files.
    meta = {META_KEY: json.dumps({"format": FORMAT, "config": config.to_dict()}, sort_keys=True)}
    data = to_bytes({k: t.contiguous() for k, t in sorted(weights.items())}, metadata=meta)
    write_file(path, data, "the reference model's weights")


def load(path: str | os.PathLike) -> tuple[RefModelConfig, dict[str, torch.Tensor]]:
    """Read a file written by :func:`save`; checks format, names, shapes and dtypes."""
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        try:
            meta = json.loads((f.metadata() or {})[META_KEY])
        except (KeyError, ValueError):
            meta = {}
        if meta.get("format") != FORMAT:
            raise RefModelError(f"{path}: format must be {FORMAT!r}, got {meta.get('format')!r}")
        config = RefModelConfig(**meta["config"])
        weights = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 - a safetensors handle, not a dict
    shapes = expected_shapes(config)
    if set(weights) != set(shapes):
        raise RefModelError(f"{path}: tensor names must be {sorted(shapes)}, got {sorted(weights)}")
    for k, t in weights.items():
        if t.dtype != torch.int64 or tuple(t.shape) != shapes[k]:
            raise RefModelError(f"{path}: {k} must be int64 {shapes[k]}, got {t.dtype} {tuple(t.shape)}")
    return config, weights
