from hypothesis import HealthCheck, settings

settings.register_profile(
    "detsample", deadline=None, max_examples=25, derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.load_profile("detsample")
