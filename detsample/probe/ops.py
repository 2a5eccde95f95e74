"""Op micro-probes: which of the ops a transformer runs are batch-invariant HERE.

For every op of :data:`OP_NAMES` and every dtype asked, :func:`probe_ops` measures, bitwise:

* ``batch_invariant``: row 0 computed alone, ``op(x[:1])``, against row 0 of a batch,
  ``op(x[:n])[:1]``, for every ``n`` of :data:`ROW_SIZES` (sizes chosen to cross the
  kernels' blocking heuristics), at every thread count asked. For the attention probes
  ``scaled_dot_product_attention[...]/decode`` the rows are QUERIES: the last query of a
  causal prefill of ``n`` tokens against the same query alone over the same ``n`` keys
  (a decode step), for ``n`` in :data:`QUERY_LENGTHS` (block edges of the CPU and GPU
  kernels); the plain ``scaled_dot_product_attention[...]`` probes batch along dim 0.
* ``run_to_run``: the largest size twice, same bits.
* ``threads``: the largest size at each thread count against the first (CPU; ``None``
  on CUDA, where the count does not apply, or when only one count is asked).

Inputs are seeded (one ``torch.Generator`` per probe, float32 normal values cast to the
dtype), so two runs probe the same numbers. Nothing here changes global state except the
scoped thread count (:func:`detsample.probe.threads.torch_threads`).
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager as ContextManager
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from detsample.probe.compare import diff
from detsample.probe.threads import torch_threads

ROW_SIZES = (1, 2, 3, 4, 8, 15, 16, 17, 64, 255, 256, 257)
QUERY_LENGTHS = (1, 2, 3, 4, 8, 15, 16, 17, 31, 32, 33, 63, 64, 65, 191, 192, 193, 255, 256, 257, 511, 512, 513)
ATTN_BATCH_LEN = 33  # query = key length of the batch-dim attention probe
HEADS, HEAD_DIM = 4, 64
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}

Outputs = tuple[torch.Tensor, ...]
# (alone, the same row inside the batch, the whole batch's outputs)
_Pair = tuple[Outputs, Outputs, Outputs]


@dataclass(frozen=True)
class OpResult:
    """One op at one dtype. ``first_differing_sizes`` is ``[1, n]``: the first size whose
    row 0 (for ``/decode``: the query length whose last query) differs from the op alone,
    or None. ``max_ulp`` / ``max_abs`` are over every comparison made (0 when all hold).
    ``aten_ops``: the aten ops (no views) the probe ran, named by :func:`aten_name`
    (``"aten::mm"``, ``"aten::mean.dim"``). ``threads`` is None when not measured."""

    op: str
    dtype: str
    batch_invariant: bool
    run_to_run: bool
    threads: bool | None
    first_differing_sizes: list[int] | None
    max_ulp: int
    max_abs: float
    aten_ops: tuple[str, ...]

    @property
    def ok(self) -> bool:
        return self.batch_invariant and self.run_to_run and self.threads is not False

    def to_json(self) -> dict[str, Any]:
        return {
            "op": self.op,
            "dtype": self.dtype,
            "batch_invariant": self.batch_invariant,
            "run_to_run": self.run_to_run,
            "threads": self.threads,
            "first_differing_sizes": self.first_differing_sizes,
            "max_ulp": self.max_ulp,
        }


@dataclass(frozen=True)
class _Probe:
    """``make(max_size, dtype, device, gen) -> inputs``; ``pair(inputs, n) -> (alone, in
    batch, whole batch)``: the first two must be bitwise equal, the third is what run to
    run and thread counts compare; ``sizes`` the n's probed."""

    name: str
    make: Callable[[int, torch.dtype, torch.device, torch.Generator], tuple]
    pair: Callable[[tuple, int], _Pair]
    sizes: tuple[int, ...] = ROW_SIZES
    backend: Any = None


def _randn(
    gen: torch.Generator, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device, scale: float = 1.0
) -> torch.Tensor:
    return (scale * torch.randn(shape, generator=gen)).to(device=device, dtype=dtype)


def _as_tuple(out: Any) -> Outputs:
    return tuple(out) if isinstance(out, (tuple, list)) else (out,)


def _rows(fn: Callable[..., Any], row_dim: int = 0) -> Callable[[tuple, int], _Pair]:
    """``pair`` of a row op ``fn(x, *consts)``: row 0 alone vs row 0 of the first ``n``."""

    def pair(inputs: tuple, n: int) -> _Pair:
        x, consts = inputs[0], inputs[1:]
        alone = _as_tuple(fn(x.narrow(row_dim, 0, 1), *consts))
        full = _as_tuple(fn(x.narrow(row_dim, 0, n), *consts))
        return alone, tuple(o.narrow(row_dim, 0, 1) for o in full), full

    return pair


def _x(width: int, scale: float = 1.0):
    return lambda m, dt, dev, g: (_randn(g, (m, width), dt, dev, scale),)


def _x_w(k: int, n: int, bias: bool = False, transposed: bool = False):
    def make(m, dt, dev, g):
        w = _randn(g, (n, k) if transposed else (k, n), dt, dev, k**-0.5)
        out = (_randn(g, (m, k), dt, dev), w)
        return out + ((_randn(g, (n,), dt, dev),) if bias else ())

    return make


def _norm_make(width: int, bias: bool):
    def make(m, dt, dev, g):
        out = (_randn(g, (m, width), dt, dev), 1.0 + _randn(g, (width,), dt, dev, 0.1))
        return out + ((_randn(g, (width,), dt, dev, 0.1),) if bias else ())

    return make


def _bmm_make(m, dt, dev, g):
    return _randn(g, (m, 16, 64), dt, dev), _randn(g, (m, 64, 64), dt, dev, 0.125)


def _bmm_pair(inputs: tuple, n: int) -> _Pair:
    x, y = inputs
    full = torch.bmm(x[:n], y[:n])
    return (torch.bmm(x[:1], y[:1]),), (full[:1],), (full,)


def _embedding_make(m, dt, dev, g):
    ids = torch.randint(0, 32000, (m, 16), generator=g).to(dev)
    return ids, _randn(g, (32000, 256), dt, dev)


def _attn_make(m, dt, dev, g, *, batch: bool):
    shape = (m, HEADS, ATTN_BATCH_LEN, HEAD_DIM) if batch else (1, HEADS, m, HEAD_DIM)
    return tuple(_randn(g, shape, dt, dev) for _ in range(3))


def _sdpa(backend: Any) -> Callable[..., torch.Tensor]:
    if backend is None:
        return F.scaled_dot_product_attention

    def run(*args: Any, **kw: Any) -> torch.Tensor:
        from torch.nn.attention import sdpa_kernel

        with sdpa_kernel([backend]):
            return F.scaled_dot_product_attention(*args, **kw)

    return run


def _attn_batch_pair(backend: Any):
    attn = _sdpa(backend)

    def pair(inputs: tuple, n: int) -> _Pair:
        q, k, v = inputs
        full = attn(q[:n], k[:n], v[:n], is_causal=True)
        return (attn(q[:1], k[:1], v[:1], is_causal=True),), (full[:1],), (full,)

    return pair


def _attn_query_pair(backend: Any):
    attn = _sdpa(backend)

    def pair(inputs: tuple, n: int) -> _Pair:
        q, k, v = (t[:, :, :n] for t in inputs)
        decode = attn(q[:, :, n - 1 :], k, v)
        prefill = attn(q, k, v, is_causal=True)
        return (decode,), (prefill[:, :, n - 1 :],), (prefill,)

    return pair


def _linear3d(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return F.linear(x.unsqueeze(0), w, b).squeeze(0)  # (1, n, K): as a model calls it


_ROW_PROBES: tuple[_Probe, ...] = (
    _Probe("mm", _x_w(512, 512), _rows(torch.mm)),
    _Probe("addmm", _x_w(512, 512, bias=True), _rows(lambda x, w, b: torch.addmm(b, x, w))),
    _Probe("matmul", _x_w(512, 512), _rows(lambda x, w: torch.matmul(x.unsqueeze(0), w).squeeze(0))),
    _Probe("linear", _x_w(512, 512, bias=True, transposed=True), _rows(_linear3d)),
    _Probe("bmm", _bmm_make, _bmm_pair),
    _Probe("sum", _x(65536), _rows(lambda x: x.sum(-1))),
    _Probe("mean", _x(65536), _rows(lambda x: x.mean(-1))),
    _Probe("softmax", _x(32000, 4.0), _rows(lambda x: torch.softmax(x, -1))),
    _Probe("log_softmax", _x(32000, 4.0), _rows(lambda x: torch.log_softmax(x, -1))),
    _Probe("layer_norm", _norm_make(4096, bias=True), _rows(lambda x, w, b: F.layer_norm(x, (x.shape[-1],), w, b))),
    _Probe("rms_norm", _norm_make(4096, bias=False), _rows(lambda x, w: F.rms_norm(x, (x.shape[-1],), w, 1e-6))),
    _Probe("embedding", _embedding_make, _rows(F.embedding)),
    _Probe("cumsum", _x(4096), _rows(lambda x: torch.cumsum(x, -1))),
    _Probe("topk", _x(32000), _rows(lambda x: torch.topk(x, 50, -1))),
    _Probe("sort", _x(4096), _rows(lambda x: torch.sort(x, -1))),
    _Probe("argmax", _x(32000), _rows(lambda x: torch.argmax(x, -1))),
)

_BACKEND_NAMES = {
    "MATH": "math",
    "FLASH_ATTENTION": "flash",
    "EFFICIENT_ATTENTION": "efficient",
    "CUDNN_ATTENTION": "cudnn",
    "OVERRIDEABLE": "overrideable",
}


def sdpa_backends(device: str | torch.device = "cpu") -> list[tuple[str, Any]]:
    """``(label, backend)`` for the default dispatch (``backend`` None) and every
    ``torch.nn.attention.SDPBackend`` that runs a small causal call on ``device`` in
    float32 or float16."""
    from torch.nn.attention import SDPBackend

    dev = torch.device(device)
    out: list[tuple[str, Any]] = [("", None)]
    for name, label in _BACKEND_NAMES.items():
        backend = getattr(SDPBackend, name, None)
        if backend is not None and any(_runs(backend, dev, dt) for dt in (torch.float32, torch.float16)):
            out.append((label, backend))
    return out


def _runs(backend: Any, dev: torch.device, dtype: torch.dtype) -> bool:
    q = torch.zeros((1, HEADS, 4, HEAD_DIM), device=dev, dtype=dtype)
    try:
        _sdpa(backend)(q, q, q, is_causal=True)
    except RuntimeError:  # "No available kernel": not offered for this device/build/dtype
        return False
    return True


def _attention_probes(device: str | torch.device) -> list[_Probe]:
    probes = []
    for label, backend in sdpa_backends(device):
        name = "scaled_dot_product_attention" + (f"[{label}]" if label else "")
        probes.append(
            _Probe(
                name,
                lambda m, dt, dev, g: _attn_make(m, dt, dev, g, batch=True),
                _attn_batch_pair(backend),
                ROW_SIZES,
                backend,
            )
        )
        probes.append(
            _Probe(
                name + "/decode",
                lambda m, dt, dev, g: _attn_make(m, dt, dev, g, batch=False),
                _attn_query_pair(backend),
                QUERY_LENGTHS,
                backend,
            )
        )
    return probes


OP_NAMES: tuple[str, ...] = tuple(p.name for p in _ROW_PROBES) + (
    "scaled_dot_product_attention",
    "scaled_dot_product_attention/decode",
)


def aten_name(func: Any) -> str:
    """``"aten::mm"`` for a default overload, ``"aten::mean.dim"`` otherwise."""
    overload = func._overloadname
    return func._schema.name if overload in ("default", "") else f"{func._schema.name}.{overload}"


class _AtenNames(TorchDispatchMode):
    """Collects the :func:`aten_name` of the non-view aten ops run under it."""

    def __init__(self) -> None:
        super().__init__()
        self.names: set[str] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        if not func.is_view:
            self.names.add(aten_name(func))
        return func(*args, **(kwargs or {}))


def _compare(a: Outputs, b: Outputs) -> tuple[bool, int, float]:
    same, ulp, dmax = True, 0, 0.0
    for x, y in zip(a, b):
        d = diff(x, y)
        same, ulp, dmax = same and d.equal, max(ulp, d.max_ulp), max(dmax, d.max_abs)
    return same, ulp, dmax


def _probe_one(
    p: _Probe, dtype: torch.dtype, dev: torch.device, threads: Sequence[int] | None, sizes: Sequence[int]
) -> OpResult:
    gen = torch.Generator().manual_seed(zlib.crc32(p.name.encode()))
    inputs = p.make(max(sizes), dtype, dev, gen)
    big = max(sizes)
    counts = list(threads) if threads else [None]
    first, ulp, dmax, invariant = None, 0, 0.0, True

    def at(t: int | None) -> ContextManager[None]:
        return torch_threads(t) if t is not None else nullcontext()

    at_big: list[Outputs] = []
    for t in counts:
        with at(t):
            for n in sizes:
                alone, inside, full = p.pair(inputs, n)
                same, u, d = _compare(alone, inside)
                ulp, dmax = max(ulp, u), max(dmax, d)
                if not same and invariant:
                    invariant, first = False, [1, n]
                if n == big:
                    at_big.append(full)
    with at(counts[-1]):
        same_run, u, d = _compare(at_big[-1], p.pair(inputs, big)[2])
    ulp, dmax = max(ulp, u), max(dmax, d)
    same_threads: bool | None = None
    if threads and len(set(threads)) > 1:
        same_threads = True
        for out in at_big[1:]:
            same, u, d = _compare(at_big[0], out)
            same_threads, ulp, dmax = same_threads and same, max(ulp, u), max(dmax, d)
    names = _AtenNames()
    with names:
        p.pair(inputs, min(2, big))
    return OpResult(
        p.name,
        str(dtype).removeprefix("torch."),
        invariant,
        same_run,
        same_threads,
        first,
        ulp,
        dmax,
        tuple(sorted(names.names)),
    )


def probe_ops(
    device: str | torch.device = "cpu",
    dtypes: Sequence[str | torch.dtype] = ("float32",),
    threads: Sequence[int] | None = (1, 2),
    *,
    ops: Sequence[str] | None = None,
    sizes: Sequence[int] | None = None,
    query_lengths: Sequence[int] | None = None,
    mode: Callable[[], ContextManager[Any]] | None = None,
) -> list[OpResult]:
    """Probe the ops and return one :class:`OpResult` per (op, dtype), ops in table order.

    ``device``: "cpu" or "cuda". ``dtypes``: names of :data:`DTYPES` or torch dtypes.
    ``threads``: CPU thread counts (each >= 1) at which batch invariance is measured and
    which are compared with each other; ignored on CUDA. ``ops``: a subset of op names
    (an attention name selects its backends: ``"scaled_dot_product_attention"`` all of
    them, ``"scaled_dot_product_attention[math]"`` one); default all. ``sizes`` /
    ``query_lengths`` replace :data:`ROW_SIZES` / :data:`QUERY_LENGTHS` (tests use small
    ones; each must contain sizes >= 1). ``mode``: a zero-argument callable returning a
    context manager (``detsample.batch_invariant``, say) entered around every probe.

    Raises ValueError naming a bad op, dtype, device, size or thread count.
    """
    dev = torch.device(device)
    if dev.type not in ("cpu", "cuda"):
        raise ValueError(f"device must be 'cpu' or 'cuda', got {str(device)!r}")
    dts = []
    for d in dtypes:
        if isinstance(d, torch.dtype) and d in DTYPES.values():
            dts.append(d)
        elif d in DTYPES:
            dts.append(DTYPES[d])
        else:
            raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {d!r}")
    for label, given in (("sizes", sizes), ("query_lengths", query_lengths)):
        if given is not None and (not given or any(int(s) < 1 for s in given)):
            raise ValueError(f"{label} must be non-empty and >= 1, got {list(given)!r}")
    if threads is not None and any(int(t) < 1 for t in threads):
        raise ValueError(f"threads must be >= 1, got {list(threads)!r}")
    table = list(_ROW_PROBES) + _attention_probes(dev)
    if ops is not None:
        known = {p.name for p in table} | set(OP_NAMES)
        bad = [o for o in ops if o not in known]
        if bad:
            raise ValueError(f"unknown op {bad[0]!r}; known: {', '.join(OP_NAMES)}")
        table = [p for p in table if _selected(p.name, ops)]
    counts = None if dev.type == "cuda" or not threads else [int(t) for t in threads]
    results = []
    for p in table:
        given = query_lengths if p.name.endswith("/decode") else sizes
        psizes = tuple(int(s) for s in given) if given is not None else p.sizes
        for dt in dts:
            with mode() if mode is not None else nullcontext():
                try:
                    results.append(_probe_one(p, dt, dev, counts, psizes))
                except RuntimeError:
                    if p.backend is None:
                        raise
                    # a forced attention backend without a kernel for this dtype (CUDA
                    # flash: half types only): nothing to measure
    return results


def _selected(name: str, ops: Sequence[str]) -> bool:
    """``name`` (``"sdpa[math]/decode"``) is asked for by ``ops`` directly, or through its
    attention base name without the backend (``"sdpa/decode"``, ``"sdpa"``)."""
    if name in ops:
        return True
    base, _, rest = name.partition("[")
    if not rest:
        return False
    suffix = rest.partition("]")[2]
    return (base + suffix) in ops


def invariant_aten_ops(results: Sequence[OpResult]) -> set[str]:
    """The aten ops (``"aten::_log_softmax"``) measured invariant: run by a probe that
    held (batch invariance, run to run, threads) and by none that failed. Conservative:
    an op that also runs inside a failed composite probe (``aten::_softmax`` inside the
    math attention, say) is left out; pass only the results you trust (``ops=`` without
    the attention probes, for a model whose attention is replaced) to count it."""
    good: set[str] = set()
    bad: set[str] = set()
    for r in results:
        (good if r.ok else bad).update(r.aten_ops)
    return good - bad
