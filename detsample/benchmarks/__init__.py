"""Benchmarks shared by ``detsample bench`` and ``tests/bench`` (pytest-benchmark)."""
