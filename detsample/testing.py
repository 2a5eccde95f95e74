"""Helpers for users' own tests.

* inputs a kernel test can trust on every machine: :func:`tensor` (``shape, dtype,
  seed, family`` with the golden scenarios' families random / ties / huge / neginf /
  nan, generated from integer bit streams), from :mod:`detsample.golden.synthtensors`;
  compare a kernel's outputs with the ``golden.check_tensors`` fixture or
  :func:`detsample.golden.check_tensors` (docs/kernel-developers.md);
* fault injection for a reproducibility gate (:func:`perturbed_sample`,
  :func:`perturbed_compute_logprobs`, :func:`flip_low_bit`), from
  :mod:`detsample.checks.faults`.
"""

from detsample.checks.faults import flip_low_bit, perturbed_compute_logprobs, perturbed_sample
from detsample.golden.synthtensors import FAMILIES as TENSOR_FAMILIES
from detsample.golden.synthtensors import tensor

__all__ = ["TENSOR_FAMILIES", "flip_low_bit", "perturbed_compute_logprobs", "perturbed_sample", "tensor"]
