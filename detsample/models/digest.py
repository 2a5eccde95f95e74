"""A content hash of a model's weights, for reports that must name the weights they ran
(not only the factory or directory that gave them).

:func:`weights_digest` hashes every tensor of a model's state in name order -- its name,
dtype, shape and bytes -- so two loads of the same weights give the same digest whatever
their path, and any changed bit gives another. It reads the weights once (about 1 s per
GB on one core).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping

import torch


def _tensors(model: object) -> Mapping[str, torch.Tensor] | None:
    """The named tensors of a model adapter (``HFCausalLM.module``, the reference model's
    ``weights``), of a ``torch.nn.Module``, or of a mapping of tensors; None otherwise."""
    for inner in (getattr(model, "module", None), getattr(model, "model", None), model):
        if isinstance(inner, torch.nn.Module):
            return inner.state_dict()
        weights = getattr(inner, "weights", inner)
        if isinstance(weights, Mapping) and weights and all(isinstance(v, torch.Tensor) for v in weights.values()):
            return weights
    return None


def weights_digest(model: object) -> str | None:
    """``"sha256:<hex>"`` of the model's weights (see the module docstring), or None when
    ``model`` holds no tensors detsample can find."""
    tensors = _tensors(model)
    if tensors is None:
        return None
    h = hashlib.sha256()
    for name in sorted(tensors):
        t = tensors[name].detach().to("cpu").contiguous()
        h.update(f"{name}\0{t.dtype}\0{tuple(t.shape)}\0".encode())
        flat = t.reshape(-1)
        if flat.numel():
            h.update(
                flat.view(torch.uint8).numpy().tobytes()
                if t.dtype != torch.bool
                else flat.to(torch.uint8).numpy().tobytes()
            )
    return "sha256:" + h.hexdigest()
