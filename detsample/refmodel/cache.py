"""Per-sequence KV cache of the reference model."""

from __future__ import annotations

import torch

from detsample.refmodel.config import RefModelConfig


class KVCache:
    """Keys and values of one sequence: per layer, int64 ``[length, n_heads, head_dim]``.

    Filled by :meth:`RefModel.prefill` / :meth:`RefModel.decode` (never by hand);
    ``token_ids`` are the tokens the cache holds, ``len(cache)`` their count.
    """

    def __init__(self, config: RefModelConfig | None = None, capacity: int = 64) -> None:
        config = config if config is not None else RefModelConfig()
        self.config = config
        self.token_ids: list[int] = []
        shape = (max(1, min(capacity, config.max_seq_len)), config.n_heads, config.head_dim)
        self._k = [torch.zeros(shape, dtype=torch.int64) for _ in range(config.n_layers)]
        self._v = [torch.zeros(shape, dtype=torch.int64) for _ in range(config.n_layers)]

    def __len__(self) -> int:
        return len(self.token_ids)

    def keys(self, layer: int, upto: int | None = None) -> torch.Tensor:
        return self._k[layer][: len(self) if upto is None else upto]

    def values(self, layer: int, upto: int | None = None) -> torch.Tensor:
        return self._v[layer][: len(self) if upto is None else upto]

    def truncate(self, n: int) -> None:
        """Keep the first ``n`` tokens (speculative decoding drops rejected drafts); the
        slots after them are overwritten by the next forward."""
        if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= len(self):
            raise ValueError(f"truncate: n must be in [0, {len(self)}], got {n!r}")
        del self.token_ids[n:]

    def clone(self) -> KVCache:
        """An independent copy (e.g. to fork a sequence)."""
        c = KVCache(self.config, capacity=len(self))
        c.token_ids = list(self.token_ids)
        c._k = [t.clone() for t in self._k]
        c._v = [t.clone() for t in self._v]
        return c

    def _reserve(self, total: int) -> None:
        cap = self._k[0].shape[0]
        if total <= cap:
            return
        new = min(max(total, 2 * cap), self.config.max_seq_len)
        for buf in (self._k, self._v):
            for i, t in enumerate(buf):
                grown = torch.zeros((new,) + tuple(t.shape[1:]), dtype=torch.int64)
                grown[:cap] = t
                buf[i] = grown

    def _write(self, layer: int, start: int, k: torch.Tensor, v: torch.Tensor) -> None:
        self._k[layer][start : start + k.shape[0]] = k
        self._v[layer][start : start + v.shape[0]] = v
