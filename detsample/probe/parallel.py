"""The ``tensor_parallel`` check: a model's logits at TP = 2, 4, ... against TP=1, bitwise.

:func:`check_tensor_parallel` runs the probe's forwards (:class:`~detsample.probe.model.ProbeConfig`:
the prompt by one prefill, the padded batch of mixed lengths, one decode step of every
row) on the unsharded model in this process (TP=1: what a trainer runs) and, for each
TP size, on a local process group of that many ranks
(:func:`detsample.parallel.tp_group`), and compares every logit and the sampled token's
raw logprob (``log_softmax``) bit for bit (:func:`detsample.probe.compare.bits_equal`).

Where they differ, the first differing position is localised: the same forward is
recorded on rank 0 and at TP=1 (:mod:`detsample.probe.localize`), rank 0's shards
(its heads, intermediate features, vocabulary rows) compared with the leading block of
TP=1's tensors (:func:`~detsample.probe.localize.shard_of`), and the first module and op
that differ are named. A row-parallel layer (o_proj, down_proj) summing its partial
products with torch's floating-point all-reduce shows as that layer's product (rank 0's
partial ``aten::mm`` over its share of K), reported as ``aten::mm + c10d::allreduce_``
with the distance of the layer's output (after the all-reduce).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from detsample.models.base import CausalLM
from detsample.parallel import RowParallelLinear, TPModelSpec, check_spec, tp_group
from detsample.parallel.group import DEFAULT_TIMEOUT
from detsample.probe.localize import Divergence, Side, divergence, from_data, record, shard_of, to_data
from detsample.probe.model import ProbeConfig, _compare, _Probe, _slot
from detsample.probe.report import ProbeCheck

CHECK_NAME = "tensor_parallel"
ROW_PARALLEL_OP = "aten::mm + c10d::allreduce_"
_PARTS = ("prefill", "batch", "decode")


def forwards(model: CausalLM, cfg: ProbeConfig) -> dict[str, torch.Tensor]:
    """The compared logits: ``prefill`` (the prompt, every position), ``batch`` (every
    row of the padded batch, concatenated) and ``decode`` (one step of every row)."""
    p = _Probe(model, cfg)
    caches, outs = p.batch()
    steps = model.forward(caches, [[t] for t in p.next_tokens])
    return {"prefill": p.full(), "batch": torch.cat(outs), "decode": torch.cat(steps)}


def _side(model: CausalLM, cfg: ProbeConfig, part: str, pos: int) -> Side:
    """The recorded forward of ``part`` holding flat position ``pos`` of its logits."""
    p = _Probe(model, cfg)
    if part == "prefill":
        return p.side_full(pos)
    if part == "batch":
        row, start = 0, 0
        while start + len(p.rows[row]) <= pos:
            start, row = start + len(p.rows[row]), row + 1
        width = max(len(r) for r in p.rows)
        col = _slot(model, len(p.rows[row]), width) + pos - start
        return Side(lambda: p.batch(), row, col, len(p.rows), width)
    caches = p.batch()[0]
    return Side(lambda: model.forward(caches, [[t] for t in p.next_tokens]), pos, 0, len(p.rows), 1)


# -- rank jobs (module-level: the ranks import them by name) -----------------------------


def job_forwards(lm: Any, comm: Any, cfg: ProbeConfig) -> dict[str, torch.Tensor]:
    return forwards(lm, cfg)


def job_record(lm: Any, comm: Any, cfg: ProbeConfig, part: str, pos: int) -> dict | None:
    """Every rank runs the forward; rank 0 records it (its records are the result)."""
    side = _side(lm, cfg, part, pos)
    if comm.rank != 0:
        with torch.no_grad():
            side.call()
        return None
    rec = record(side, lm.module, lm.name)
    data = to_data(rec)
    data["row_parallel"] = [n for n, m in lm.module.named_modules() if isinstance(m, RowParallelLinear)]
    return data


def _localize(reference: CausalLM, cfg: ProbeConfig, group: Any, part: str, pos: int) -> tuple[Divergence | None, str]:
    try:
        data = group.call(job_record, cfg, part, pos)
        ref = record(_side(reference, cfg, part, pos), reference.module, reference.name)
        ops, modules = from_data(data)
        found = divergence((ops, modules), (ref.ops, ref.modules), align=shard_of)
        out = divergence(([], modules), ([], ref.modules), align=shard_of)
    except Exception as e:  # noqa: BLE001 - a model the recorder cannot follow: report it
        return None, f"; not localised ({type(e).__name__}: {e})"
    if found is None:
        return None, "; not localised (no followed tensor differs)"
    if found.module in data["row_parallel"] and found.op == "aten::mm":
        # rank 0's partial product differs from the whole by construction: the distance
        # that means something is the layer's output, after the all-reduce
        ulp, gap = (
            (out.max_ulp, out.max_abs)
            if out is not None and out.module == found.module
            else (found.max_ulp, found.max_abs)
        )
        found = Divergence(found.module, ROW_PARALLEL_OP, found.shapes, ulp, gap)
    return found, ""


def check_tensor_parallel(
    reference: CausalLM,
    spec: str,
    sizes: Sequence[int],
    *,
    batch_invariant: bool = False,
    portable: bool = False,
    config: ProbeConfig | None = None,
    seed: int = 0,
    timeout: float = DEFAULT_TIMEOUT,
    start_method: str = "spawn",
) -> ProbeCheck:
    """The ``tensor_parallel`` check of model ``spec`` (``reference``: it loaded at TP=1,
    in this process) for every TP size of ``sizes`` (1 is the reference itself). Raises
    :class:`~detsample.parallel.TensorParallelError` for a size the layout refuses,
    before any rank starts. ``timeout`` / ``start_method``: of the rank groups
    (:class:`~detsample.parallel.RankGroup`)."""
    cfg = config or ProbeConfig()
    sizes = sorted(set(sizes))
    specs = [
        TPModelSpec(spec, tp, batch_invariant, portable, seed=seed, padding=getattr(reference, "padding", "left"))
        for tp in sizes
        if tp > 1
    ]
    for s in specs:
        check_spec(s, reference)
    ref = forwards(reference, cfg)
    parts, div, note, ok = [], None, "", True
    for s in specs:
        with tp_group(s, timeout=timeout, start_method=start_method) as group:
            out = group.call(job_forwards, cfg)
            cmps = {k: _compare(out[k], ref[k], cfg.seed) for k in _PARTS}
            bad = [k for k in _PARTS if not cmps[k].ok]
            parts.append(f"TP={s.tp}: " + "; ".join(f"{k} {cmps[k].text()}" for k in _PARTS))
            if bad and ok:
                ok = False
                if cfg.localize:
                    div, note = _localize(reference, cfg, group, bad[0], cmps[bad[0]].differing[0])
    head = "logits vs TP=1 (this process, unsharded)"
    if not specs:
        return ProbeCheck(CHECK_NAME, True, f"{head}: no TP size > 1 asked (--tp {','.join(map(str, sizes))})")
    return ProbeCheck(CHECK_NAME, ok, f"{head}: " + " | ".join(parts) + note, div)
