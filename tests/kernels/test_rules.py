"""The Triton spellings of the sampling rules (detsample/kernels/common.py) give the bits
of detsample.rules on the one table both read (tests/rules_cases.py).

Bug it pins: a kernel's formula drifting from the torch ops' (a mass scaled in another
type, a top-p compared in float32, a target without its clamp, a uniform without its
half-ulp) while the two backends' tests, each against its own spelling, stay green.
"""

from __future__ import annotations

import numpy as np
import torch

from detsample import rules
from tests import rules_cases as C


def run_table():
    """Every table through the kernels (runs in the interpreter worker)."""
    from tests.kernels import rules_kernels as K

    masses = {
        frac: K.mass(torch.tensor([e for e, f in C.MASS if f == frac], dtype=torch.float32), frac).tolist()
        for frac in sorted({f for _, f in C.MASS})
    }
    above, p, total = zip(*C.TOP_P)
    top = K.top_p(torch.tensor(above), torch.tensor(p, dtype=torch.float64), torch.tensor(total)).tolist()
    e, m = (torch.tensor(c, dtype=torch.float32) for c in zip(*C.MIN_P))
    minp = K.min_p(e, m).tolist()
    u, q = zip(*C.DRAW)
    draws = K.draw(torch.tensor(u, dtype=torch.float64), torch.tensor(q)).tolist()
    firsts = [K.first(torch.tensor(c), t) for c, t in C.FIRST_ABOVE]
    w0, w1 = (torch.tensor(c, dtype=torch.int64) for c in zip(*C.UNIFORM))
    unis = K.uniforms(w0, w1).tolist()
    return masses, top, minp, draws, firsts, unis


def run_element_table():
    """The element-wise filters' Triton spelling on the min-p table, with the names it
    spells (runs in the interpreter worker)."""
    from detsample.kernels.common import ELEMENT_FILTERS
    from tests.kernels import rules_kernels as K

    e, m = (torch.tensor(c, dtype=torch.float32) for c in zip(*C.MIN_P))
    return ELEMENT_FILTERS, K.element(e, rules.element_tensor(len(C.MIN_P), min_p=m)).tolist()


def test_triton_spells_every_registered_element_filter(interp):
    """``kernels.common.element_keeps`` spells exactly the registry's filters, in its
    column order, and keeps what ``rules.element_keeps`` keeps. Bug it pins: a filter
    registered in ``rules`` that the Triton kernels silently do not apply."""
    names, got = interp(run_element_table)
    assert names == tuple(f.name for f in rules.ELEMENT_FILTERS)
    e, m = (torch.tensor(c, dtype=torch.float32) for c in zip(*C.MIN_P))
    want = rules.element_keeps(e[:, None], rules.element_tensor(len(C.MIN_P), min_p=m))
    assert got == want[:, 0].tolist()


def test_triton_rules_equal_the_python_rules(interp):
    masses, top, minp, draws, firsts, unis = interp(run_table)
    for frac, got in masses.items():
        es = [e for e, f in C.MASS if f == frac]
        assert got == [rules.mass(e, frac) for e in es], frac
    assert top == [rules.top_p_keeps(a, rules.top_p_limit(p, t)) for a, p, t in C.TOP_P]
    assert minp == [bool(rules.min_p_keeps(np.float32(e), np.float32(m))) for e, m in C.MIN_P]
    assert draws == [rules.draw_target(u, q) for u, q in C.DRAW]
    assert firsts == [rules.first_above(c, t) for c, t in C.FIRST_ABOVE]
    assert unis == [rules.uniform(rules.u52(a, b)) for a, b in C.UNIFORM]
