"""RL on-policy logprob audit: do the engine's sampling-time logprobs equal the trainer's?

Facade over the audit's four parts::

    from detsample.audit import audit, to_json, check_gates
    report = audit("rollouts.jsonl", workers=4)          # or .npz / .parquet / records
    report = audit(records, rescore=my_trainer_logprobs)  # (prompt_ids, response_ids) -> lps
    failures = check_gates(report, max_abs_diff=0.0, min_exact_match=1.0)

* :mod:`detsample.audit.inputs`: formats, layouts and presets, the value rules and the
  per-sequence validation (a file becomes validated sequences);
* :mod:`detsample.audit.analysis`: the exact accumulators, every metric, the logprob
  semantics and the diagnosis;
* :mod:`detsample.audit.running`: the driver (shards, workers, Ray), options, rescoring,
  rollouts, gates and the training-run log;
* :mod:`detsample.audit.reports`: issues, the summary, the HTML page, provenance.

Guarantee: the report is a pure function of the multiset of valid sequences (plus the
file order for the issue list and ties in the worst-sequence table): the chunk size and
``workers`` cannot change a bit of it (docs/audit.md, "Exactness").
"""

from detsample.audit.analysis.semantics import Semantics
from detsample.audit.inputs.layout import PRESETS, Layout, make_layout
from detsample.audit.inputs.tensors import from_tensors, tensors_accumulator
from detsample.audit.running.log import AuditLog, read_log
from detsample.audit.running.options import AuditOptions
from detsample.audit.running.rescore import ModelRescorer, TPRescorer
from detsample.audit.running.run import (AuditInputError, Issue, Shard, audit, audit_accumulator,
                                         check_gates, plan_shards, to_json)

__all__ = ["PRESETS", "AuditInputError", "AuditLog", "AuditOptions", "Issue", "Layout",
           "ModelRescorer", "Semantics", "Shard", "TPRescorer", "audit", "audit_accumulator",
           "check_gates", "from_tensors", "make_layout", "plan_shards", "read_log",
           "tensors_accumulator", "to_json"]
