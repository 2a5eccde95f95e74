"""The reference architecture in float32 with the usual kernels: a negative control.

``RefModelFloat(RefModel())`` computes what the int64 reference model computes, with the
same (dequantised) weights, through ``F.linear``, float ``mean`` and SDPA. It is a
faithful float model and NOT batch-invariant: on this machine class ``F.linear`` rounds a
row differently in 1-3-row batches than in 4+-row batches, so a position's logits differ
between decode (one row) and a prefill (T rows), and between a sequence alone and in a
padded batch. The probe must report that (tests/models/test_refmodel_float.py).

Ragged batches are right-padded into one ``(B, T, D)`` computation, as an engine would.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from detsample.models.base import ModelError, SeqCache, check_chunks
from detsample.refmodel import RefModel
from detsample.refmodel.config import ACT_FRAC, GAIN_FRAC, W_FRAC


class FloatSeqCache(SeqCache):
    """Per layer ``(n_heads, len, head_dim)`` float32 keys and values of one sequence."""

    length_dim = 1


class RefModelFloat:
    """Float32 twin of a :class:`~detsample.refmodel.RefModel` (a ``CausalLM``)."""

    def __init__(self, model: RefModel | None = None, name: str = "refmodel-float") -> None:
        m = model if model is not None else RefModel()
        self.cfg = m.config
        self.name = name
        self.vocab_size = m.config.vocab_size
        self.max_seq_len = m.config.max_seq_len

        def deq(key: str) -> torch.Tensor:
            frac = GAIN_FRAC if "norm" in key else ACT_FRAC if "emb" in key else W_FRAC
            return m.weights[key].to(torch.float32) * 2.0**-frac

        self.w = {k: deq(k) for k in m.weights if k != "exp_table"}

    def new_cache(self) -> FloatSeqCache:
        return FloatSeqCache()

    @staticmethod
    def _norm(x: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + 1e-5) * g

    def forward(self, caches: Sequence[FloatSeqCache], chunks: Sequence[Sequence[int]]) -> list[torch.Tensor]:
        for b, c in enumerate(caches):
            if not isinstance(c, FloatSeqCache):
                raise ModelError(f"caches[{b}] must be a FloatSeqCache from new_cache(), got {type(c).__name__}")
        ids = check_chunks(caches, chunks, self.vocab_size, self.max_seq_len)
        if not ids:
            return []
        w, cfg = self.w, self.cfg
        H, Dh = cfg.n_heads, cfg.d_model // cfg.n_heads
        B, T = len(ids), max(len(c) for c in ids)
        starts = [len(c) for c in caches]
        Lk = max(s + len(c) for s, c in zip(starts, ids))
        tok = torch.zeros((B, T), dtype=torch.int64)
        pos = torch.zeros((B, T), dtype=torch.int64)
        for b, c in enumerate(ids):
            tok[b, : len(c)] = torch.tensor(c)
            pos[b, : len(c)] = torch.arange(starts[b], starts[b] + len(c))
        q_pos = torch.tensor(starts)[:, None] + torch.arange(T)[None, :]  # (B, T)
        ends = torch.tensor([s + len(c) for s, c in zip(starts, ids)])
        keys = torch.arange(Lk)
        mask = ((keys[None, None, :] < ends[:, None, None]) & (keys[None, None, :] <= q_pos[:, :, None]))[
            :, None
        ]  # (B, 1, T, Lk)
        x = w["tok_emb"][tok] + w["pos_emb"][pos]
        for layer in range(cfg.n_layers):
            p = f"layers.{layer}."
            xn = self._norm(x, w[p + "attn_norm"])
            q, k, v = (F.linear(xn, w[p + n].T).view(B, T, H, Dh).transpose(1, 2) for n in ("wq", "wk", "wv"))
            kk = x.new_zeros((B, H, Lk, Dh))
            vv = x.new_zeros((B, H, Lk, Dh))
            for b, c in enumerate(caches):
                s, n = starts[b], len(ids[b])
                if len(c.layers) <= layer:
                    c.layers.append((k[b, :, :0], v[b, :, :0]))
                K = torch.cat([c.layers[layer][0], k[b, :, :n]], 1)
                V = torch.cat([c.layers[layer][1], v[b, :, :n]], 1)
                c.layers[layer] = (K, V)
                kk[b, :, : s + n], vv[b, :, : s + n] = K, V
            att = F.scaled_dot_product_attention(q, kk, vv, attn_mask=mask)
            x = x + F.linear(att.transpose(1, 2).reshape(B, T, H * Dh), w[p + "wo"].T)
            hid = F.relu(F.linear(self._norm(x, w[p + "mlp_norm"]), w[p + "w1"].T))
            x = x + F.linear(hid, w[p + "w2"].T)
        logits = F.linear(self._norm(x, w["final_norm"]), w["lm_head"].T)
        for c, chunk in zip(caches, ids):
            c.token_ids.extend(chunk)
        return [logits[b, : len(c)] for b, c in enumerate(ids)]
