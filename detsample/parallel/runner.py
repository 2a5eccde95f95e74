"""A model spec run tensor-parallel: every rank loads it, cuts its shards, and runs the same calls.

:class:`TPModelSpec` names what every rank builds: a :func:`detsample.models.load_model`
spec (``hf-tiny-llama``, ``pkg.module:factory``, ...), the TP size and the mode.
:func:`load_sharded` (run inside a rank) loads the model, replaces its layers by this
rank's shards (:func:`detsample.parallel.layout.shard_model`) and returns the usual
adapter (:class:`~detsample.models.hf.HFCausalLM`), whose ``forward`` now returns the
full, gathered logits on every rank. :func:`tp_group` starts the ranks with it.

Every rank runs the driver code (engine, sampler, probe forwards) itself, on the same
inputs: the engine's decisions (tokens, batch composition) are functions of the logits,
which are the same bits on every rank, so the ranks stay in step without exchanging
anything but the layers' collectives. Requests must carry their seeds (the engine's
rollouts do): a seed drawn from OS entropy would differ between ranks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from detsample.parallel.comm import Comm
from detsample.parallel.group import DEFAULT_TIMEOUT, RankGroup
from detsample.parallel.layers import VERIFIED_REFUSED, TensorParallelError
from detsample.parallel.layout import plan, shard_model


@dataclass(frozen=True)
class TPModelSpec:
    """``model`` (a load_model spec) over ``tp`` ranks; ``batch_invariant`` / ``portable``:
    the mode its forwards run under (tp > 1 under the mode needs ``portable``);
    ``seed``: the tiny models' weights; ``padding``: the adapter's."""

    model: str
    tp: int
    batch_invariant: bool = False
    portable: bool = False
    seed: int = 0
    padding: str = "left"

    def __post_init__(self) -> None:
        if not isinstance(self.model, str) or not self.model:
            raise TensorParallelError(f"model must be a non-empty model spec, got {self.model!r}")
        if isinstance(self.tp, bool) or not isinstance(self.tp, int) or self.tp < 1:
            raise TensorParallelError(f"tp must be an int >= 1, got {self.tp!r}")
        if self.portable and not self.batch_invariant:
            raise TensorParallelError("portable=True needs batch_invariant=True")
        if self.tp > 1 and self.batch_invariant and not self.portable:
            raise TensorParallelError(VERIFIED_REFUSED)


def load_sharded(comm: Comm, spec: TPModelSpec) -> Any:
    """This rank's model: ``spec.model`` loaded, its layers replaced by this rank's shards."""
    from detsample.models import load_model

    if comm.world != spec.tp:
        raise TensorParallelError(f"the group has {comm.world} ranks, the spec asks tp={spec.tp}")
    lm = load_model(
        spec.model, padding=spec.padding, seed=spec.seed, batch_invariant=spec.batch_invariant, portable=spec.portable
    )
    shard_model(lm, comm)
    if comm.world > 1 and _backend() == "nccl":  # written, not run by this project's tests
        import torch

        lm.module.to(torch.device("cuda", torch.cuda.current_device()))
    return lm


def _backend() -> str | None:
    import torch.distributed as dist

    return dist.get_backend() if dist.is_available() and dist.is_initialized() else None


def check_spec(spec: TPModelSpec, model: Any = None) -> None:
    """Refuse, before any rank starts, what :func:`load_sharded` would refuse: the model
    (``model``, already loaded, or loaded here) checked against ``spec.tp``; a model
    directory's head counts are checked from its config.json before its weights load."""
    if model is None:
        from detsample.models import is_model_dir_spec, load_model
        from detsample.models.hfdir import config_tp_problem

        problem = is_model_dir_spec(spec.model) and config_tp_problem(spec.model, spec.tp)
        if problem:  # from config.json, before the weights load
            raise TensorParallelError(problem)
        model = load_model(spec.model, padding=spec.padding, seed=spec.seed)
    plan(model, spec.tp)


def tp_group(
    spec: TPModelSpec,
    *,
    timeout: float = DEFAULT_TIMEOUT,
    threads: int = 1,
    backend: str = "gloo",
    start_method: str = "spawn",
) -> RankGroup:
    """``spec.tp`` ranks, each holding its shards of ``spec.model`` (the state of every
    :meth:`~detsample.parallel.group.RankGroup.call`: the sharded adapter)."""
    return RankGroup(
        spec.tp, load_sharded, (spec,), timeout=timeout, threads=threads, backend=backend, start_method=start_method
    )
