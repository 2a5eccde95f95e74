"""Configuration of the reference model (frozen, validated at construction).

The fixed-point formats below are part of the model's definition: every activation is an
int64 holding ``round(real * 2**ACT_FRAC)``, every weight an int64 holding
``round(real * 2**W_FRAC)``. ``docs/refmodel.md`` explains why this makes a position's
logits independent of batch shape, batch composition and thread count.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from detsample.errors import DetsampleError

ACT_FRAC = 8  # activations: int = real * 2**8
ACT_MAX = 2**20  # every activation is clamped to [-ACT_MAX, ACT_MAX]
W_FRAC = 10  # weights: int = real * 2**10
GAIN_FRAC = 8  # RMSNorm gains: int = real * 2**8
ATT_PROB_BITS = 16  # unnormalised attention weights are ints in [0, 2**16]
ATT_SHIFT = 10  # score difference >> ATT_SHIFT indexes the exp table
LOGIT_FRAC = 16  # logits: float32 = int * 2**-16, |int| < 2**24 (exact in float32)
LOGIT_INT_MAX = 2**24 - 1
NORM_EPS = 1.0  # added to mean(x_int**2) inside the RMSNorm square root


class RefModelError(DetsampleError, ValueError):
    """Invalid reference-model configuration, weights file or input (field and value named)."""


def _positive_int(name: str, v: object) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise RefModelError(f"{name} must be an integer, got {v!r}")
    if v < 1:
        raise RefModelError(f"{name} must be >= 1, got {v!r}")
    return v


@dataclass(frozen=True)
class RefModelConfig:
    """Shape and seed of the reference model.

    ``d_ff`` defaults to ``4 * d_model``. ``seed`` (a non-negative int < 2**64) fully
    determines the weights (see :mod:`detsample.refmodel.weights`).
    """

    vocab_size: int = 512
    n_layers: int = 2
    d_model: int = 64
    n_heads: int = 4
    max_seq_len: int = 1024
    seed: int = 0
    d_ff: int | None = None

    def __post_init__(self) -> None:
        for name in ("vocab_size", "n_layers", "d_model", "n_heads", "max_seq_len"):
            _positive_int(name, getattr(self, name))
        if self.vocab_size < 257:
            raise RefModelError(f"vocab_size must be >= 257 (EOS + 256 byte tokens), got {self.vocab_size!r}")
        if self.d_model % self.n_heads:
            raise RefModelError(
                f"d_model must be divisible by n_heads, got d_model={self.d_model!r}, n_heads={self.n_heads!r}"
            )
        if self.d_model > 4096:
            raise RefModelError(f"d_model must be <= 4096, got {self.d_model!r}")
        if self.max_seq_len > 65536:
            raise RefModelError(f"max_seq_len must be <= 65536, got {self.max_seq_len!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or not 0 <= self.seed < 2**64:
            raise RefModelError(f"seed must be an integer in [0, 2**64), got {self.seed!r}")
        if self.d_ff is None:
            object.__setattr__(self, "d_ff", 4 * self.d_model)
        else:
            _positive_int("d_ff", self.d_ff)
            if self.d_ff > 16384:
                raise RefModelError(f"d_ff must be <= 16384, got {self.d_ff!r}")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @property
    def att_step(self) -> float:
        """Real-valued softmax-logit decrement per exp-table entry."""
        return 2.0**ATT_SHIFT / (2.0 ** (2 * ACT_FRAC) * math.sqrt(self.head_dim))

    @property
    def exp_table_len(self) -> int:
        """Entries until exp(-n * att_step) * 2**ATT_PROB_BITS rounds to 0 (last entry 0)."""
        return int(math.ceil((ATT_PROB_BITS + 1) * math.log(2) / self.att_step)) + 1

    def to_dict(self) -> dict[str, int]:
        return {
            "vocab_size": self.vocab_size,
            "n_layers": self.n_layers,
            "d_model": self.d_model,
            "n_heads": self.n_heads,
            "max_seq_len": self.max_seq_len,
            "seed": self.seed,
            "d_ff": self.d_ff,
        }
