"""Probes: where a model or its kernels break batch invariance and prefill/decode alignment."""
