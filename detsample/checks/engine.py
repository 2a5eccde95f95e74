"""``detsample check`` checks of the reference model + continuous-batching engine.

Registered in :data:`detsample.checks.battery.EXTERNAL_CHECK_MODULES`; each check is
``fn(quick, device) -> CheckResult`` and runs the engine scenarios of
:mod:`detsample.golden.engine_scenarios` (CPU; the reference model is a CPU model), the
golden ones and the check-only ``CHECK_SCENARIOS`` (the verified batch-invariant mode,
whose bits rest on this machine's BLAS and so have no committed goldens):

- ``engine_batch_invariance``: every request run alone, and the whole schedule in
  reversed script order with a different row limit, report bitwise the same tokens,
  logprobs (each request's own mode: the scenarios cycle raw/scaled/processed), seed
  and finish reason as the scripted mixed run;
- ``engine_prefill_decode_alignment``: rescoring each finished sequence with one prefill
  and ``compute_logprobs`` (:func:`detsample.refmodel.engine.rescore`) returns, bitwise,
  the logprobs the engine reported at every generated position, raw and scaled;
- ``engine_determinism``: a second run, and runs at 1 and 2 torch threads, are bitwise
  identical.

Without :mod:`detsample.refmodel.engine` in the build, ``CHECKS`` is empty.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext
from typing import Any

import torch

from detsample.checks.result import CheckResult
from detsample.golden import engine_scenarios as enginescenarios
from detsample.probe.threads import torch_threads

ALIGN_MODES = ("raw", "scaled")


def _scenarios(quick: bool) -> list[enginescenarios.EngineScenario]:
    every = [*enginescenarios.ENGINE_SCENARIOS.values(), *enginescenarios.CHECK_SCENARIOS.values()]
    return [s for s in every if s.quick or not quick]


def _bits(t: torch.Tensor) -> bytes:
    return t.detach().cpu().contiguous().view(torch.int32).numpy().tobytes()


def result_differences(label: str, a: Any, b: Any) -> list[str]:
    """Where two ``RequestResult`` of the same request differ (tokens, logprob bits per
    mode, seed, finish reason); empty when bitwise equal."""
    out = []
    if a.token_ids != b.token_ids:
        i = next(
            (k for k, (x, y) in enumerate(zip(a.token_ids, b.token_ids)) if x != y),
            min(len(a.token_ids), len(b.token_ids)),
        )
        out.append(
            f"{label}: request {a.rid} tokens diverge at generated token {i} "
            f"(position {len(a.prompt_ids) - 1 + i}): {a.token_ids[i : i + 3]} vs {b.token_ids[i : i + 3]}"
        )
        return out
    for m in sorted(set(a.logprobs) | set(b.logprobs)):
        if (
            m not in a.logprobs
            or m not in b.logprobs
            or _bits(a.logprobs[m]) != _bits(b.logprobs[m])
            or a.logprobs[m].shape != b.logprobs[m].shape
        ):
            out.append(f"{label}: request {a.rid} {m} logprobs differ in bits")
    if a.seed != b.seed or a.finish_reason != b.finish_reason:
        out.append(f"{label}: request {a.rid} seed/finish {a.seed}/{a.finish_reason} vs {b.seed}/{b.finish_reason}")
    return out


def _result(name: str, fails: list[str], what: str, n: int) -> CheckResult:
    if fails:
        return CheckResult(name, False, f"{len(fails)} divergence(s):\n" + "\n".join(fails))
    return CheckResult(name, True, f"{n} engine scenarios: {what}")


def engine_batch_invariance(quick: bool = False, device: str = "cpu") -> CheckResult:
    fails: list[str] = []
    scs = _scenarios(quick)
    for sc in scs:
        model = sc.build_model()
        reqs, mixed = sc.run(model=model)
        for r in reqs:
            _, alone = sc.run(only=[r.rid], model=model)
            fails += result_differences(f"{sc.name} [alone vs mixed]", mixed[r.rid], alone[r.rid])
        _, other = sc.run(reverse=True, max_batch_size=3, model=model)
        for r in reqs:
            fails += result_differences(f"{sc.name} [reversed, max 3 rows]", mixed[r.rid], other[r.rid])
    return _result("engine_batch_invariance", fails, "each request alone == in the mixed schedule", len(scs))


def engine_prefill_decode_alignment(quick: bool = False, device: str = "cpu") -> CheckResult:
    from detsample.refmodel.engine import rescore
    from detsample.sampler import Sampler

    fails: list[str] = []
    scs = _scenarios(quick)
    for sc in scs:
        model, sampler = sc.build_model(), Sampler()
        for m in ALIGN_MODES:
            reqs, res = sc.run(mode=m, model=model, sampler=sampler)
            for r in reqs:
                rr = res[r.rid]
                got = rescore(model, sampler, r.params, r.prompt_ids, rr.token_ids, vocab=sc.vocabulary())
                want = rr.logprobs[m]
                if got.shape != want.shape:
                    fails.append(
                        f"{sc.name}: request {r.rid} mode {m}: the engine reported "
                        f"{tuple(want.shape)} logprobs for {len(rr.token_ids)} tokens "
                        f"(rescoring gives {tuple(got.shape)})"
                    )
                elif _bits(got) != _bits(want):
                    bad = (got.view(torch.int32) != want.view(torch.int32)).nonzero().flatten().tolist()
                    i = bad[0] if bad else 0
                    fails.append(
                        f"{sc.name}: request {r.rid} mode {m}: prefill rescoring differs from "
                        f"decode-time logprobs at {len(bad)} position(s), first at generated "
                        f"token {i} (position {len(r.prompt_ids) - 1 + i}): "
                        f"{float(want[i])!r} (decode) vs {float(got[i])!r} (prefill)"
                    )
    return _result(
        "engine_prefill_decode_alignment", fails, "rescoring == sampling-time logprobs (raw, scaled)", len(scs)
    )


def engine_determinism(quick: bool = False, device: str = "cpu") -> CheckResult:
    fails: list[str] = []
    scs = _scenarios(quick)
    for sc in scs:
        reqs, ref = sc.run()
        for label, ctx in (
            ("second run", nullcontext()),
            ("1 thread", torch_threads(1)),
            ("2 threads", torch_threads(2)),
        ):
            with ctx:
                _, got = sc.run()
            for r in reqs:
                fails += result_differences(f"{sc.name} [{label}]", ref[r.rid], got[r.rid])
    return _result("engine_determinism", fails, "run-to-run and 1 vs 2 threads bitwise equal", len(scs))


CHECKS: tuple[Callable[..., CheckResult], ...] = (
    (engine_batch_invariance, engine_prefill_decode_alignment, engine_determinism)
    if enginescenarios.available()
    else ()
)
