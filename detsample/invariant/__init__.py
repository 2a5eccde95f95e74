"""Batch-invariant mode for float models (docs/batch-invariant.md).

``detsample.batch_invariant()`` (also :func:`enable` / :func:`disable`) replaces, for the
duration of a block, the aten kernels a decoder-only transformer runs on CPU by kernels
whose every output row depends on its own input row only (:mod:`.cpu`, listed in
:mod:`.overrides`), and registers the invariant attention with transformers as ``"detsample"``
(:mod:`.attention`). :mod:`.coverage` lists the ops a forward runs that the mode leaves to
torch.

Importing this package changes nothing: no kernel is registered until the mode is entered.
"""

from detsample.invariant.attention import ATTENTION_NAME, attention, hf_attention, register_attention
from detsample.invariant.mode import batch_invariant, disable, enable, is_enabled
from detsample.invariant.overrides import OVERRIDES, Override, kernels_by_key

__all__ = [
    "ATTENTION_NAME",
    "OVERRIDES",
    "Override",
    "attention",
    "batch_invariant",
    "disable",
    "enable",
    "hf_attention",
    "is_enabled",
    "kernels_by_key",
    "register_attention",
]
