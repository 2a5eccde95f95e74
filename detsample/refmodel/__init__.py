"""Tiny batch-invariant reference model, byte tokenizer and continuous-batching engine."""

from detsample.refmodel.cache import KVCache
from detsample.refmodel.config import RefModelConfig, RefModelError
from detsample.refmodel.model import RefModel

__all__ = ["KVCache", "RefModel", "RefModelConfig", "RefModelError"]
