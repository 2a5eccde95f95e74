"""The ``detsample check`` battery.

* :mod:`detsample.checks.result` -- the result type of every check;
* :mod:`detsample.checks.battery` -- goldens + invariance checks + external checks, in order;
* :mod:`detsample.checks.invariance` -- invariances of one synthetic scenario;
* :mod:`detsample.checks.engine` -- reference model + continuous-batching engine checks;
* :mod:`detsample.checks.refmodel` -- the reference model's own logits checks;
* :mod:`detsample.checks.faults` -- fault injection, to prove the gate catches one moved bit.
"""

from detsample.checks.result import CheckResult, as_result
from detsample.probe.threads import torch_threads

__all__ = ["CheckResult", "as_result", "torch_threads"]
