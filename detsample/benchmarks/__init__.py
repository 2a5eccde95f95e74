"""Benchmarks shared by ``detsample bench`` and ``tests/benchmarks`` (pytest-benchmark)."""
