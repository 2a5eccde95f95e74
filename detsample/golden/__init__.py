"""Golden files: recorded outputs per platform, compared bit for bit (docs/golden.md).

* :mod:`detsample.golden.fingerprint` -- which platform folder applies to this machine;
* :mod:`detsample.golden.format` -- one scenario's files (manifest, tokens, logprobs);
* :mod:`detsample.golden.diff` -- bitwise comparison and what moved;
* :mod:`detsample.golden.store` -- the per-platform store, verify and update;
* :mod:`detsample.golden.synthlogits`, :mod:`detsample.golden.scenarios`,
  :mod:`detsample.golden.engine_scenarios` -- the named scenarios that produce outputs;
* :mod:`detsample.golden.pytest_plugin` -- ``pytest --golden-update``.
"""

from detsample.golden.store import (CORRUPT, MISMATCH, MISSING_PLATFORM, MISSING_SCENARIO, OK,
                                    Change, GoldenMissing, GoldenStore, GoldenUpdateRefused,
                                    Verification, golden_root, update_all, update_refusal,
                                    verify_all)

__all__ = ["CORRUPT", "Change", "GoldenMissing", "GoldenStore", "GoldenUpdateRefused",
           "MISMATCH", "MISSING_PLATFORM", "MISSING_SCENARIO", "OK", "Verification",
           "golden_root", "update_all", "update_refusal", "verify_all"]
