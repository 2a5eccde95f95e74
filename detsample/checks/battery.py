"""The ``detsample check`` battery: goldens + invariance checks + external checks.

:func:`run_battery` runs, per synthetic scenario (the quick subset with ``quick``):

- ``golden``: the canonical run equals the stored golden bit for bit;
- ``batch_invariance``, ``run_to_run``, ``threads_1_vs_2``, ``logprob_alignment``:
  see :mod:`detsample.checks.invariance`;

then every check of the optional modules in :data:`EXTERNAL_CHECK_MODULES` (the
reference model and engine). Such a module exposes ``CHECKS``: a sequence of callables
``fn(quick: bool, device: str)`` returning a :class:`~detsample.checks.result.CheckResult` (or
anything :func:`~detsample.checks.result.as_result` accepts), each named by ``fn.check_name``
or its ``__name__``. A module that is not there is simply not run; one that fails to
import is a failing check.

One :class:`CheckResult` per check kind is returned; its detail aggregates the
scenarios (failing scenarios' reports included).
"""

from __future__ import annotations

import importlib
import traceback
from collections.abc import Callable, Sequence
from typing import Any

from detsample.checks import invariance
from detsample.checks.result import CheckResult, as_result
from detsample.golden import registry, scenarios
from detsample.golden.store import MISSING_PLATFORM, GoldenStore

EXTERNAL_CHECK_MODULES = ("detsample.checks.engine", "detsample.checks.refmodel")
SCENARIO_CHECKS = ("golden", "batch_invariance", "run_to_run", "threads_1_vs_2", "logprob_alignment")
Progress = Callable[[int, int, str], None]


def _noop(done: int, total: int, label: str) -> None:
    pass


def external_checks(modules: Sequence[str] = EXTERNAL_CHECK_MODULES) -> list[tuple[str, Callable[..., Any]]]:
    """``(name, fn)`` for every check of the importable external modules."""
    found: list[tuple[str, Callable[..., Any]]] = []
    for modname in modules:
        try:
            mod = importlib.import_module(modname)
        except ModuleNotFoundError as e:
            if e.name and modname.startswith(e.name):  # the module (or its package) is absent
                continue
            found.append((modname, _raiser(e)))
            continue
        except Exception as e:  # a broken module is a failing check, not a silent skip
            found.append((modname, _raiser(e)))
            continue
        for fn in getattr(mod, "CHECKS", ()):
            found.append((getattr(fn, "check_name", fn.__name__), fn))
    return found


def _raiser(err: BaseException) -> Callable[..., Any]:
    def fail(**_: Any) -> CheckResult:
        raise err

    return fail


def _scenario_failures(sc: Any, store: GoldenStore, device: str) -> tuple[dict[str, list[str]], str]:
    """Failures per check kind for one scenario, and the golden status. Engine scenarios
    only have the golden check here (the engine's invariances are the refmodel checks')."""
    ref = sc.produce(device=device)
    v = store.verify(sc.name, ref)
    fails: dict[str, list[str]] = {"golden": [] if v.ok or v.skipped else [v.message]}
    if not isinstance(sc, scenarios.Scenario):
        return fails, v.status
    fails |= {
        "batch_invariance": invariance.composition_failures(sc, ref, device),
        "run_to_run": invariance.run_to_run_failures(sc, ref, device),
        "threads_1_vs_2": invariance.thread_failures(sc, ref, device),
        "logprob_alignment": invariance.alignment_failures(sc, device),
    }
    return fails, v.status


def run_battery(
    quick: bool = False,
    device: str = "cpu",
    store: GoldenStore | None = None,
    progress: Progress = _noop,
    names: Sequence[str] | None = None,
    allow_missing_goldens: bool = False,
    external: Sequence[tuple[str, Callable[..., Any]]] | None = None,
) -> list[CheckResult]:
    """Run the battery; see the module docstring. ``names`` restricts the scenarios."""
    store = store or GoldenStore(device=device)
    todo = list(names) if names is not None else registry.names(quick=quick, device=device)
    ext = external_checks() if external is None else list(external)
    total = len(todo) + len(ext)
    fails: dict[str, list[str]] = {k: [] for k in SCENARIO_CHECKS}
    counted = {k: 0 for k in SCENARIO_CHECKS}
    missing = 0
    for i, name in enumerate(todo):
        progress(i, total, name)
        try:
            per, status = _scenario_failures(registry.get(name), store, device)
        except Exception:
            per, status = {k: [f"{name}: raised\n{traceback.format_exc()}"] for k in SCENARIO_CHECKS}, ""
        missing += status == MISSING_PLATFORM
        for k, v in per.items():
            fails[k].extend(v)
            counted[k] += 1
    results = [_golden_result(fails["golden"], missing, len(todo), store, allow_missing_goldens)]
    for k in SCENARIO_CHECKS[1:]:
        n_bad = len(fails[k])
        detail = (
            f"{counted[k]} scenarios, all bits equal"
            if not n_bad
            else f"{n_bad} divergence(s):\n" + "\n".join(fails[k])
        )
        results.append(CheckResult(k, not n_bad, detail))
    for j, (name, fn) in enumerate(ext):
        progress(len(todo) + j, total, name)
        try:
            results.append(as_result(name, fn(quick=quick, device=device)))
        except Exception:
            results.append(CheckResult(name, False, f"raised\n{traceback.format_exc()}"))
    progress(total, total, "done")
    return results


def _golden_result(fails: list[str], missing: int, n: int, store: GoldenStore, allow_missing: bool) -> CheckResult:
    if missing:
        msg = store.missing_platform_message()
        if allow_missing:
            msg += " (allowed by --allow-missing-goldens)"
        return CheckResult("golden", allow_missing, msg, skipped=True)
    if fails:
        return CheckResult(
            "golden", False, f"{len(fails)} of {n} scenarios differ from their goldens:\n" + "\n".join(fails)
        )
    return CheckResult("golden", True, f"{n} scenarios bit-identical to {store.platform_dir}")
