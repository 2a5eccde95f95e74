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

from detsample.audit.run import (AuditInputError, AuditOptions, Issue, Shard, audit,
                                 audit_accumulator, check_gates, plan_shards, to_json)

__all__ = ["AuditInputError", "AuditOptions", "Issue", "Shard", "audit", "audit_accumulator",
           "check_gates", "plan_shards", "to_json"]
