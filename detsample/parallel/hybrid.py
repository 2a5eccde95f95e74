"""A hybrid's layers split over the ranks: linear-attention heads and gated attention
(Qwen3.5), Mamba 2 mixers and ungated MLPs (Nemotron-H).

* **Gated delta-net** (``linear_attn`` of Qwen3.5): its key heads split in contiguous
  blocks (``world`` divides ``linear_num_key_heads``), each rank's value heads those its
  key heads serve (value head ``j`` reads key head ``j // (Hv / Hk)``, so a block of key
  heads serves a block of value heads). ``in_proj_qkv``'s rows (``[q; k; v]``) cut to this
  rank's q, k and v features, the depthwise ``conv1d`` to the same channels, ``in_proj_z``
  to its value features, ``in_proj_b`` / ``in_proj_a``, ``A_log`` and ``dt_bias`` to its
  value heads; the gated norm (over one head's ``head_v_dim``) replicated; ``out_proj``
  row-parallel (the exact combine under the portable mode). Every rank keeps its own
  heads' state (convolution windows, recurrent states) in its cache: a head's state is a
  function of that head's rows alone, so each rank's is TP=1's slice, bit for bit.
* **Gated attention** (Qwen3.5's full-attention layers): ``q_proj`` holds, per head, its
  query and its output gate (``2 x head_dim`` rows), cut by heads; ``k_proj`` / ``v_proj``
  by KV heads as GQA's; ``q_norm`` / ``k_norm`` (over ``head_dim``) replicated; ``o_proj``
  row-parallel.
* **Mamba 2** (Nemotron-H's ``mixer``): groups of heads in contiguous blocks (``world``
  divides ``n_groups``; head ``h`` is in group ``h // (H / G)`` and a group's heads share
  its B and C): ``in_proj``'s ``[gate; x; B; C; dt]`` rows and the convolution's
  ``[x; B; C]`` channels each cut to the rank's block, ``A_log`` / ``D`` / ``dt_bias`` to
  its heads, the gated norm's weight to its features (the norm is per group, so whole
  groups keep their bits), ``out_proj`` row-parallel.
* **Ungated MLP** (Nemotron-H's ``up_proj`` -> activation -> ``down_proj``): ``up_proj``
  column-, ``down_proj`` row-parallel.

Each ``check_*`` raises :class:`~detsample.parallel.layers.TensorParallelError` naming the
module and what it lacks.
"""

from __future__ import annotations

from typing import Any

import torch

from detsample.parallel.blocks import GQA, block, check_linears
from detsample.parallel.comm import Comm
from detsample.parallel.layers import RowParallelLinear, TensorParallelError, column_shard, filled

GDN_LINEARS = ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a", "out_proj")
GDN_ATTRS = (
    "num_k_heads",
    "num_v_heads",
    "head_k_dim",
    "head_v_dim",
    "key_dim",
    "value_dim",
    "A_log",
    "dt_bias",
    "conv1d",
)


def _check_mixer(mixer: Any, where: str, parts: tuple[tuple[str, ...], tuple[str, ...]], what: str) -> None:
    """``mixer`` has the linears and attributes of ``parts`` and a depthwise ``conv1d``."""
    linears, attrs = parts
    check_linears(mixer, where, linears)
    missing = [a for a in attrs if not hasattr(mixer, a)]
    if missing:
        raise TensorParallelError(
            f"tensor parallel: {where} ({type(mixer).__name__}) has no "
            f"{', '.join(missing)}; the {what} split needs them"
        )
    conv = mixer.conv1d
    if not isinstance(conv, torch.nn.Conv1d) or conv.groups != conv.in_channels:
        raise TensorParallelError(f"tensor parallel: {where}.conv1d is not a depthwise nn.Conv1d")


def check_gdn(gdn: Any, where: str, world: int) -> None:
    """A gated delta-net ``world`` can split by heads, or TensorParallelError."""
    _check_mixer(gdn, where, (GDN_LINEARS, GDN_ATTRS), "gated delta-net")
    hk, hv = gdn.num_k_heads, gdn.num_v_heads
    if hk % world:
        raise TensorParallelError(
            f"tensor parallel: tp={world} does not divide the linear_num_key_heads={hk} of {where}"
        )
    if hv % hk:
        raise TensorParallelError(
            f"tensor parallel: {where}: linear_num_value_heads={hv} is not a multiple of linear_num_key_heads={hk}"
        )


def _conv_channels(conv: torch.nn.Conv1d, parts: list[slice]) -> torch.nn.Conv1d:
    """A depthwise ``nn.Conv1d`` of ``parts`` of ``conv``'s channels (its kernel, padding)."""
    w = torch.cat([conv.weight.detach()[p] for p in parts])
    bias = None if conv.bias is None else torch.cat([conv.bias.detach()[p] for p in parts])
    out = torch.nn.Conv1d(
        w.shape[0],
        w.shape[0],
        conv.kernel_size[0],
        groups=w.shape[0],
        padding=conv.padding,
        bias=bias is not None,
        device=w.device,
        dtype=w.dtype,
    )
    return filled(out, w, bias)


def _param_rows(p: torch.nn.Parameter, rows: slice) -> torch.nn.Parameter:
    return torch.nn.Parameter(p.detach()[rows].clone(), requires_grad=False)


def shard_gdn(gdn: Any, comm: Comm) -> None:
    """``gdn`` (a gated delta-net, checked by :func:`check_gdn`) cut to this rank's heads."""
    w, r = comm.world, comm.rank
    kh, vh = gdn.num_k_heads // w, gdn.num_v_heads // w
    keys = block(r, gdn.key_dim, w)
    values = block(r, gdn.value_dim, w)
    heads = block(r, gdn.num_v_heads, w)
    k_off, v_off = gdn.key_dim, 2 * gdn.key_dim
    qkv = [keys, slice(keys.start + k_off, keys.stop + k_off), slice(values.start + v_off, values.stop + v_off)]
    gdn.in_proj_qkv = column_shard(gdn.in_proj_qkv, qkv)
    gdn.conv1d = _conv_channels(gdn.conv1d, qkv)
    gdn.in_proj_z = column_shard(gdn.in_proj_z, values)
    gdn.in_proj_b = column_shard(gdn.in_proj_b, heads)
    gdn.in_proj_a = column_shard(gdn.in_proj_a, heads)
    gdn.A_log = _param_rows(gdn.A_log, heads)
    gdn.dt_bias = _param_rows(gdn.dt_bias, heads)
    gdn.out_proj = RowParallelLinear(gdn.out_proj, values, comm)
    gdn.num_k_heads, gdn.num_v_heads = kh, vh
    gdn.key_dim, gdn.value_dim = kh * gdn.head_k_dim, vh * gdn.head_v_dim
    gdn.conv_dim = 2 * gdn.key_dim + gdn.value_dim


def check_gated_attention(att: Any, where: str, heads: int, head_dim: int) -> None:
    """Qwen3.5's gated attention: q/k/v/o linears and a ``q_proj`` of ``2 x heads x
    head_dim`` rows (query and gate per head)."""
    check_linears(att, where, GQA)
    if att.q_proj.out_features != 2 * heads * head_dim:
        raise TensorParallelError(
            f"tensor parallel: {where}.q_proj has {att.q_proj.out_features} output features; "
            f"a gated attention's has 2 x {heads} heads x {head_dim} (query and gate per head)"
        )


def shard_gated_attention(att: Any, heads: int, kv_rows: slice, comm: Comm) -> None:
    """``att`` cut to this rank's ``heads`` query heads (query and gate rows of each) and
    its KV heads' ``kv_rows``."""
    r, d = comm.rank, att.head_dim
    att.q_proj = column_shard(att.q_proj, slice(r * heads * 2 * d, (r + 1) * heads * 2 * d))
    att.k_proj = column_shard(att.k_proj, kv_rows)
    att.v_proj = column_shard(att.v_proj, kv_rows)
    att.o_proj = RowParallelLinear(att.o_proj, slice(r * heads * d, (r + 1) * heads * d), comm)
    att.num_key_value_groups = heads // ((kv_rows.stop - kv_rows.start) // d)


MAMBA2_ATTRS = (
    "num_heads",
    "head_dim",
    "n_groups",
    "ssm_state_size",
    "intermediate_size",
    "conv_dim",
    "A_log",
    "D",
    "dt_bias",
    "norm",
    "conv1d",
)


def check_mamba2(mixer: Any, where: str, world: int) -> None:
    """A Mamba 2 mixer (Nemotron-H's) ``world`` can split by groups of heads, or
    TensorParallelError."""
    _check_mixer(mixer, where, (("in_proj", "out_proj"), MAMBA2_ATTRS), "Mamba 2")
    groups, heads = mixer.n_groups, mixer.num_heads
    if groups % world:
        raise TensorParallelError(
            f"tensor parallel: tp={world} does not divide the n_groups={groups} "
            f"of {where} (a rank holds whole groups: their heads share B and C)"
        )
    inner = mixer.intermediate_size
    rows = inner + mixer.conv_dim + heads
    grouped = getattr(mixer.norm, "group_size", None) == inner // groups
    if heads % groups or mixer.in_proj.out_features != rows or not grouped:
        raise TensorParallelError(
            f"tensor parallel: {where}: in_proj has {mixer.in_proj.out_features} output features "
            f"(the split expects gate {inner} + x, B, C {mixer.conv_dim} + dt {heads}), or its "
            f"heads ({heads}) or gated norm's groups do not follow n_groups={groups}"
        )


def shard_mamba2(mixer: Any, comm: Comm) -> None:
    """``mixer`` (checked by :func:`check_mamba2`) cut to this rank's groups and their heads.

    ``in_proj``'s rows are ``[gate (I); x (I); B (G N); C (G N); dt (H)]`` and the
    convolution's channels ``[x; B; C]``: each cut to this rank's block (heads ``h`` of
    group ``h // (H / G)``: a block of groups is a block of heads)."""
    w, r = comm.world, comm.rank
    inner, gn, heads = mixer.intermediate_size, mixer.n_groups * mixer.ssm_state_size, mixer.num_heads
    feats, bc, hs = block(r, inner, w), block(r, gn, w), block(r, heads, w)

    def at(s: slice, off: int) -> slice:
        return slice(s.start + off, s.stop + off)

    conv = [feats, at(bc, inner), at(bc, inner + gn)]
    mixer.in_proj = column_shard(
        mixer.in_proj, [feats] + [at(s, inner) for s in conv] + [at(hs, inner + mixer.conv_dim)]
    )
    mixer.conv1d = _conv_channels(mixer.conv1d, conv)
    for name in ("A_log", "D", "dt_bias"):
        setattr(mixer, name, _param_rows(getattr(mixer, name), hs))
    mixer.norm.weight = _param_rows(mixer.norm.weight, feats)
    mixer.out_proj = RowParallelLinear(mixer.out_proj, feats, comm)
    mixer.num_heads, mixer.n_groups = heads // w, mixer.n_groups // w
    mixer.intermediate_size = inner // w
    mixer.conv_dim = mixer.intermediate_size + 2 * mixer.n_groups * mixer.ssm_state_size


def check_plain_mlp(mlp: Any, where: str, world: int) -> int:
    """An ungated MLP (``up_proj`` -> activation -> ``down_proj``: Nemotron-H's): its
    per-rank features, or TensorParallelError."""
    check_linears(mlp, where, ("up_proj", "down_proj"))
    n = mlp.up_proj.out_features
    if n % world:
        raise TensorParallelError(
            f"tensor parallel: tp={world} does not divide the {n} intermediate features of {where}"
        )
    return n // world


def shard_plain_mlp(mlp: Any, comm: Comm) -> None:
    rows = block(comm.rank, mlp.up_proj.out_features, comm.world)
    mlp.up_proj = column_shard(mlp.up_proj, rows)
    mlp.down_proj = RowParallelLinear(mlp.down_proj, rows, comm)
