"""Golden files: recorded outputs per platform, compared bit for bit (docs/golden.md).

* :mod:`detsample.golden.fingerprint` -- which platform folder applies to this machine;
* :mod:`detsample.golden.isa` -- the CPU instruction sets this machine can run, and
  commands run under each (``--isa all``);
* :mod:`detsample.golden.format` -- one scenario's files (manifest, tokens, logprobs);
* :mod:`detsample.golden.diff` -- bitwise comparison and what moved;
* :mod:`detsample.golden.store` -- the per-platform store, verify and update;
* :mod:`detsample.golden.bits`, :mod:`detsample.golden.tensor_format`,
  :mod:`detsample.golden.tensor_diff`, :mod:`detsample.golden.tensor_store` -- goldens
  of any tensors (a kernel developer's own kernels): :func:`check_tensors`;
* :mod:`detsample.golden.synthlogits`, :mod:`detsample.golden.scenarios`,
  :mod:`detsample.golden.engine_scenarios` -- the named scenarios that produce outputs;
  :mod:`detsample.golden.synthtensors` -- kernel-test inputs identical on every machine;
* :mod:`detsample.golden.pytest_plugin` -- ``pytest --golden-update``.
"""

from detsample.golden.store import (
    CORRUPT,
    MISMATCH,
    MISSING_PLATFORM,
    MISSING_SCENARIO,
    OK,
    Change,
    GoldenMissing,
    GoldenStore,
    GoldenUpdateRefused,
    Verification,
    golden_root,
    update_all,
    update_refusal,
    verify_all,
)
from detsample.golden.tensor_store import TensorGoldens, check_tensors

__all__ = [
    "CORRUPT",
    "Change",
    "GoldenMissing",
    "GoldenStore",
    "GoldenUpdateRefused",
    "MISMATCH",
    "MISSING_PLATFORM",
    "MISSING_SCENARIO",
    "OK",
    "TensorGoldens",
    "Verification",
    "check_tensors",
    "golden_root",
    "update_all",
    "update_refusal",
    "verify_all",
]
