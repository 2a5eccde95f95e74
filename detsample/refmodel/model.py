"""The reference model: a tiny causal transformer whose logits are batch-invariant by construction.

Architecture (pre-norm): token + learned position embedding; per layer RMSNorm ->
multi-head causal attention -> residual, RMSNorm -> ReLU MLP -> residual; final RMSNorm ->
lm_head. All tensors are int64 fixed point and every kernel is exact integer arithmetic
(:mod:`detsample.refmodel.intops`), so a position's logits are a function of the token
prefix alone: **bitwise** identical from :meth:`RefModel.prefill`, chunked prefill, or
:meth:`RefModel.decode` in a batch of any size, order and mix of lengths, at any thread
count. ``docs/refmodel.md`` gives the argument.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import torch

from detsample.refmodel import intops
from detsample.refmodel import weights as _weights
from detsample.refmodel.cache import KVCache
from detsample.refmodel.config import ACT_FRAC, LOGIT_FRAC, LOGIT_INT_MAX, W_FRAC, RefModelConfig, RefModelError


def _as_ids(name: str, ids: object, vocab_size: int) -> list[int]:
    if isinstance(ids, torch.Tensor):
        if ids.dim() != 1 or ids.dtype.is_floating_point or ids.dtype == torch.bool:
            raise RefModelError(f"{name} must be a 1-D integer tensor, got {ids.dtype} {tuple(ids.shape)}")
        ids = ids.tolist()
    if isinstance(ids, (str, bytes)) or not hasattr(ids, "__iter__"):
        raise RefModelError(f"{name} must be a sequence of token ids, got {ids!r}")
    out = []
    for t in ids:
        if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < vocab_size:
            raise RefModelError(f"{name} must hold token ids in [0, {vocab_size}), got {t!r}")
        out.append(int(t))
    return out


class RefModel:
    """Tiny batch-invariant causal LM.

    >>> m = RefModel(RefModelConfig(seed=0))
    >>> logits = m.prefill([1, 2, 3])             # [3, V] float32
    >>> cache = m.new_cache(); _ = m.prefill([1, 2], cache)
    >>> step = m.decode([cache], [3])              # [1, V] float32, == logits[2:3] bitwise
    """

    def __init__(self, config: RefModelConfig | None = None, weights: dict[str, torch.Tensor] | None = None) -> None:
        self.config = config if config is not None else RefModelConfig()
        if weights is None:
            weights = _weights.generate(self.config)
        shapes = _weights.expected_shapes(self.config)
        for k, shape in shapes.items():
            t = weights.get(k)
            if t is None or t.dtype != torch.int64 or tuple(t.shape) != shape:
                raise RefModelError(
                    f"weights[{k!r}] must be int64 {shape}, got {None if t is None else (t.dtype, tuple(t.shape))}"
                )
        self.weights = {k: weights[k] for k in shapes}

    # -- persistence -------------------------------------------------------------------
    def save(self, path: str | os.PathLike) -> None:
        """Write config and weights to a safetensors file (atomic)."""
        _weights.save(path, self.config, self.weights)

    @classmethod
    def load(cls, path: str | os.PathLike) -> RefModel:
        config, weights = _weights.load(path)
        return cls(config, weights)

    # -- the model-adapter protocol (detsample.models.CausalLM) -------------------------
    name = "refmodel"

    @property
    def vocab_size(self) -> int:
        return self.config.vocab_size

    @property
    def max_seq_len(self) -> int:
        return self.config.max_seq_len

    # -- inference ---------------------------------------------------------------------
    def new_cache(self) -> KVCache:
        return KVCache(self.config)

    def prefill(
        self, token_ids: Sequence[int], cache: KVCache | None = None, *, return_cache: bool = False
    ) -> torch.Tensor | tuple[torch.Tensor, KVCache]:
        """Logits ``[T, V]`` float32 of every position of ``token_ids``.

        With ``cache``, the tokens continue the sequence the cache holds (chunked prefill)
        and are appended to it. ``return_cache=True`` returns ``(logits, cache)``.
        """
        cache = cache if cache is not None else self.new_cache()
        logits = self.forward([cache], [token_ids])[0]
        return (logits, cache) if return_cache else logits

    def decode(self, caches: Sequence[KVCache], token_ids: Sequence[int] | torch.Tensor) -> torch.Tensor:
        """One step for B sequences: ``token_ids[b]`` is appended to ``caches[b]``.

        Returns ``[B, V]`` float32; row b is bitwise the logits that a full prefill of
        ``caches[b].token_ids`` gives at its last position.
        """
        ids = _as_ids("token_ids", token_ids, self.config.vocab_size)
        if len(ids) != len(caches):
            raise RefModelError(f"token_ids must have one id per cache ({len(caches)}), got {len(ids)}")
        out = self.forward(caches, [[t] for t in ids])
        if not out:
            return torch.empty((0, self.config.vocab_size), dtype=torch.float32)
        return torch.cat(out)

    def forward(self, caches: Sequence[KVCache], chunks: Sequence[Sequence[int]]) -> list[torch.Tensor]:
        """Ragged batch: appends ``chunks[b]`` to ``caches[b]``; returns logits ``[T_b, V]`` per b."""
        cfg, w = self.config, self.weights
        ids = self._check(caches, chunks)
        B = len(caches)
        if B == 0:
            return []
        T = max(len(c) for c in ids)
        starts = torch.tensor([len(c) for c in caches], dtype=torch.int64)
        ends = starts + torch.tensor([len(c) for c in ids], dtype=torch.int64)
        tok = torch.zeros((B, T), dtype=torch.int64)
        for b, c in enumerate(ids):
            tok[b, : len(c)] = torch.tensor(c, dtype=torch.int64)
        offs = torch.arange(T, dtype=torch.int64)
        pos = (starts[:, None] + offs).clamp(max=cfg.max_seq_len - 1)  # padding: any valid row
        keys = torch.arange(int(ends.max()), dtype=torch.int64)
        # mask[b, 0, i, j]: key j exists and is not after query i (padded queries see keys too)
        mask = (
            (keys[None, None, :] < ends[:, None, None]) & (keys[None, None, :] <= (starts[:, None] + offs)[:, :, None])
        )[:, None]
        for cache, e in zip(caches, ends.tolist()):
            cache._reserve(e)
        x = intops.clamp_act(w["tok_emb"][tok] + w["pos_emb"][pos])  # [B, T, D]
        for layer in range(cfg.n_layers):
            x = self._layer(layer, x, caches, ids, starts, mask)
        xn = intops.rms_norm(x, w["final_norm"])
        logits = round_logits(torch.matmul(xn, w["lm_head"])).to(torch.float32) * (2.0**-LOGIT_FRAC)
        for cache, c in zip(caches, ids):
            cache.token_ids.extend(c)
        return [logits[b, : len(c)] for b, c in enumerate(ids)]

    def _check(self, caches: Sequence[KVCache], chunks: Sequence[Sequence[int]]) -> list[list[int]]:
        """The chunks as token-id lists, or RefModelError naming the cache or chunk at fault."""
        cfg = self.config
        if len(caches) != len(chunks):
            raise RefModelError(f"chunks must have one entry per cache ({len(caches)}), got {len(chunks)}")
        if len({id(c) for c in caches}) != len(caches):
            raise RefModelError("caches must be distinct objects, got the same cache twice")
        ids = [_as_ids(f"chunks[{b}]", c, cfg.vocab_size) for b, c in enumerate(chunks)]
        for b, (cache, c) in enumerate(zip(caches, ids)):
            if not isinstance(cache, KVCache) or cache.config != cfg:
                raise RefModelError(f"caches[{b}] must be a KVCache of this model")
            if not c:
                raise RefModelError(f"chunks[{b}] must not be empty")
            if len(cache) + len(c) > cfg.max_seq_len:
                raise RefModelError(
                    f"sequence {b} would have {len(cache) + len(c)} tokens, more than max_seq_len={cfg.max_seq_len}"
                )
        return ids

    def _layer(
        self,
        layer: int,
        x: torch.Tensor,
        caches: Sequence[KVCache],
        ids: list[list[int]],
        starts: torch.Tensor,
        mask: torch.Tensor,
    ) -> torch.Tensor:
        """One decoder layer on ``x`` [B, T, D] (int64): its keys and values written to the
        caches, attention over each row's keys, the MLP."""
        cfg, w, p = self.config, self.weights, f"layers.{layer}."
        B, T = x.shape[:2]
        H, Dh, Lk = cfg.n_heads, cfg.head_dim, mask.shape[-1]
        xn = intops.rms_norm(x, w[p + "attn_norm"])
        q, k, v = (intops.linear(xn, w[p + n], W_FRAC).view(B, T, H, Dh) for n in ("wq", "wk", "wv"))
        kk = torch.zeros((B, Lk, H, Dh), dtype=torch.int64)
        vv = torch.zeros((B, Lk, H, Dh), dtype=torch.int64)
        for b, cache in enumerate(caches):
            s, n = int(starts[b]), len(ids[b])
            cache._write(layer, s, k[b, :n], v[b, :n])
            kk[b, : s + n] = cache.keys(layer, s + n)
            vv[b, : s + n] = cache.values(layer, s + n)
        att = intops.attention(
            q.transpose(1, 2), kk.transpose(1, 2), vv.transpose(1, 2), mask, w["exp_table"]
        )  # [B, H, T, Dh]
        att = att.transpose(1, 2).reshape(B, T, H * Dh)
        x = intops.clamp_act(x + intops.linear(att, w[p + "wo"], W_FRAC))
        xn = intops.rms_norm(x, w[p + "mlp_norm"])
        hid = intops.relu(intops.linear(xn, w[p + "w1"], W_FRAC))
        return intops.clamp_act(x + intops.linear(hid, w[p + "w2"], W_FRAC))


def round_logits(acc: torch.Tensor) -> torch.Tensor:
    """lm_head accumulator (scale 2**-(ACT_FRAC+W_FRAC)) -> int64 logits at scale 2**-LOGIT_FRAC.

    Clamped to ``|l| <= 2**24 - 1`` so the conversion to float32 is exact.
    """
    shift = ACT_FRAC + W_FRAC - LOGIT_FRAC
    return intops.round_shift(acc, shift).clamp(-LOGIT_INT_MAX, LOGIT_INT_MAX)
