"""torch .pt audit inputs: loaded with weights_only=True, columns or records, errors named
(detsample/audit/torchfile.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from detsample.audit import AuditInputError, audit, to_json
from detsample.audit.synth import synth_rollouts, to_records


def _records():
    return to_records(synth_rollouts(12, seed=6, mismatch_rate=0.5))


def test_records_in_a_pt_file_audit_like_in_memory(tmp_path):
    recs = _records()
    torch.save([{k: (torch.tensor(v) if k != "id" else v) for k, v in r.items()} for r in recs],
               tmp_path / "r.pt")
    got = audit(str(tmp_path / "r.pt"))
    want = audit(recs)
    got["sources"] = want["sources"]
    for w in got["worst_sequences"]:
        w["source"] = "<records>"
    assert to_json(got) == to_json(want)


EXECUTED = []


def _run_on_load():
    EXECUTED.append(True)
    return []


class _Payload:
    """Pickles as a call to _run_on_load: what a hostile file would smuggle in."""

    def __reduce__(self):
        return _run_on_load, ()


def test_arbitrary_objects_are_refused_not_executed(tmp_path):
    """Pins "files are data": a pickle that would call a function on load is refused by
    weights_only=True, named, and the function never runs."""
    torch.save({"id": _Payload()}, tmp_path / "x.pt")
    with pytest.raises(AuditInputError, match="weights_only=True") as info:
        audit(str(tmp_path / "x.pt"))
    assert str(tmp_path / "x.pt") in str(info.value) and not EXECUTED


BAD = [
    # (columns, text)
    ({"id": ["a"], "prompt_ids": torch.zeros(1, 2, dtype=torch.long),
      "response_ids": torch.zeros(1, 2, 3, dtype=torch.long),
      "engine_logprobs": torch.zeros(1, 2)}, "response_ids: expected a padded 2-D tensor"),
    ({"id": ["a", "b"], "prompt_ids": torch.zeros(1, 2, dtype=torch.long),
      "response_ids": torch.zeros(2, 2, dtype=torch.long),
      "engine_logprobs": torch.zeros(2, 2)}, "column 'prompt_ids' has 1 rows, 'id' has 2"),
    ({"id": ["a"], "prompt_ids": torch.zeros(1, 2, dtype=torch.long),
      "response_ids": torch.zeros(1, 2), "engine_logprobs": torch.zeros(1, 2)},
     "response_ids: values must be integers"),
    ({"id": ["a"], "prompt_ids": [[1, 2]], "response_ids": [torch.zeros(2, 2)],
      "engine_logprobs": [[-1.0]]}, "row 0: response_ids: expected a flat list"),
    ({"id": ["a"], "response_ids": 3}, "response_ids: expected a tensor or a list"),
]


@pytest.mark.parametrize("columns,text", BAD)
def test_bad_columns_are_named(tmp_path, columns, text):
    path = str(tmp_path / "b.pt")
    torch.save(columns, path)
    with pytest.raises(AuditInputError, match=text) as info:
        audit(path)
    assert path in str(info.value)


def test_ragged_lists_of_tensors_with_a_missing_row(tmp_path):
    """A None entry in a ragged column is an absent value for that row (excluded, named)."""
    cols = {"id": ["a", "b"], "prompt_ids": [torch.tensor([1]), torch.tensor([2])],
            "response_ids": [torch.tensor([3, 4]), torch.tensor([5])],
            "engine_logprobs": [torch.tensor([-1.0, -2.0]), None],
            "trainer_logprobs": [torch.tensor([-1.0, -2.0]), torch.tensor([-0.5])]}
    torch.save(cols, tmp_path / "r.pt")
    rep = audit(str(tmp_path / "r.pt"))
    assert rep["sequences"] == 1 and rep["issues"][0]["row"] == 1
    assert rep["issues"][0]["kind"] == "missing_column"
    assert np.isclose(rep["max_abs_diff"], 0.0)
