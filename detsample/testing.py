"""Helpers for users' own tests.

* fault injection for a reproducibility gate (:func:`perturbed_sample`,
  :func:`perturbed_compute_logprobs`, :func:`flip_low_bit`), from
  :mod:`detsample.checks.faults`.
"""

from detsample.checks.faults import flip_low_bit, perturbed_compute_logprobs, perturbed_sample

__all__ = ["flip_low_bit", "perturbed_compute_logprobs", "perturbed_sample"]
