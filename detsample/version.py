"""The library version (golden manifests and ``detsample --version`` record it)."""

__version__ = "0.1.0"
