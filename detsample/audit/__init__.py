"""RL on-policy logprob audit: do the engine's sampling-time logprobs equal the trainer's?

Facade over the audit's four tiers (each imports only the ones below it; two leaf
modules, :mod:`detsample.audit.issues` and :mod:`detsample.audit.semantics`, serve them all)::

    from detsample.audit import audit, to_json, check_gates
    report = audit("rollouts.jsonl", workers=4)          # or .npz / .parquet / records
    report = audit(records, rescore=my_trainer_logprobs)  # (prompt_ids, response_ids) -> lps
    failures = check_gates(report, max_abs_diff=0.0, min_exact_match=1.0)

* :mod:`detsample.audit.inputs`: formats, layouts and presets, the value rules, a file's
  columns assembled into the audit's (a file becomes checked columns);
* :mod:`detsample.audit.analysis`: the exact accumulators, every metric, the per-sequence
  tables, the RL frameworks' metrics and the diagnosis;
* :mod:`detsample.audit.running`: the driver (shards, workers, Ray), validation and the
  rescoring of absent trainer logprobs, ``from_tensors``, options, rollouts and gates;
* :mod:`detsample.audit.reports`: the summary, the HTML page, provenance and the
  training-run log.

Guarantee: the report is a pure function of the multiset of valid sequences (plus the
file order for the issue list and ties in the worst-sequence table): the chunk size and
``workers`` cannot change a bit of it (docs/audit.md, "Exactness").
"""

from detsample.audit.inputs.layout import PRESETS, Layout, make_layout
from detsample.audit.reports.log import AuditLog, read_log
from detsample.audit.running.options import AuditOptions
from detsample.audit.running.rescore import ModelRescorer, TPRescorer
from detsample.audit.running.run import (
    AuditInputError,
    Issue,
    Shard,
    audit,
    audit_accumulator,
    check_gates,
    plan_shards,
    to_json,
)
from detsample.audit.running.tensors import from_tensors, tensors_accumulator
from detsample.audit.semantics import Semantics

__all__ = [
    "PRESETS",
    "AuditInputError",
    "AuditLog",
    "AuditOptions",
    "Issue",
    "Layout",
    "ModelRescorer",
    "Semantics",
    "Shard",
    "TPRescorer",
    "audit",
    "audit_accumulator",
    "check_gates",
    "from_tensors",
    "make_layout",
    "plan_shards",
    "read_log",
    "tensors_accumulator",
    "to_json",
]
