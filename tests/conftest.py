import pytest
from hypothesis import HealthCheck, settings

settings.register_profile(
    "detsample",
    deadline=None,
    max_examples=25,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.load_profile("detsample")


@pytest.fixture(scope="module")
def local_ray():
    """A local Ray with 2 CPUs for one test module (skipped where the ray extra is not
    installed: `pip install 'detsample[ray]'`; CI installs it)."""
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()
