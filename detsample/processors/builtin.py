"""Built-in min-p, logit bias and min-tokens expressed as :class:`LogitsProcessor`\\ s.

These read the same ``SamplingParams`` fields as the core and call the same pure ops,
and ``apply`` is tested bit-for-bit equal to the core op on the same logits after any
sequence of filter/merge/advance (tests/processors/test_builtin.py). The Sampler does
NOT register them by default: the core keeps logit bias at step 5, min-p inside step 8
and min_new_tokens at step 3, because the pipeline position is part of the contract
and a step-1 processor sees the logits *before* sanitising and penalties (a repetition
penalty scales a biased logit differently from an unbiased one; min-p must see the
penalised, temperature-scaled distribution). Registering one of these on a Sampler
therefore applies that feature a second time, at step 1; they exist as reference
implementations of the interface, for engines that run processors elsewhere, and as
templates for user processors (docs/sampling-penalties.md).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from detsample import arith, rules
from detsample.ops.bias import apply_logit_bias_, bias_coo
from detsample.ops.host import host_tensor
from detsample.ops.temperature import row_max, scale_logits
from detsample.processors.base import SlotProcessor
from detsample.processors.batch_update import AddedRequest
from detsample.processors.penalties import ban_pairs_, min_tokens_stops


class _CachedSlots(SlotProcessor):
    """Caches device tensors derived from the slots until the next non-None update (or a
    call on another device): built once per batch change, not copied every step."""

    def __init__(self) -> None:
        super().__init__()
        self._cache_key: tuple | None = None
        self._cache = None

    def cached(self, build, device: torch.device):
        key = (self._version, device)
        if self._cache_key != key:
            self._cache = build(device)
            self._cache_key = key
        return self._cache


class LogitBiasLogitsProcessor(_CachedSlots):
    """``params.logit_bias`` (pipeline step 5 in the core)."""

    def is_argmax_invariant(self) -> bool:
        return False

    def make_entry(self, added: AddedRequest):
        return added.params.logit_bias or None

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        coo = self.cached(lambda dev: bias_coo(self.slots, dev), logits.device)
        if coo is None:
            return logits
        return apply_logit_bias_(logits, *coo)


class MinTokensLogitsProcessor(SlotProcessor):
    """``params.min_new_tokens``: -inf on the stop ids (``params.stop_token_ids`` and
    ``eos_token_ids``) while the row's output is shorter (pipeline step 3 in the core)."""

    def __init__(self, eos_token_ids: Sequence[int] = (0,)) -> None:
        super().__init__()
        self.eos_token_ids = tuple(int(t) for t in eos_token_ids)

    def is_argmax_invariant(self) -> bool:
        return False

    def make_entry(self, added: AddedRequest):
        p = added.params
        stops = min_tokens_stops(p, self.eos_token_ids)
        if p.min_new_tokens == 0 or not stops:
            return None
        return p.min_new_tokens, stops, added.output_ids_ref

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        pairs = [(i, t) for i, e in enumerate(self.slots) if e is not None and len(e[2]) < e[0] for t in e[1]]
        ban_pairs_(logits, pairs)
        return logits


class MinPLogitsProcessor(_CachedSlots):
    """``params.min_p`` on sampling rows: ``-inf`` where ``exp((x - max) / T) <
    float32(min_p)``, the core's step-8 rule, on the logits it is given. Argmax
    invariant (the maximum always survives)."""

    def is_argmax_invariant(self) -> bool:
        return True

    def make_entry(self, added: AddedRequest):
        p = added.params
        if p.is_greedy or p.min_p == 0.0:
            return None
        return p.min_p, p.temperature

    def _rows(self, device: torch.device):
        rows = self.rows_with_entries()
        if not rows:
            return None
        return (
            host_tensor(rows, torch.int64, device),
            host_tensor([self.slots[i][0] for i in rows], torch.float32, device),
            host_tensor([[self.slots[i][1]] for i in rows], torch.float32, device),
        )

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        cached = self.cached(self._rows, logits.device)
        if cached is None:
            return logits
        rows, min_p, temps = cached
        x = logits.index_select(0, rows)
        z = scale_logits(x, row_max(x), temps)
        drop = rules.min_p_drops(arith.exp(z), min_p.unsqueeze(1))
        return logits.index_copy_(0, rows, x.masked_fill(drop, float("-inf")))
