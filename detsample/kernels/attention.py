"""Attention with a fixed KV split: one program per (batch, head, block of queries).

Each query row walks the keys from position 0 in blocks of ``BLOCK_N`` keys (the fixed
split), keeping an online softmax (running max, running sum, running output) in float32.
The blocks start at absolute key positions ``0, BLOCK_N, 2*BLOCK_N, ...`` whatever the
number of queries, and a block the row may not see (causal or masked) is an exact no-op
(``exp(0) == 1`` rescaling, zero weights). There is no split of the keys across
programs and nothing depends on the batch size: a query's output is bitwise the same
alone or in any batch, by prefill (all queries), chunked prefill or decode (one query
against the KV cache), as long as its keys sit at the same positions.

Shapes follow ``torch.nn.functional.scaled_dot_product_attention``: q (B, H, Lq, D),
k / v (B, Hkv, Lk, D) with ``H % Hkv == 0`` (grouped-query heads share a KV head),
output (B, H, Lq, D) in q's dtype. Queries are the LAST ``Lq`` positions of the ``Lk``
keys (the KV-cache convention), so ``causal`` lets query i see keys ``<= Lk - Lq + i``.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from detsample.kernels.common import OPTS, check_device

#: (BLOCK_M queries, BLOCK_N keys per KV block): fixed, part of the bits (with OPTS)
BLOCK_M, BLOCK_N = 16, 32


@triton.jit
def _attn_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    m_ptr,
    o_ptr,
    H,
    GROUP,
    Lq,
    Lk,
    D,
    scale,
    q_off,
    s_qb,
    s_qh,
    s_qm,
    s_qd,
    s_kb,
    s_kh,
    s_kn,
    s_kd,
    s_vb,
    s_vh,
    s_vn,
    s_vd,
    s_mb,
    s_mh,
    s_mm,
    s_mn,
    s_ob,
    s_oh,
    s_om,
    s_od,
    CAUSAL: tl.constexpr,
    MASK: tl.constexpr,
    IEEE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    bh = tl.program_id(1)
    b = (bh // H).to(tl.int64)
    h = (bh % H).to(tl.int64)
    hk = h // GROUP
    rm = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    rd = tl.arange(0, BLOCK_D)
    q = tl.load(
        q_ptr + b * s_qb + h * s_qh + rm[:, None] * s_qm + rd[None, :] * s_qd,
        mask=(rm[:, None] < Lq) & (rd[None, :] < D),
        other=0.0,
    )
    qpos = q_off + rm
    m_i = tl.full((BLOCK_M,), float("-inf"), tl.float32)
    l_i = tl.zeros((BLOCK_M,), tl.float32)
    acc = tl.zeros((BLOCK_M, BLOCK_D), tl.float32)
    for n0 in range(0, Lk, BLOCK_N):
        rn = n0 + tl.arange(0, BLOCK_N)
        kt = tl.load(
            k_ptr + b * s_kb + hk * s_kh + rn[None, :] * s_kn + rd[:, None] * s_kd,
            mask=(rn[None, :] < Lk) & (rd[:, None] < D),
            other=0.0,
        )
        if IEEE:
            s = tl.dot(q, kt, input_precision="ieee") * scale
        else:
            s = tl.dot(q, kt) * scale
        ok = (rn[None, :] < Lk) & (rm[:, None] < Lq)
        if CAUSAL:
            ok = ok & (rn[None, :] <= qpos[:, None])
        if MASK == 1:  # boolean, True = attend
            ok = ok & (
                tl.load(m_ptr + b * s_mb + h * s_mh + rm[:, None] * s_mm + rn[None, :] * s_mn, mask=ok, other=0) != 0
            )
        if MASK == 2:  # additive
            s = s + tl.load(
                m_ptr + b * s_mb + h * s_mh + rm[:, None] * s_mm + rn[None, :] * s_mn, mask=ok, other=0.0
            ).to(tl.float32)
        s = tl.where(ok, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp(m_i - m_safe)
        p = tl.exp(s - m_safe[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(
            v_ptr + b * s_vb + hk * s_vh + rn[:, None] * s_vn + rd[None, :] * s_vd,
            mask=(rn[:, None] < Lk) & (rd[None, :] < D),
            other=0.0,
        )
        if IEEE:
            pv = tl.dot(p, v, input_precision="ieee")
        else:
            pv = tl.dot(p.to(v.dtype), v)
        acc = acc * alpha[:, None] + pv
        m_i = m_new
    out = tl.where(l_i[:, None] > 0, acc / l_i[:, None], 0.0)
    tl.store(
        o_ptr + b * s_ob + h * s_oh + rm[:, None] * s_om + rd[None, :] * s_od,
        out.to(o_ptr.dtype.element_ty),
        mask=(rm[:, None] < Lq) & (rd[None, :] < D),
    )


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    mask: torch.Tensor | None = None,
    causal: bool = False,
    scale: float | None = None,
) -> torch.Tensor:
    """Scaled dot-product attention with a fixed KV split (see the module docstring).

    q: (B, H, Lq, D); k, v: (B, Hkv, Lk, D), one float dtype (float32, bfloat16,
    float16). mask: None, boolean (True = attend) or additive float, broadcastable to
    (B, H, Lq, Lk). causal: query i sees keys ``<= Lk - Lq + i``. scale: default
    ``1/sqrt(D)``. Returns (B, H, Lq, D) in q's dtype; a row that sees no key is 0.
    Bitwise batch-invariant; prefill, chunked prefill and decode agree bitwise.
    """
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError(f"attention needs 4-D q, k, v, got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    B, H, Lq, D = q.shape
    Hkv, Lk = k.shape[1], k.shape[2]
    if k.shape != v.shape or k.shape[0] != B or k.shape[3] != D or H % Hkv:
        raise ValueError(f"attention shapes do not match: q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}")
    if not (q.dtype == k.dtype == v.dtype) or not q.dtype.is_floating_point:
        raise ValueError(f"q, k, v must share one float dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    check_device(q.device)
    out = torch.empty((B, H, Lq, D), dtype=q.dtype, device=q.device)
    if out.numel() == 0:
        return out
    kind = 0
    m = out
    if mask is not None:
        kind = 1 if mask.dtype == torch.bool else 2
        m = mask.expand(B, H, Lq, Lk)
        if kind == 1:
            m = m.to(torch.int8)
    scale = 1.0 / math.sqrt(D) if scale is None else float(scale)
    grid = (triton.cdiv(Lq, BLOCK_M), B * H)
    _attn_kernel[grid](
        q,
        k,
        v,
        m,
        out,
        H,
        H // Hkv,
        Lq,
        Lk,
        D,
        scale,
        Lk - Lq,
        *q.stride(),
        *k.stride(),
        *v.stride(),
        *m.stride(),
        *out.stride(),
        CAUSAL=bool(causal),
        MASK=kind,
        IEEE=q.dtype == torch.float32,
        BLOCK_M=BLOCK_M,
        BLOCK_N=BLOCK_N,
        BLOCK_D=max(16, triton.next_power_of_2(D)),
        **OPTS,
    )
    return out


def hf_attention(
    module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """transformers' ``AttentionInterface`` signature around :func:`attention`: returns
    ``(output (B, Lq, H, D), None)``. Causal when no mask is given and the module (or
    the ``is_causal`` keyword) says so and there is more than one query, as transformers'
    sdpa path decides. Dropout must be 0 (inference)."""
    if dropout:
        raise ValueError(f"dropout must be 0 for the invariant attention, got {dropout}")
    is_causal = kwargs.get("is_causal", getattr(module, "is_causal", True))
    causal = bool(attention_mask is None and is_causal and query.shape[2] > 1)
    mask = attention_mask
    if mask is not None and mask.shape[-1] != key.shape[2]:
        mask = mask[..., : key.shape[2]]
    out = attention(query, key, value, mask=mask, causal=causal, scale=scaling)
    return out.transpose(1, 2).contiguous(), None
