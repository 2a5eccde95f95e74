"""What produced an audit report: the ``"provenance"`` and ``"gates"`` entries that make a
report.json or an index.html stand alone (read without the command line that made it).

``provenance``: the detsample version, when and by which command line the report was
made, the platform (OS, machine, Python, torch, its CPU capability, threads), the
rescoring (model, logprob semantics, mode flags, tensor parallelism, the weights' content
hash, or a user callable's name), the layout (preset, columns, padding) and the compare
dtype. ``gates``: the thresholds given, the failures and the verdict
(``pass``, ``fail``, or ``no gate``: a report with no gate and some tokens).
"""

from __future__ import annotations

import datetime
import platform as _platform
from collections.abc import Mapping, Sequence

from detsample.audit.running.gates import ExclusionLimit, check_gates
from detsample.audit.running.options import AuditOptions
from detsample.audit.running.rescore import ModelRescorer, TPRescorer
from detsample.version import __version__


def platform_info() -> dict:
    """The machine and library versions the report was made on."""
    import torch

    return {
        "system": _platform.platform(),
        "machine": _platform.machine(),
        "python": _platform.python_version(),
        "torch": torch.__version__,
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "threads": torch.get_num_threads(),
    }


def rescore_info(rescore: object) -> dict | None:
    """How trainer logprobs were recomputed (None: not at all)."""
    if rescore is None:
        return None
    if isinstance(rescore, ModelRescorer):
        return {
            "model": rescore.model,
            "semantics": rescore.semantics.to_dict(),
            "semantics_flags": rescore.semantics.flags(),
            "batch_invariant": rescore.batch_invariant,
            "portable": rescore.portable,
            "model_path": rescore.model_path,
            "tp": 1,
            "weights_sha256": _weights_digest(rescore),
        }
    if isinstance(rescore, TPRescorer):
        s = rescore.spec
        return {
            "model": s.model,
            "semantics": rescore.semantics.to_dict(),
            "semantics_flags": rescore.semantics.flags(),
            "batch_invariant": s.batch_invariant,
            "portable": s.portable,
            "tp": s.tp,
        }
    if isinstance(rescore, str):
        return {"model": rescore, "semantics": {"logprobs_mode": "raw"}, "tp": 1}
    return {"callable": getattr(rescore, "__qualname__", type(rescore).__name__)}


def _weights_digest(rescore: ModelRescorer) -> str | None:
    """The content hash of the weights the rescorer ran (None: it never loaded them)."""
    from detsample.models.digest import weights_digest

    loaded = getattr(rescore, "_state", None)
    return None if loaded is None else weights_digest(loaded[0])


def provenance(opts: AuditOptions, command: Sequence[str] | None = None) -> dict:
    """The report's ``"provenance"`` for an audit run with ``opts``; ``command``: the
    command line that ran it (the CLI's), recorded as given."""
    lay = opts.layout
    created = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    return {
        "detsample_version": __version__,
        "created": created,
        "command": None if command is None else [str(a) for a in command],
        "platform": platform_info(),
        "rescore": rescore_info(opts.rescore),
        "layout": {
            "preset": lay.name,
            "records": lay.records,
            "padded": lay.padded,
            "response_padding": lay.response_padding,
            "columns": {dst: list(src.candidates) for dst, src in lay.sources if dst in lay.explicit},
        },
        "compare_dtype": opts.compare_dtype or "promoted",
    }


def with_verdict(
    report: Mapping,
    max_abs_diff: float | None = None,
    min_exact_match: float | None = None,
    max_excluded: object = None,
) -> list[str]:
    """Check the gates and record them in ``report["gates"]`` (in place): the thresholds,
    the failures and the verdict. Returns the failures (:func:`check_gates`)."""
    failures = check_gates(report, max_abs_diff, min_exact_match, max_excluded)
    gated = any(v is not None for v in (max_abs_diff, min_exact_match, max_excluded))
    lim = ExclusionLimit.of(max_excluded) if gated else None  # type: ignore[arg-type]
    report["gates"] = {  # type: ignore[index]
        "max_abs_diff": max_abs_diff,
        "min_exact_match": min_exact_match,
        "max_excluded": None if lim is None else (lim.count if lim.count is not None else lim.fraction),
        "failures": failures,
        "verdict": "fail" if failures else ("pass" if gated else "no gate"),
    }
    return failures
