import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings


def _golden_isa() -> None:
    """Run the suite on torch's kernels of an instruction set that has committed goldens.

    On an AVX-512 CPU only the ``cpu-avx2-*`` / ``cpu-default-*`` golden folders exist, so
    the tests that compare against them (and the in-process ``detsample check`` tests) set
    ``ATEN_CPU_CAPABILITY`` to the best such set, as ``ci/gate.sh`` and ``detsample check``
    do. It must be set before torch dispatches its first kernel, hence here, and it is
    only set when nothing forces a set already. The mode's native-ISA behaviour is tested
    in subprocesses (tests/invariant/test_portable.py).
    """
    if os.environ.get("ATEN_CPU_CAPABILITY"):
        return
    import torch  # noqa: F401  (torch.cpu's flags do not fix the capability)
    from detsample.golden import isa
    from detsample.golden.fingerprint import _clean
    root = Path(__file__).resolve().parents[1] / "golden"
    version = _clean(torch.__version__)
    supported = isa.supported_isas()
    if (root / f"cpu-{supported[-1]}-torch{version}").is_dir():
        return
    for name in reversed(supported[:-1]):
        if (root / f"cpu-{name}-torch{version}").is_dir():
            os.environ["ATEN_CPU_CAPABILITY"] = name
            return


_golden_isa()

settings.register_profile(
    "detsample", deadline=None, max_examples=25, derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.load_profile("detsample")


@pytest.fixture(scope="module")
def local_ray():
    """A local Ray with 2 CPUs for one test module (skipped where the ray extra is not
    installed: `pip install 'detsample[ray]'`; CI installs it)."""
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()
