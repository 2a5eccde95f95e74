"""``detsample check`` checks of the reference model itself (logits, not sampling).

Registered through :data:`detsample.checks.battery.EXTERNAL_CHECK_MODULES`; each check is
``fn(quick, device) -> CheckResult``. The model is a CPU model, so ``device`` is only
reported. The engine-level checks live in :mod:`detsample.checks.engine`.

- ``refmodel_prefill_decode_logits``: every position of random sequences decoded in
  random continuous-batching schedules (batch sizes 1..9, random order, chunked
  prefills) at 1 and 2 threads has bitwise the logits of one full prefill.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence

import torch

from detsample.checks.result import CheckResult
from detsample.probe.threads import torch_threads
from detsample.refmodel.model import RefModel

Rows = dict[tuple[int, int], torch.Tensor]


def schedule_logits(
    model: RefModel, seqs: Sequence[Sequence[int]], prefill_lens: Sequence[int], rng: random.Random, max_batch: int
) -> Rows:
    """Prefill each sequence's head, then decode the rest in random batches.

    Each step decodes a random subset (random order, size <= ``max_batch``) of the
    unfinished sequences. Returns {(sequence index, position): logits row [V]}.
    """
    out: Rows = {}
    caches = []
    for i, (s, p) in enumerate(zip(seqs, prefill_lens)):
        c = model.new_cache()
        for t, row in enumerate(model.prefill(list(s[:p]), c)):
            out[(i, t)] = row
        caches.append(c)
    while True:
        live = [i for i, s in enumerate(seqs) if len(caches[i]) < len(s)]
        if not live:
            return out
        rng.shuffle(live)
        pick = live[: rng.randint(1, max_batch)]
        pos = [len(caches[i]) for i in pick]
        logits = model.decode([caches[i] for i in pick], [seqs[i][t] for i, t in zip(pick, pos)])
        for r, (i, t) in enumerate(zip(pick, pos)):
            out[(i, t)] = logits[r]


def logits_mismatches(rows: Rows, reference: Sequence[torch.Tensor], label: str) -> list[str]:
    """Positions whose row differs in bits from ``reference[i][t]`` (prefill logits)."""
    bad = []
    for (i, t), row in sorted(rows.items()):
        ref = reference[i][t]
        if not torch.equal(row.contiguous().view(torch.int32), ref.contiguous().view(torch.int32)):
            diff = float((row.double() - ref.double()).abs().max())
            bad.append(f"{label}: sequence {i} position {t}: decode logits differ from prefill (max |diff| {diff:.3g})")
    return bad


def refmodel_prefill_decode_logits(
    quick: bool = False, device: str = "cpu", model: RefModel | None = None
) -> CheckResult:
    name = "refmodel_prefill_decode_logits"
    model = model if model is not None else RefModel()
    rng = random.Random(20261129)
    n_seq, max_len = (5, 24) if quick else (9, 64)
    V = model.config.vocab_size
    seqs = [[rng.randrange(V) for _ in range(rng.randint(2, max_len))] for _ in range(n_seq)]
    fails: list[str] = []
    with torch_threads(1):
        reference = [model.prefill(s) for s in seqs]
    n_rows = 0
    for threads in (1, 2):
        for max_batch in (1, 4, 9) if not quick else (1, 9):
            heads = [rng.randint(1, len(s) - 1) for s in seqs]
            with torch_threads(threads):
                rows = schedule_logits(model, seqs, heads, rng, max_batch)
            n_rows += len(rows)
            fails += logits_mismatches(rows, reference, f"{threads} thread(s), batches <= {max_batch}")
    if fails:
        return CheckResult(name, False, f"{len(fails)} position(s) differ:\n" + "\n".join(fails[:20]))
    return CheckResult(
        name,
        True,
        f"{n_rows} positions of {n_seq} sequences: decode == prefill "
        f"bitwise (1 and 2 threads; CPU model, device {device!r})",
    )


CHECKS: tuple[Callable[..., CheckResult], ...] = (refmodel_prefill_decode_logits,)
