"""The one table of the sampling rules' cases (detsample/rules.py), read by both
tests/test_rules.py (the torch, numpy and Python spellings) and
tests/kernels/test_rules.py (the Triton spellings of detsample/kernels/common.py).

Each entry is chosen to sit on an edge of its rule: an exact power of two, a float64
rounding of a product above 2**53, an equality (the rule's ``<`` / ``>=`` side), the
clamp of a target, an empty prefix, the extreme words of a uniform.
"""

from __future__ import annotations

import numpy as np

F32 = np.float32
_TINY = float(np.finfo(np.float32).tiny)

#: mass: (e float32 in [0, 1], frac)
MASS = [
    (0.0, 52),
    (1.0, 52),
    (1.0, 44),
    (0.5, 45),
    (float(np.nextafter(F32(1), F32(0))), 52),
    (float(F32(np.exp(F32(-87.0)))), 52),
    (_TINY, 52),
    (float(F32(0.3)), 44),
    (float(F32(1e-7)), 45),
    (float(F32(0.999)), 49),
]

#: top-p: (above int64, top_p float64, total int64); top_p >= 1 disables
TOP_P = [
    (0, 0.5, 2**52),
    (2**51, 0.5, 2**52),
    (2**51 - 1, 0.5, 2**52),
    (2**52, 1.0, 2**52),
    (2**61 + 1, 0.5, 2**62 - 2),
    (2**61 - 1, 0.5, 2**62 - 2),
    (3, float("inf"), 4),
    (2**53 + 1, 0.9, 2**54),
    (10**17, 0.1, 10**18),
    (0, 1e-300, 1),
]

#: min-p: (e float32, min_p float32)
MIN_P = [
    (0.5, 0.5),
    (float(np.nextafter(F32(0.5), F32(0))), 0.5),
    (1.0, 1.0),
    (0.0, 0.0),
    (_TINY, 0.0),
    (0.25, float(F32(0.1))),
]

#: draw target: (u float64 in (0, 1), total int64 >= 1)
DRAW = [
    (2.0**-53, 1),
    (1 - 2.0**-53, 1),
    (1 - 2.0**-53, 2**62 - 1),
    (0.5, 3),
    ((2**52 - 0.5) * 2.0**-52, 2**52),
    (0.999999, 2**60 + 12345),
    (2.0**-53, 2**62 - 1),
]

#: first running mass above t: (non-decreasing int64 running sums, t)
FIRST_ABOVE = [
    ([1, 2, 3], 0),
    ([1, 2, 3], 1),
    ([1, 2, 3], 2),
    ([5, 5, 9], 5),
    ([0, 0, 7], 0),
    ([2**61, 2**62 - 1, 2**62 - 1], 2**62 - 2),
]

#: uniform: (w0, w1) uint32 Philox words
UNIFORM = [(0, 0), (0xFFFFFFFF, 0xFFFFFFFF), (0, 0xFFF), (0, 0x1000), (0x80000000, 0), (0x12345678, 0x9ABCDEF0)]
