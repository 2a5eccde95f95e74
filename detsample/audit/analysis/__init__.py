"""Accumulation and metrics: exact, mergeable sums over the audited tokens.

:mod:`.exact` (integer-scaled exact sums), :mod:`.metrics` (``AuditAccumulator``: every
metric of the report), :mod:`.semantics` (the logprob semantics a rescoring speaks),
:mod:`.diagnose` (which semantics explains the engine's numbers).
"""
