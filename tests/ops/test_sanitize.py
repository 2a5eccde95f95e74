"""Non-finite sanitising is row-local and never touches finite rows."""

import torch

from detsample.ops.sanitize import sanitize_rows_flagged
from detsample.rules import NAN_FLOOR, POSINF_CEIL, STATUS_HAD_NAN, STATUS_HAD_POSINF, STATUS_NO_VALID_TOKEN


def test_sanitize_rows():
    x = torch.tensor([[1.0, 2.0], [float("nan"), 0.0], [float("inf"), 1.0], [float("-inf"), float("-inf")]])
    y, st, m, finite = sanitize_rows_flagged(x)
    assert m[:, 0].tolist() == [2.0, 0.0, POSINF_CEIL, float("-inf")]
    assert y[1, 0] == NAN_FLOOR and y[2, 0] == POSINF_CEIL and torch.equal(y[0], x[0])
    assert st.tolist() == [0, STATUS_HAD_NAN, STATUS_HAD_POSINF, STATUS_NO_VALID_TOKEN]
    assert torch.isnan(x[1, 0])  # the input is untouched
    assert not finite


def test_clean_batch_is_not_copied():
    x = torch.randn(3, 5)
    y, st, _, finite = sanitize_rows_flagged(x)
    assert y is x and int(st.sum()) == 0 and finite
