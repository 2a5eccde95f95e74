"""A local Hugging Face model directory as a model spec, and a model's end tokens.

``load_model("path/to/dir")`` loads ``config.json`` + weights with transformers'
``AutoModelForCausalLM.from_pretrained(dir, local_files_only=True, trust_remote_code=False)``
in a stated dtype (:data:`MODEL_DTYPES`, default float32). The files are data: no code from
the directory runs (``trust_remote_code`` is never set), weights are read from safetensors
(or, for a ``.bin``, by transformers' ``torch.load(weights_only=True)``), nothing is
downloaded. Every failure (no directory, no ``config.json``, unreadable weights, an
architecture transformers does not know) is one :class:`~detsample.models.base.ModelError`
line naming the directory, never a traceback.

:func:`config_eos_token_ids` reads the end tokens as engines read them (vLLM, HF
``generate``): the union of the config's ``eos_token_id`` and the generation config's
``eos_token_id``, each an int or a list.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from detsample.models.base import ModelError

#: ``--dtype`` names -> torch dtype names (float32 is the default everywhere)
MODEL_DTYPES = ("float32", "bfloat16", "float16")

#: weight files a directory may hold (transformers reads the index files' shards)
WEIGHT_FILES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
)


def is_model_dir_spec(spec: object) -> bool:
    """Whether ``spec`` reads as a directory (syntax only, nothing loaded): it names an
    existing directory, or holds a path separator (``./m``, ``/models/x``, ``m/``)."""
    if not isinstance(spec, str) or not spec:
        return False
    return os.path.isdir(spec) or os.sep in spec or "/" in spec


def check_model_dir(path: str) -> Path:
    """The directory as a Path, or a ModelError naming what is missing (cheap: before
    transformers is imported)."""
    d = Path(path)
    if not d.is_dir():
        raise ModelError(f"model directory {path}: no such directory")
    if not (d / "config.json").is_file():
        raise ModelError(
            f"model directory {path}: no config.json (a Hugging Face model directory holds config.json and its weights)"
        )
    try:
        json.loads((d / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ModelError(f"model directory {path}: config.json is not readable JSON ({_one_line(exc)})") from None
    if not any((d / f).is_file() for f in WEIGHT_FILES):
        raise ModelError(f"model directory {path}: no weights (expected one of {', '.join(WEIGHT_FILES)})")
    return d


def config_tp_problem(path: str, tp: int) -> str | None:
    """What a tensor-parallel run over ``tp`` ranks would refuse in directory ``path``,
    read from its ``config.json`` alone (attention heads and key/value heads), so the
    refusal comes before the weights load; None when the config allows it (the full
    check, :func:`detsample.parallel.layout.plan`, still runs on the loaded model)."""
    cfg = json.loads((check_model_dir(path) / "config.json").read_text(encoding="utf-8"))
    heads = cfg.get("num_attention_heads")
    kv = cfg.get("num_key_value_heads") or heads
    if not isinstance(heads, int) or not isinstance(kv, int) or heads < 1 or kv < 1:
        return None
    if heads % tp:
        return f"tensor parallel: tp={tp} does not divide config.num_attention_heads={heads}"
    if kv % tp and tp % kv:
        return f"tensor parallel: tp={tp} neither divides nor is a multiple of config.num_key_value_heads={kv}"
    return None


def load_model_dir(path: str, dtype: str = "float32") -> Any:
    """The transformers causal LM of directory ``path`` in ``dtype`` (eval mode)."""
    import torch

    if dtype not in MODEL_DTYPES:
        raise ModelError(f"dtype must be one of {', '.join(MODEL_DTYPES)}, got {dtype!r}")
    check_model_dir(path)
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # one line per outcome, not a bar per load

    try:
        model = AutoModelForCausalLM.from_pretrained(
            path, local_files_only=True, trust_remote_code=False, dtype=getattr(torch, dtype)
        )
    except Exception as exc:  # noqa: BLE001 - whatever transformers says, named in one line
        raise ModelError(f"model directory {path}: cannot load it ({type(exc).__name__}: {_one_line(exc)})") from None
    return model.eval()


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text[:300] + ("..." if len(text) > 300 else "")


def _ids(value: object, where: str) -> set[int]:
    if value is None:
        return set()
    values = value if isinstance(value, (list, tuple)) else [value]
    for v in values:
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise ModelError(f"{where}: eos_token_id must be a token id or a list of them, got {value!r}")
    return set(values)


def config_eos_token_ids(model: Any) -> tuple[int, ...] | None:
    """Sorted union of ``model.config.eos_token_id`` and
    ``model.generation_config.eos_token_id`` (int or list each); None when ``model`` has no
    config (not a Hugging Face model), ``()`` when its configs name no end token."""
    cfg = getattr(model, "config", None)
    if cfg is None:
        return None
    ids = _ids(getattr(cfg, "eos_token_id", None), "config.json")
    gen = getattr(model, "generation_config", None)
    if gen is not None:
        ids |= _ids(getattr(gen, "eos_token_id", None), "generation_config.json")
    return tuple(sorted(ids))
