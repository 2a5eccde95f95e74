"""Batch-invariant attention, and its registration with transformers as ``"detsample"``.

:func:`attention` computes ``softmax(q k^T * scale + mask) v`` so that a query's output
depends only on its own ``q`` and the keys/values it may attend to: not on the number of
queries, the batch, the padding (left or right) or how long the cache is.

How: each batch row's keys are **compacted** first (the slots some query of the row may
attend, in slot order: padding slots drop out, the row's first key becomes key 0), then
every query walks the compacted keys in blocks of :data:`KEY_BLOCK` from key 0, in the
same order, with an online softmax (running max ``m``, running output and sum ``acc``)
in float32:

* scores of a block: one product ``q @ K_block^T`` per (batch row, KV head), the queries
  of the KV head's query group as rows (the measured-invariant matmul of
  :mod:`detsample.invariant.cpu`: a score's bits depend on its q and k only);
* keys a query may not attend get ``-inf``: ``exp`` gives exactly 0, so a block that is
  partly or wholly out of a query's reach (future keys of a prefill, zero padding of a
  decode, trailing blocks of a longer neighbour) adds exact zeros and rescales by
  ``exp(0) == 1``;
* ``p @ [V | 1 | 0]`` (KEY_BLOCK terms) gives the weighted values and the softmax
  denominator in one product (for the verified products, zero columns to a whole number of
  64-byte lines: :func:`value_width`); the rows of queries that have seen all their keys
  before a block skip it (they would only add exact zeros).

When every query of the call needs every block (a decode step; a chunk whose queries all
see the last block) the blocks are not walked one by one: each block is one more matrix
of a single batched product for the scores and one for ``p @ [V | 1 | 0]`` (a matrix's
bits do not depend on the batch around it: the verified plans check batches of 1, 2, 3, 8
and up to threads + 1 matrices, larger ones taken to behave alike as the loop's own
batches of rows x KV heads always were; the portable product is exact), the exps are one
call, and only the running maximum and the
accumulator's rescale-and-add go block by block, in the loop's order. Same bits as the
loop (tests/invariant/test_attention.py); a decode step of the 135M-parameter benchmark
model spends 2.2 ms per layer here instead of 3.8 ms (docs/performance.md).

A query's blocks therefore hold the same keys at the same offsets whether it is decoded
one token at a time against a KV cache, prefilled with the rest of its prompt, chunked,
or batched with rows of any length. Queries that may attend no key output zeros. The
guarantee covers masks whose allowed keys, per query, are a prefix of its row's keys
(causal attention with any padding); other masks are computed exactly but a key's block
offset then depends on the row's keys before the query's window.

:func:`hf_attention` is the transformers ``AttentionInterface`` function and
:func:`hf_mask` its ``AttentionMaskInterface`` mask (the sdpa boolean mask, always
materialised); :func:`register_attention` registers both under :data:`ATTENTION_NAME`.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.weak import WeakTensorKeyDictionary

from detsample.invariant import cpu
from detsample.invariant.backends import cuda_attention
from detsample.invariant.products import product
from detsample.invariant.state import config

ATTENTION_NAME = "detsample"
KEYS_ATTR = "_detsample_keys"  # the padding mask rides on the 4-D mask hf_mask returns
KEY_BLOCK = 128  # keys per block, counted from the row's key 0
VALUE_STEP = 16  # the value product's columns, a multiple of this (64 bytes of float32)


def value_width(dv: int, portable: bool = False) -> int:
    """Columns of the value product ``p @ [V | 1 | 0]``: the values, the softmax
    denominator, then for the verified products zeros to a multiple of :data:`VALUE_STEP`
    (rows of a whole number of 64-byte lines: torch's batched product writes such an
    output in one call, a narrower one matrix by matrix, 7x slower measured at 72
    matrices of 4 x 65); the portable product, whose cost grows with every column and
    whose bits do not depend on them, takes none."""
    return dv + 1 if portable else -(-(dv + 1) // VALUE_STEP) * VALUE_STEP


def _causal(T: int, L: int, B: int, device: torch.device) -> torch.Tensor:
    """Query t (the last T of L positions) may attend keys ``<= L - T + t``."""
    q = torch.arange(T, device=device)[:, None] + (L - T)
    return (torch.arange(L, device=device)[None, :] <= q).expand(B, T, L)


def _allowed(
    mask: torch.Tensor | None, B: int, T: int, L: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(allowed bool (B, T, L), additive float bias (B, T, L) or None) from an sdpa-style
    mask: bool (True = attend) or float (added to the scores; ``-inf`` / the dtype's
    minimum = masked), shaped (B or 1, 1, T, L) or (T, L)."""
    if mask is None:
        return _causal(T, L, B, device), None
    if mask.dim() == 4:
        if mask.shape[1] != 1:
            raise ValueError(f"attention_mask must have one head (B, 1, T, L), got {tuple(mask.shape)}")
        mask = mask[:, 0]
    mask = mask.expand(B, T, L)
    if mask.dtype == torch.bool:
        return mask, None
    lowest = torch.finfo(mask.dtype).min
    allowed = mask > lowest
    return allowed, torch.where(allowed, mask, 0).to(torch.float32)


@dataclass(frozen=True)
class Extras:
    """What some architectures add to softmax attention.

    ``softcap``: scores become ``softcap * tanh(s / softcap)`` (Gemma 2) before masking;
    ``sinks``: (H,) a learned logit per query head that joins every query's softmax
    denominator with no value (GPT-OSS ``s_aux``); ``keys``: (B, L) bool, the slots of each
    row that hold a token (the padding mask): keys are placed by it, so a query's blocks
    do not depend on which earlier keys its window leaves out (sliding windows)."""

    softcap: float | None = None
    sinks: torch.Tensor | None = None
    keys: torch.Tensor | None = None

    def __post_init__(self) -> None:
        if self.softcap is not None and not float(self.softcap) > 0:
            raise ValueError(f"softcap must be > 0, got {self.softcap!r}")


NONE = Extras()


def attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    mask: torch.Tensor | None = None,
    scale: float | None = None,
    extras: Extras = NONE,
) -> torch.Tensor:
    """Invariant attention (see the module docstring).

    query (B, H, T, D); key (B, Hkv, L, D), value (B, Hkv, L, Dv) with ``H % Hkv == 0``
    (query head h uses KV head ``h // (H // Hkv)``; ``Dv`` may differ from ``D``, as in
    MLA); ``mask``: None (causal, the queries being the last T of the L positions), bool
    (True = may attend) or additive float, shaped (B or 1, 1, T, L) or (T, L). ``scale``
    defaults to ``D ** -0.5``; ``extras``: soft-capping, sinks, the padding mask
    (:class:`Extras`). Returns (B, H, T, Dv) in query's dtype; computed in float32.
    Guarantee: bitwise batch-invariant per query (CPU; any thread count).

    Differentiable: when autograd records (a trainer's forward), the output is the same
    bits and the backward pass recomputes the attention weights (:class:`_Attention`);
    gradients are exact math, not batch-invariant.
    """
    grads = [t for t in (query, key, value, extras.sinks) if t is not None]
    if torch.is_grad_enabled() and any(t.requires_grad for t in grads):
        return _Attention.apply(query, key, value, mask, scale, extras, extras.sinks).to(query.dtype)
    return attend(query, key, value, mask, scale, extras, with_lse=False)[0].to(query.dtype)


class _Attention(torch.autograd.Function):
    """:func:`attend` with a backward: the forward runs the invariant kernel unrecorded
    (same bits as without autograd); the backward recomputes the weights
    ``P = exp(s - lse)`` of the allowed keys (``s = q k^T * scale + bias``) and returns
    ``dq = (P * (dP - rowsum(dO * O))) k * scale``, ``dk``, ``dv = P^T dO``, summed over
    each KV head's query group; queries that may attend no key get zero gradients."""

    @staticmethod
    def forward(ctx, query, key, value, mask, scale, extras, sinks):  # type: ignore[override]
        out, lse = attend(query, key, value, mask, scale, extras)
        ctx.save_for_backward(query, key, value, out, lse, mask if isinstance(mask, torch.Tensor) else None, sinks)
        ctx.scale = query.shape[-1] ** -0.5 if scale is None else float(scale)
        ctx.softcap = extras.softcap
        return out

    @staticmethod
    def backward(ctx, dout):  # type: ignore[override]
        query, key, value, out, lse, mask, sinks = ctx.saved_tensors
        if ctx.softcap is not None or sinks is not None or value.shape[-1] != key.shape[-1]:
            return _dense_backward(ctx, dout, query, key, value, mask, sinks)
        B, H, T, D = query.shape
        Hkv, L = key.shape[1], key.shape[2]
        G, f32 = H // Hkv, torch.float32
        allowed, bias = _allowed(mask, B, T, L, query.device)
        q = query.to(f32)
        k, v = (t.to(f32).repeat_interleave(G, dim=1) for t in (key, value))
        s = torch.matmul(q, k.transpose(-1, -2)) * ctx.scale
        if bias is not None:
            s = s + bias[:, None]
        ok = allowed[:, None] & torch.isfinite(lse)[..., None]
        p = torch.where(ok, torch.exp(s - torch.where(ok, lse[..., None], 0.0)), 0.0)
        do = dout.to(f32)
        dv = torch.matmul(p.transpose(-1, -2), do)
        dp = torch.matmul(do, v.transpose(-1, -2))
        ds = p * (dp - (do * out).sum(dim=-1, keepdim=True))
        dq = torch.matmul(ds, k) * ctx.scale
        dk = torch.matmul(ds.transpose(-1, -2), q) * ctx.scale
        dk, dv = (t.view(B, Hkv, G, L, D).sum(dim=2) for t in (dk, dv))
        return (dq.to(query.dtype), dk.to(key.dtype), dv.to(value.dtype), None, None, None, None)


def _dense_backward(ctx, dout, query, key, value, mask, sinks):  # noqa: ANN001
    """Gradients of soft-capped / sink / unequal-dim attention: autograd through a dense
    float32 recomputation of the same function (exact math, not batch-invariant)."""
    B, H, T, D = query.shape
    Hkv, L = key.shape[1], key.shape[2]
    G, f32 = H // Hkv, torch.float32
    allowed, bias = _allowed(mask, B, T, L, query.device)
    with torch.enable_grad():
        leaves = [t.detach().to(f32).requires_grad_() for t in (query, key, value)]
        sk = sinks.detach().to(f32).requires_grad_() if sinks is not None else None
        q, k, v = leaves
        k, v = k.repeat_interleave(G, dim=1), v.repeat_interleave(G, dim=1)
        s = torch.matmul(q, k.transpose(-1, -2)) * ctx.scale
        if ctx.softcap is not None:
            s = torch.tanh(s / ctx.softcap) * ctx.softcap
        if bias is not None:
            s = s + bias[:, None]
        s = s.masked_fill(~allowed[:, None], -math.inf)
        if sk is not None:
            s = torch.cat([s, sk.view(1, H, 1, 1).expand(B, H, T, 1)], dim=-1)
        p = torch.softmax(s, dim=-1).nan_to_num(0.0)
        o = torch.matmul(p[..., :L], v)
        wrt = leaves + ([sk] if sk is not None else [])
        grads = torch.autograd.grad(o, wrt, dout.to(f32), allow_unused=True)
    dq, dk, dv = (g.to(t.dtype) for g, t in zip(grads[:3], (query, key, value)))
    dsk = grads[3].to(sinks.dtype) if sk is not None else None
    return dq, dk, dv, None, None, None, dsk


def attend(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    mask: torch.Tensor | None = None,
    scale: float | None = None,
    extras: Extras = NONE,
    *,
    with_lse: bool = True,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """:func:`attention` in float32, with the log-sum-exp of each query's scaled scores
    (sinks included): ``((B, H, T, Dv), (B, H, T))``; ``-inf`` for a query that may
    attend no key (and has no sink). ``with_lse`` False: None for the second (not
    computed)."""
    _check_shapes(query, key, value, extras)
    B, H, T, D = query.shape
    Hkv, L, Dv = key.shape[1], key.shape[2], value.shape[3]
    dev, f32 = query.device, torch.float32
    scale = D**-0.5 if scale is None else float(scale)
    G = H // Hkv
    rows = T * G
    lay = key_layout(mask, extras.keys, (B, Hkv, T, G, L), dev)
    lc = lay.lc
    if lc == 0:
        lse = torch.full((B, H, T), -math.inf, dtype=f32, device=dev)
        if extras.sinks is not None:
            lse = extras.sinks.to(f32)[None, :, None].expand(B, H, T).clone()
        return torch.zeros((B, H, T, Dv), dtype=f32, device=dev), lse
    portable = config().portable
    k_c, v_c = _compact(key, value, lay.flat, lc)
    k_c, v_c = (t.to(f32).reshape(B * Hkv, lc, t.shape[3]) for t in (k_c, v_c))
    # queries of one KV head as rows, position-major (row = t * G + g)
    q = query.to(f32).reshape(B, Hkv, G, T, D).transpose(2, 3).reshape(B * Hkv, rows, D)
    masked, add, firsts = lay.masked, lay.add, lay.firsts
    width = value_width(Dv, portable)
    kb, vb = _key_blocks(k_c, v_c, lay.valid, width)
    m, acc = _start(extras.sinks, (B, Hkv, T, G, Dv), dev, width)
    sc = _Scoring(scale, extras.softcap, portable)
    if not any(firsts) and _fits_one_pass(vb, rows, portable):
        m, acc = _every_block(sc, q, (kb, vb), (masked, add), (m, acc))
        return _finish(m, acc, (B, Hkv, T, G, Dv), with_lse)
    for i, first in enumerate(firsts):
        lo, hi = i * KEY_BLOCK, min((i + 1) * KEY_BLOCK, lc)
        r = slice(min(first, rows), rows)
        if r.start == rows:
            continue
        blk = slice(lo, lo + KEY_BLOCK)
        s = sc.scores(q[:, r], kb[:, blk], add[:, r, lo:hi] if add is not None else None, masked[:, r, lo:hi])
        m_old = m[:, r]
        m_new = torch.maximum(m_old, s.amax(dim=2))
        m_safe = torch.where(m_new == -math.inf, 0.0, m_new)
        p = cpu.exp(s.sub_(m_safe[:, :, None]))
        corr = cpu.exp(m_old - m_safe)
        acc[:, r] = acc[:, r].mul_(corr[:, :, None]).add_(product(p, vb[:, blk], portable, keyed=True))
        m[:, r] = m_new
    return _finish(m, acc, (B, Hkv, T, G, Dv), with_lse)


#: the most scores (queries x keys, every KV head of the call) that :func:`attend` computes
#: in one product over all key blocks (a decode step; a chunk whose queries see every
#: block); above it the blocks run one by one (the same bits)
ONE_PASS_SCORES = 1 << 22
#: the portable product's limit: the most values (keys x value columns, every KV head) in
#: one call. Its float64 temporaries are several times the operands; past some size they
#: leave the cache and the one pass is no faster than the loop. Measured on a Zen 2, a
#: decode step over 257 keys with the operands' preparation vectorised: the one pass
#: 151.9 against 172.7 ms (wide Llama, batch 8: 0.8M values), 400 against 464 (the
#: 135M shapes, batch 8: 0.6M), 565 against 621 (batch 16), 921 against 949 (batch 32:
#: 2.4M; medians 1036 against 983, within the noise), 404 against 422 (wide, batch 32: 3.2M)
ONE_PASS_PORTABLE_VALUES = 1 << 22


def _fits_one_pass(vb: torch.Tensor, rows: int, portable: bool) -> bool:
    """Whether every block at once stays within the budgets above (``vb``: the key blocks'
    values (B * Hkv, keys, width), ``rows`` queries per KV head)."""
    n, keys, width = vb.shape
    if n * rows * keys > ONE_PASS_SCORES:
        return False
    return not portable or n * keys * width <= ONE_PASS_PORTABLE_VALUES


@dataclass(frozen=True)
class _Scoring:
    """How a block's scores are formed: ``q k^T * scale``, soft-capped, the additive mask
    added and the keys a query may not attend set to ``-inf``."""

    scale: float
    softcap: float | None
    portable: bool

    def scores(self, q: torch.Tensor, kb: torch.Tensor, add: torch.Tensor | None, masked: torch.Tensor) -> torch.Tensor:
        """q (n, rows, D) against key blocks kb (n, KEY_BLOCK, D): (n, rows, KEY_BLOCK)
        float32; ``add`` / ``masked`` (n, rows, w) cover the first ``w`` keys of each
        block, the keys past them are never attended."""
        s = product(q, kb.transpose(1, 2), self.portable).mul_(self.scale)
        if self.softcap is not None:
            s = cpu.tanh(s / self.softcap).mul_(self.softcap)
        w = masked.shape[-1]
        if add is not None:
            s[:, :, :w].add_(add)
        s[:, :, :w].masked_fill_(masked, -math.inf)
        if w < KEY_BLOCK:  # keys past lc: never allowed
            s[:, :, w:] = -math.inf
        return s


def _by_block(t: torch.Tensor, fill: float | bool) -> torch.Tensor:
    """(n, rows, lc) per-key values as (n * nb, rows, KEY_BLOCK), block-major within each
    n, the keys past lc (to a whole block) set to ``fill``."""
    n, rows, lc = t.shape
    nb = -(-lc // KEY_BLOCK)
    out = t.new_full((n, rows, nb * KEY_BLOCK), fill)
    out[:, :, :lc] = t
    return out.view(n, rows, nb, KEY_BLOCK).transpose(1, 2).reshape(n * nb, rows, KEY_BLOCK)


def _every_block(sc: _Scoring, q: torch.Tensor, kv: tuple, masks: tuple, state: tuple):
    """The block loop of :func:`attend` when every query row needs every block: each
    product once over all blocks (a block is one more matrix of a batched product, whose
    bits do not depend on the batch: see the module docstring), the exps once, and only
    the running max and the accumulator's rescale-and-add block by block, in the loop's
    order: the same bits as the loop (tests/invariant/test_attention.py)."""
    kb, vb = kv
    masked, add = masks
    m, acc = state
    n, rows, D = q.shape
    nb = kb.shape[1] // KEY_BLOCK
    qs = q[:, None].expand(n, nb, rows, D).reshape(n * nb, rows, D)
    blocks = kb.view(n * nb, KEY_BLOCK, D)
    s = sc.scores(qs, blocks, None if add is None else _by_block(add, 0.0), _by_block(masked, True))
    s = s.view(n, nb, rows, KEY_BLOCK)
    top = s.amax(dim=3)
    olds, safes = [], []
    for b in range(nb):
        m_new = torch.maximum(m, top[:, b])
        olds.append(m)
        safes.append(torch.where(m_new == -math.inf, 0.0, m_new))
        m = m_new
    m_old, m_safe = torch.stack(olds, 1), torch.stack(safes, 1)
    p = cpu.exp(s.sub_(m_safe[..., None]))
    corr = cpu.exp(m_old - m_safe)
    pv = product(p.view(n * nb, rows, KEY_BLOCK), vb.view(n * nb, KEY_BLOCK, vb.shape[2]), sc.portable, keyed=True)
    pv = pv.view(n, nb, rows, vb.shape[2])
    for b in range(nb):
        acc = acc.mul_(corr[:, b, :, None]).add_(pv[:, b])
    return m, acc


def _start(sinks: torch.Tensor | None, dims: tuple[int, ...], dev: torch.device, width: int):
    """The running max ``m`` (B*Hkv, T*G) and accumulator ``acc`` (B*Hkv, T*G, width: the
    weighted values, then the denominator) before any key; a sink is a first key of logit
    ``sink`` and value 0."""
    B, Hkv, T, G, Dv = dims
    f32 = torch.float32
    m = torch.full((B * Hkv, T * G), -math.inf, dtype=f32, device=dev)
    acc = torch.zeros((B * Hkv, T * G, width), dtype=f32, device=dev)
    if sinks is not None:
        m = sinks.to(f32).view(Hkv, G)[None, :, None, :].expand(B, Hkv, T, G).reshape(B * Hkv, T * G).clone()
        acc[:, :, Dv] = 1.0
    return m, acc


def _finish(m: torch.Tensor, acc: torch.Tensor, dims: tuple[int, ...], with_lse: bool = True):
    """(output (B, H, T, Dv), log-sum-exp (B, H, T) or None without ``with_lse``) from the
    running max and accumulator."""
    B, Hkv, T, G, Dv = dims
    den = acc[:, :, Dv : Dv + 1]
    res = torch.where(den > 0, acc[:, :, :Dv] / den, 0.0)
    res = res.reshape(B, Hkv, T, G, Dv).transpose(2, 3).reshape(B, Hkv * G, T, Dv)
    if not with_lse:
        return res, None
    lse = m + cpu.log(den[..., 0])
    return res, lse.reshape(B, Hkv, T, G).transpose(2, 3).reshape(B, Hkv * G, T)


def _check_shapes(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, extras: Extras) -> None:
    """A ValueError naming the shapes unless query (B, H, T, D), key (B, Hkv, L, D), value
    (B, Hkv, L, Dv), Hkv dividing H, and sinks (H,)."""
    if query.dim() != 4 or key.dim() != 4 or value.dim() != 4 or value.shape[:3] != key.shape[:3]:
        raise ValueError(
            f"query must be (B, H, T, D), key (B, Hkv, L, D) and value "
            f"(B, Hkv, L, Dv), got {tuple(query.shape)}, {tuple(key.shape)}, "
            f"{tuple(value.shape)}"
        )
    B, H, _, D = query.shape
    if H % key.shape[1] or key.shape[0] != B or key.shape[3] != D:
        raise ValueError(
            f"key/value {tuple(key.shape)} do not match query {tuple(query.shape)}"
            f" (heads must divide, batch and head_dim must agree)"
        )
    if extras.sinks is not None and tuple(extras.sinks.shape) != (H,):
        raise ValueError(f"sinks must have one logit per query head ({H},), got {tuple(extras.sinks.shape)}")


@dataclass(frozen=True)
class KeyLayout:
    """What a call's mask decides, the same for every layer of a forward: ``lc`` keys of
    the longest row (0: no query attends anything, or no query); ``valid`` (B, lc) bool,
    the compacted slots each row has, None when every row has all ``lc``; ``flat`` the
    compaction's gather index (B * lc,), None when the keys already lie in slot order;
    ``masked`` (B * Hkv, T * G, lc) bool, the keys a query may not attend, and ``add``
    the additive mask alike (or None); ``firsts`` per key block the first query row that
    needs it (:func:`_first_rows`)."""

    lc: int
    valid: torch.Tensor | None = None
    flat: torch.Tensor | None = None
    masked: torch.Tensor | None = None
    add: torch.Tensor | None = None
    firsts: tuple[int, ...] = ()


def _make_layout(
    mask: torch.Tensor | None, keys: torch.Tensor | None, dims: tuple[int, ...], dev: torch.device
) -> KeyLayout:
    B, Hkv, T, G, L = dims
    allowed, bias = _allowed(mask, B, T, L, dev)
    real = _row_keys(allowed, keys)  # (B, L): the row's keys
    lens = real.sum(dim=1)
    lc = int(lens.max()) if B and L else 0
    if lc == 0 or T == 0:
        return KeyLayout(0)
    valid = torch.arange(lc, device=dev)[None, :] < lens[:, None]  # (B, lc)
    flat = None
    if torch.equal(real, torch.arange(L, device=dev)[None, :] < lens[:, None]):
        a_c, b_c = allowed[:, :, :lc], None if bias is None else bias[:, :, :lc]
    else:
        order = torch.sort((~real).to(torch.uint8), dim=1, stable=True).indices[:, :lc]
        flat = (order + torch.arange(B, device=dev)[:, None] * L).reshape(-1)
        pick = order[:, None, :].expand(B, T, lc)
        a_c, b_c = allowed.gather(2, pick), None if bias is None else bias.gather(2, pick)
    masked = ~a_c[:, None, :, None].expand(B, Hkv, T, G, lc).reshape(B * Hkv, T * G, lc)
    add = None
    if b_c is not None:
        add = b_c[:, None, :, None].expand(B, Hkv, T, G, lc).reshape(B * Hkv, T * G, lc)
    firsts = tuple(_first_rows(a_c, lc, G))
    return KeyLayout(lc, None if bool(valid.all()) else valid, flat, masked, add, firsts)


_LAYOUTS: WeakTensorKeyDictionary = WeakTensorKeyDictionary()
_LAYOUTS_LOCK = threading.Lock()


def key_layout(
    mask: torch.Tensor | None, keys: torch.Tensor | None, dims: tuple[int, ...], dev: torch.device
) -> KeyLayout:
    """The :class:`KeyLayout` of a call with ``mask`` and padding mask ``keys``, ``dims`` =
    (B, Hkv, T, G, L). A model's layers share one mask tensor per forward: its layout is
    computed at the first layer and kept beside the mask (held weakly: it goes with the
    mask), served again only for the same mask at the same version counter and with the
    same contents (an in-place change of it is never served stale, also one that bypasses
    the counter), the same ``keys`` object at the same version and contents,
    and the same ``dims`` (a decode step of the real-shape benchmark model: ~0.4 ms a
    layer, measured). Not cached: a mask without a version counter (an inference-mode
    tensor), a layout over :data:`LAYOUT_CACHE_BYTES`."""
    if not isinstance(mask, torch.Tensor) or mask.is_inference() or (keys is not None and keys.is_inference()):
        return _make_layout(mask, keys, dims, dev)
    stamp = (mask._version, None if keys is None else keys._version, dims, dev)
    with _LAYOUTS_LOCK:
        hit = _LAYOUTS.get(mask)
    if hit is not None and hit[0] == stamp and hit[1] is keys and _same(hit[2], (mask, keys)):
        return hit[3]
    layout = _make_layout(mask, keys, dims, dev)
    if _layout_bytes(layout) + _bytes(mask) + _bytes(keys) <= LAYOUT_CACHE_BYTES:
        seen = (mask.clone(), None if keys is None else keys.clone())
        with _LAYOUTS_LOCK:
            _LAYOUTS[mask] = (stamp, keys, seen, layout)
    return layout


def _same(seen: tuple, now: tuple) -> bool:
    """Whether the mask and padding mask hold what they held when their layout was made:
    a write that bypasses the version counter (through ``.numpy()`` or ``.data``) is then
    not served a stale layout either (a decode step's mask: a few microseconds)."""
    return all(
        (a is None and b is None) or (a is not None and b is not None and torch.equal(a, b)) for a, b in zip(seen, now)
    )


#: the largest layout kept beside its mask, with the copies of the masks it was made from:
#: a decode step's or a short chunk's (a long prefill's masks, (B * Hkv, T * G, lc), would
#: stay alive as long as the caller keeps the mask; computing them per layer costs little
#: beside that prefill's products)
LAYOUT_CACHE_BYTES = 16 << 20


def _bytes(t: torch.Tensor | None) -> int:
    return 0 if t is None else t.numel() * t.element_size()


def _layout_bytes(layout: KeyLayout) -> int:
    return sum(_bytes(t) for t in (layout.masked, layout.add, layout.valid, layout.flat))


def _compact(key: torch.Tensor, value: torch.Tensor, flat: torch.Tensor | None, lc: int):
    """Each row's keys and values first, in slot order, ``(B, Hkv, lc, D|Dv)``: views
    when they already are (``flat`` None), else gathered by the layout's index."""
    if flat is None:
        return key[:, :, :lc], value[:, :, :lc]
    B, Hkv, L = key.shape[:3]
    return tuple(
        t.transpose(1, 2)
        .reshape(B * L, Hkv * t.shape[3])
        .index_select(0, flat)
        .view(B, lc, Hkv, t.shape[3])
        .transpose(1, 2)
        for t in (key, value)
    )


def _first_rows(a_c: torch.Tensor, lc: int, G: int) -> list[int]:
    """Per key block, the first query row that needs it: block i needs the rows from the
    first position some row attends a key at or past i * KEY_BLOCK (earlier rows attend
    only earlier keys: the block would add exact zeros); seen[t] = 1 + the last key any
    row's query t attends (windows attend fewer than that)."""
    if a_c.shape[1] == 1:  # one query per row (a decode step): every block, with no reduction
        return [0] * -(-lc // KEY_BLOCK)  # (a block it does not reach adds exact zeros)
    dev = a_c.device
    last = torch.where(a_c, torch.arange(1, lc + 1, device=dev), 0).amax(dim=2)  # (B, T)
    seen = last.amax(dim=0).cummax(dim=0).values  # (T,) non-decreasing
    lows = torch.arange(0, lc, KEY_BLOCK, device=dev)
    return (torch.searchsorted(seen, lows, right=True) * G).tolist()


def _key_blocks(
    k: torch.Tensor, v: torch.Tensor, valid: torch.Tensor | None, width: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The compacted keys ``k`` (B * Hkv, lc, D) in whole blocks, (B * Hkv, nb * KEY_BLOCK,
    D), and the values (B * Hkv, lc, Dv) with a column of ones (the softmax denominator)
    as ``[V | 1 | 0]`` (B * Hkv, nb * KEY_BLOCK, ``width`` >= Dv + 1, :func:`value_width`):
    zeros past lc and, with ``valid`` (B, lc), at slots a row does not have, so no
    garbage value ever meets a weight of 0.
    Fresh contiguous tensors: every block of every matrix starts on a 64-byte boundary
    (KEY_BLOCK rows of 4-byte values), whichever call cut it."""
    n, lc, D = k.shape
    Dv = v.shape[2]
    keys = -(-lc // KEY_BLOCK) * KEY_BLOCK
    kb = torch.cat((k, k.new_zeros((n, keys - lc, D))), 1)  # one pass (a copy, then zeros: 1.2x slower)
    vb = v.new_zeros((n, keys, width))
    vb[:, :lc, :Dv] = v
    vb[:, :lc, Dv] = 1.0
    if valid is not None:
        bad = ~valid
        for t in (kb, vb):
            t.view(bad.shape[0], -1, keys, t.shape[2])[:, :, :lc].masked_fill_(bad[:, None, :, None], 0)
    return kb, vb


def _row_keys(allowed: torch.Tensor, keys: torch.Tensor | None) -> torch.Tensor:
    """(B, L) bool: the slots of each row that hold a token. From the padding mask when the
    mask came with one (and it is consistent with the mask: every attended slot holds a
    token), else the slots some query may attend (exact for causal attention without a
    window: the last query attends every earlier token)."""
    some = allowed.any(dim=1)
    if keys is None or tuple(keys.shape) != tuple(some.shape):
        return some
    keys = keys.to(some.device)
    return keys if bool((keys | ~some).all()) else some


def _top_left_causal(T: int, L: int, device: torch.device) -> torch.Tensor:
    """torch SDPA's ``is_causal``: query t may attend keys ``<= t``."""
    return torch.ones((T, L), dtype=torch.bool, device=device).tril()


def _sdpa_inputs(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None,
    dropout_p: float,
    is_causal: bool,
):
    if dropout_p:
        raise ValueError(f"the batch-invariant attention has no dropout, got dropout_p={dropout_p}")
    if is_causal:
        if attn_mask is not None:
            raise ValueError("scaled_dot_product_attention takes attn_mask or is_causal, not both")
        attn_mask = _top_left_causal(query.shape[-2], key.shape[-2], query.device)
    elif attn_mask is None:
        attn_mask = torch.ones((query.shape[-2], key.shape[-2]), dtype=torch.bool, device=query.device)
    squeeze = query.dim() == 3
    if squeeze:
        query, key, value = query[None], key[None], value[None]
        if attn_mask.dim() == 3:
            attn_mask = attn_mask[None]
    if attn_mask.dim() == 4 and attn_mask.shape[1] != 1:
        raise ValueError(
            f"the batch-invariant attention takes one mask for all heads, got "
            f"attn_mask of shape {tuple(attn_mask.shape)}"
        )
    return query, key, value, attn_mask, squeeze


def sdpa_flash_cpu(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    *,
    attn_mask: torch.Tensor | None = None,
    scale: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """aten ``_scaled_dot_product_flash_attention_for_cpu -> (output, logsumexp)``, by
    :func:`attend` (torch's ``is_causal`` is top-left: query t sees keys ``<= t``)."""
    q, k, v, mask, _ = _sdpa_inputs(query, key, value, attn_mask, dropout_p, is_causal)
    out, lse = attend(q, k, v, mask, scale)
    return out.to(query.dtype), lse


def sdpa_math(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    dropout_mask: torch.Tensor | None = None,
    *,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """aten ``_scaled_dot_product_attention_math -> (output, attention weights)``; the
    weights are not materialised (an empty tensor: nothing in inference reads them)."""
    if dropout_mask is not None:
        raise ValueError("the batch-invariant attention has no dropout, got a dropout_mask")
    q, k, v, mask, squeeze = _sdpa_inputs(query, key, value, attn_mask, dropout_p, is_causal)
    out = attend(q, k, v, mask, scale, with_lse=False)[0].to(query.dtype)
    return (out[0] if squeeze else out), query.new_empty((0,))


def _device_attention(device: torch.device) -> Callable[..., torch.Tensor]:
    if device.type == "cpu":
        return attention
    fn = cuda_attention() if device.type == "cuda" else None
    if fn is None:
        raise NotImplementedError(
            f"no batch-invariant attention for device {device.type!r}: the CPU one is "
            f"built in; CUDA needs detsample.kernels.invariant_ops (Triton)"
        )
    return fn


def hf_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers ``AttentionInterface`` function: query (B, H, T, D), key/value
    (B, Hkv, L, D) -> ((B, T, H, D), None)."""
    if dropout and module.training:
        raise ValueError(f"the detsample attention has no dropout, got dropout={dropout} in training mode")
    if kwargs.get("position_bias") is not None:
        raise ValueError("the detsample attention does not support 'position_bias'")
    if query.device.type != "cpu":
        for unsupported in ("softcap", "s_aux", "sinks"):
            if kwargs.get(unsupported) is not None:
                raise ValueError(f"the detsample attention does not support {unsupported!r} on {query.device.type}")
        fn = _device_attention(query.device)
        return fn(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs)
    sinks = kwargs.get("s_aux", kwargs.get("sinks"))
    extras = Extras(softcap=kwargs.get("softcap"), sinks=sinks, keys=getattr(attention_mask, KEYS_ATTR, None))
    out = attention(query, key, value, attention_mask, scaling, extras)
    return out.transpose(1, 2).contiguous(), None


def hf_mask(*args: Any, **kwargs: Any) -> torch.Tensor | None:
    """transformers ``AttentionMaskInterface`` function: the sdpa boolean mask
    (B, 1, T, L), never skipped (no ``is_causal`` shortcut: the attention needs it)."""
    from transformers.masking_utils import sdpa_mask

    kwargs["allow_is_causal_skip"] = False
    kwargs["allow_is_bidirectional_skip"] = False
    mask = sdpa_mask(*args, **kwargs)
    pad, offset, length = kwargs.get("attention_mask"), kwargs.get("kv_offset", 0), kwargs.get("kv_length")
    if (
        isinstance(mask, torch.Tensor)
        and isinstance(pad, torch.Tensor)
        and pad.dim() == 2
        and length is not None
        and pad.shape[1] >= offset + length
    ):
        setattr(mask, KEYS_ATTR, pad[:, offset : offset + length].to(torch.bool))
    return mask


def register_attention() -> bool:
    """Register :func:`hf_attention` (and :func:`hf_mask` where this transformers has an
    ``AttentionMaskInterface``) as ``"detsample"``; idempotent. False when transformers
    has no ``AttentionInterface`` (too old) or is not installed."""
    try:
        from transformers import AttentionInterface
    except ImportError:
        return False
    AttentionInterface.register(ATTENTION_NAME, hf_attention)
    try:
        from transformers.masking_utils import AttentionMaskInterface
    except ImportError:  # older transformers build the mask without an interface
        return True
    AttentionMaskInterface.register(ATTENTION_NAME, hf_mask)
    return True
