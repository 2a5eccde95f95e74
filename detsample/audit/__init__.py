"""RL on-policy logprob audit: do the engine's sampling-time logprobs equal the trainer's?

Facade over the audit modules::

    from detsample.audit import audit, to_json, check_gates
    report = audit("rollouts.jsonl", workers=4)          # or .npz / .parquet / records
    report = audit(records, rescore=my_trainer_logprobs)  # (prompt_ids, response_ids) -> lps
    failures = check_gates(report, max_abs_diff=0.0, min_exact_match=1.0)

* :mod:`detsample.audit.readers` reads JSONL / NPZ / Parquet / records in chunks;
* :mod:`detsample.audit.validate` excludes (and names) bad sequences;
* :mod:`detsample.audit.metrics` accumulates the metrics exactly;
* :mod:`detsample.audit.report` prints the table and writes the HTML page and plots.

Guarantee: the report is a pure function of the multiset of valid sequences (plus the
file order for the issue list and ties in the worst-sequence table): the chunk size and
``workers`` cannot change a bit of it (docs/audit.md, "Exactness").
"""

from detsample.audit.layout import PRESETS, Layout, make_layout
from detsample.audit.log import AuditLog, read_log
from detsample.audit.options import AuditOptions
from detsample.audit.run import (AuditInputError, Issue, Shard, audit, audit_accumulator,
                                 check_gates, plan_shards, to_json)
from detsample.audit.tensors import from_tensors, tensors_accumulator

__all__ = ["PRESETS", "AuditInputError", "AuditLog", "AuditOptions", "Issue", "Layout", "Shard",
           "audit",
           "audit_accumulator", "check_gates", "from_tensors", "make_layout", "plan_shards",
           "read_log", "tensors_accumulator", "to_json"]
