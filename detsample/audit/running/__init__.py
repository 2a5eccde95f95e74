"""Running an audit and its gates.

:mod:`.run` (the driver: shards, workers, merge; ``audit``), :mod:`.options`
(``AuditOptions``), :mod:`.assemble` (a file's columns to the audit's), :mod:`.rescore`
(model rescorers), :mod:`.rollout` (rollouts to audit), :mod:`.ray_runner` (Ray),
:mod:`.gates` (pass / fail), :mod:`.log` (``AuditLog`` over a training run).
"""
