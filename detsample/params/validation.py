"""Every input rule of detsample in one place, each raising
:class:`~detsample.errors.InvalidSamplingParams` that names the field and the value.

Three levels, three names:

* **fields** (:func:`real_field`, :func:`int_field`, :func:`id_sequence`) turn one user
  value into its canonical form or fail: ``SamplingParams`` is built from them;
* **requests against a vocabulary** (:func:`check_request`): what only a batch can know
  (token ids inside ``[0, vocab_size)``, values that must survive the float32 rounding
  of the sampler, penalties, a callable per-request processor); ``SamplingBatch``
  runs it for every row it builds, and an engine may run it up front;
* **sampler call inputs** (:func:`check_logits`, :func:`row_ids_tensor`): the logits
  and per-row id tensors of one ``Sampler.sample`` / ``compute_logprobs`` call.

Nothing is clamped or coerced silently: a float where an integer is expected, a bool
where a number is expected, a value that rounds to infinity in float32 are errors.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable, Sequence
from typing import Any, NoReturn

import numpy as np
import torch

from detsample.errors import InvalidSamplingParams

#: logits dtypes the sampler accepts; every one is upcast once to float32
LOGITS_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def fail(msg: str) -> NoReturn:
    """Raise :class:`InvalidSamplingParams` with ``msg`` (which names field and value)."""
    raise InvalidSamplingParams(msg)


# -- fields ---------------------------------------------------------------------------


def is_int(v: Any) -> bool:
    """An integer that is not a bool (``True`` is not a token id or a count)."""
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)


def real_field(name: str, v: Any) -> float:
    """``v`` as a finite Python float; a bool, a non-number, NaN or an infinity fails."""
    if isinstance(v, bool) or not isinstance(v, numbers.Real):
        fail(f"{name} must be a real number, got {v!r}")
    f = float(v)
    if math.isnan(f) or math.isinf(f):
        fail(f"{name} must be finite, got {v!r}")
    return f


def int_field(name: str, v: Any) -> int:
    """``v`` as a Python int; a float (even 3.0) or a bool fails."""
    if not is_int(v):
        fail(f"{name} must be an integer, got {v!r}")
    return int(v)


def id_sequence(name: str, ids: Any) -> tuple[int, ...]:
    """A sequence of non-negative integer token ids as a tuple (``None`` -> ``()``)."""
    if ids is None:
        return ()
    if isinstance(ids, (str, bytes)) or not isinstance(ids, Iterable):
        fail(f"{name} must be a sequence of token ids, got {ids!r}")
    out = []
    for v in ids:
        if not is_int(v) or int(v) < 0:
            fail(f"{name} must hold non-negative integer token ids, got {v!r}")
        out.append(int(v))
    return tuple(out)


def int_list(name: str, values: Any) -> list[int]:
    """Integers of ``values`` (a sequence or a tensor, any sign); a float or a bool fails,
    never truncated."""
    if isinstance(values, torch.Tensor):
        values = values.tolist()
    if isinstance(values, (str, bytes)) or not isinstance(values, Iterable):
        fail(f"{name} must be a sequence of integers, got {values!r}")
    out = []
    for v in values:
        if not is_int(v):
            fail(f"{name} must be integers, got {v!r}")
        out.append(int(v))
    return out


def float32_finite(where: str, name: str, v: float, *, nonzero: bool = False) -> None:
    """``v`` must stay finite (and non-zero if ``nonzero``) once rounded to float32, the
    precision every kernel uses: 1e39 would become an infinity, a temperature or a
    repetition penalty of 1e-50 would become 0."""
    with np.errstate(over="ignore", under="ignore"):
        f = float(np.float32(v))
    if math.isinf(f) or (nonzero and v != 0.0 and f == 0.0):
        fail(f"{where}{name} must be representable in float32 (finite{', non-zero' if nonzero else ''}), got {v!r}")


def ids_in_vocab(where: str, name: str, ids: Iterable[int], vocab_size: int) -> None:
    """Every id of ``ids`` in ``[0, vocab_size)``."""
    for t in ids:
        if not 0 <= t < vocab_size:
            fail(f"{where}{name} contains token id {t}, outside the vocabulary [0, {vocab_size})")


# -- requests against a vocabulary ------------------------------------------------------

_PENALTIES = ("frequency_penalty", "presence_penalty", "repetition_penalty")


def check_float32(where: str, p: Any) -> None:
    """The float32 rules of :func:`check_request` on the params ``p`` alone (the CLI's
    option parsing runs them too, ``--temperature 1e-320`` refused at parse time): the
    temperature (unless greedy), logit_bias values and penalties finite in float32, the
    temperature and repetition penalty non-zero. Messages start with ``where``."""
    if not p.is_greedy:  # a greedy row (top_k=1) never divides by its temperature
        float32_finite(where, "temperature", p.temperature, nonzero=True)
    for k, b in p.logit_bias or ():
        float32_finite(where, f"logit_bias[{k}]", b)
    for name in _PENALTIES:
        float32_finite(where, name, getattr(p, name), nonzero=name == "repetition_penalty")


def check_request(req: Any, vocab_size: int) -> None:
    """Every rule a request must meet to join a batch of ``vocab_size`` tokens.

    ``req``: a :class:`detsample.params.Request` (its fields are already valid on their
    own). Token ids inside the vocabulary in every field; temperature, logit_bias values
    and penalties finite (and the temperature and repetition penalty non-zero) in
    float32; ``logprobs <= vocab_size``; a per-request ``logits_processor`` callable.
    Error messages start with ``request '<rid>':``.
    """
    p = req.params
    where = f"request {req.rid!r}: "
    check_float32(where, p)
    ids_in_vocab(where, "prompt_ids", req.prompt_ids, vocab_size)
    ids_in_vocab(where, "output_ids", req.output_ids, vocab_size)
    ids_in_vocab(where, "stop_token_ids", p.stop_token_ids, vocab_size)
    if p.logit_bias is not None:
        ids_in_vocab(where, "logit_bias", (k for k, _ in p.logit_bias), vocab_size)
    if p.allowed_token_ids is not None:
        ids_in_vocab(where, "allowed_token_ids", p.allowed_token_ids, vocab_size)
    for seq in p.bad_words:
        ids_in_vocab(where, "bad_words", seq, vocab_size)
    if p.logprobs > vocab_size:
        fail(f"{where}logprobs must be <= vocab_size ({vocab_size}), got {p.logprobs}")
    proc = p.logits_processor
    if proc is not None and not callable(proc):
        fail(f"{where}logits_processor must be callable, got {type(proc).__name__}")


# -- sampler call inputs ------------------------------------------------------------------


def check_logits(logits: Any, rows: int, vocab_size: int, device: torch.device) -> None:
    """``logits``: a ``(rows, vocab_size)`` tensor of a :data:`LOGITS_DTYPES` dtype on
    ``device``."""
    if not isinstance(logits, torch.Tensor):
        fail(f"logits must be a torch.Tensor, got {type(logits).__name__}")
    if logits.dtype not in LOGITS_DTYPES:
        names = ", ".join(str(d).removeprefix("torch.") for d in LOGITS_DTYPES)
        fail(f"logits must be one of {names}, got {logits.dtype}")
    want = (rows, vocab_size)
    if tuple(logits.shape) != want:
        fail(f"logits must have shape {want}, got {tuple(logits.shape)}")
    if logits.device != device:
        fail(f"logits must be on the batch's device {device}, got {logits.device}")


def row_ids_tensor(
    name: str, t: Any, rows: int, device: torch.device, *, lowest: int = 0, upper: int | None = None
) -> torch.Tensor:
    """One integer per row (positions, token ids) as a ``(rows,)`` int64 tensor on
    ``device``; an int32 tensor or a sequence is accepted. Every value must be
    ``>= lowest`` and, if ``upper`` is given, ``< upper``."""
    if not isinstance(t, torch.Tensor):
        try:
            t = torch.as_tensor(t)
            if t.numel() == 0:  # [] is float32 to torch; empty ids are int64
                t = t.to(torch.int64)
        except (TypeError, ValueError, OverflowError, RuntimeError) as e:
            fail(f"{name} must be an int64 tensor of shape ({rows},), got {t!r} ({e})")
    if t.dtype not in (torch.int64, torch.int32) or tuple(t.shape) != (rows,):
        fail(f"{name} must be an int64 tensor of shape ({rows},), got {t.dtype} {tuple(t.shape)}")
    if t.dtype != torch.int64 or t.device != device:
        t = t.to(device=device, dtype=torch.int64)
    if t.numel():
        if t.device.type == "cpu":  # host values: no tensor operations for two numbers
            values = t.tolist()
            lo, hi = min(values), max(values)
        else:
            lo, hi = (int(v) for v in torch.aminmax(t))
        if lo < lowest:
            fail(f"{name} must be >= {lowest}, got {lo}")
        if upper is not None and hi >= upper:
            fail(f"{name} must be < vocab_size ({upper}), got {hi}")
    return t


def token_id_key(name: str, v: Any) -> int:
    """A mapping key naming a token id: an integer, or a string such as ``"42"`` (JSON
    keys). Negative ids fail."""
    if is_int(v):
        tid = int(v)
    elif isinstance(v, str):
        try:
            tid = int(v.strip(), 10)
        except ValueError:
            fail(f"{name} keys must be integer token ids, got {v!r}")
    else:
        fail(f"{name} keys must be integer token ids, got {v!r}")
    if tid < 0:
        fail(f"{name} token ids must be >= 0, got {v!r}")
    return tid


def sequence_of(name: str, v: Any) -> Sequence[Any]:
    """``v`` as a list when it is a non-string iterable, else fail naming ``name``."""
    if isinstance(v, (str, bytes, dict)) or not isinstance(v, Iterable):
        fail(f"{name} must be a sequence, got {v!r}")
    return list(v)
