"""torch .pt audit inputs: loaded with weights_only=True, columns or records, errors named
(detsample/audit/inputs/torchfile.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from detsample.audit import AuditInputError, audit, to_json
from tests.audit.synth import synth_rollouts, to_records


def _records():
    return to_records(synth_rollouts(12, seed=6, mismatch_rate=0.5))


def test_records_in_a_pt_file_audit_like_in_memory(tmp_path):
    recs = _records()
    torch.save([{k: (torch.tensor(v) if k != "id" else v) for k, v in r.items()} for r in recs], tmp_path / "r.pt")
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
    with pytest.raises(AuditInputError, match="weights_only") as info:
        audit(str(tmp_path / "x.pt"))
    assert str(tmp_path / "x.pt") in str(info.value) and not EXECUTED
    # Bug pinned: the message was cut mid-sentence, carried ANSI colour codes
    # and did not name the blocked global
    msg = str(info.value)
    assert f"{__name__}._run_on_load" in msg and "\x1b" not in msg and "\n" not in msg
    assert msg.endswith("(save the columns as tensors or lists, docs/audit.md)")


def test_a_file_that_is_no_torch_file_is_named(tmp_path):
    (tmp_path / "x.pt").write_bytes(b"garbage" * 10)
    with pytest.raises(
        AuditInputError,
        match=r"x.pt: not a readable torch file with "
        r"weights_only=True \(UnpicklingError: ",
    ) as info:
        audit(str(tmp_path / "x.pt"))
    assert "\x1b" not in str(info.value) and "Weights only load failed" not in str(info.value)


def test_a_legacy_torch_file_is_read(tmp_path):
    """A file saved without the zip format cannot be memory-mapped; it is loaded plainly."""
    cols = {"id": ["a"], "response_ids": [[1]], "engine_logprobs": [[-1.0]], "trainer_logprobs": [[-1.0]]}
    torch.save(cols, tmp_path / "x.pt", _use_new_zipfile_serialization=False)
    assert audit(str(tmp_path / "x.pt"))["tokens"] == 1


BAD = [
    # (columns, text)
    (
        {
            "id": ["a"],
            "prompt_ids": torch.zeros(1, 2, dtype=torch.long),
            "response_ids": torch.zeros(1, 2, 3, dtype=torch.long),
            "engine_logprobs": torch.zeros(1, 2),
        },
        "response_ids: expected a padded 2-D tensor",
    ),
    (
        {
            "id": ["a", "b"],
            "prompt_ids": torch.zeros(1, 2, dtype=torch.long),
            "response_ids": torch.zeros(2, 2, dtype=torch.long),
            "engine_logprobs": torch.zeros(2, 2),
        },
        "column 'prompt_ids' has 1 rows, 'id' has 2",
    ),
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
    cols = {
        "id": ["a", "b"],
        "prompt_ids": [torch.tensor([1]), torch.tensor([2])],
        "response_ids": [torch.tensor([3, 4]), torch.tensor([5])],
        "engine_logprobs": [torch.tensor([-1.0, -2.0]), None],
        "trainer_logprobs": [torch.tensor([-1.0, -2.0]), torch.tensor([-0.5])],
    }
    torch.save(cols, tmp_path / "r.pt")
    rep = audit(str(tmp_path / "r.pt"))
    assert rep["sequences"] == 1 and rep["issues"][0]["row"] == 1
    assert rep["issues"][0]["kind"] == "missing_column"
    assert np.isclose(rep["max_abs_diff"], 0.0)


def test_rows_of_the_wrong_kind_or_shape_are_excluded_not_fatal(tmp_path):
    """A float id tensor or a 2-D entry of a ragged list excludes its row, naming it (it
    was fatal for the whole file: one rule for every format, tests/audit/test_values.py);
    its neighbours are audited."""
    path = str(tmp_path / "b.pt")
    torch.save(
        {
            "id": ["a", "b"],
            "response_ids": [torch.zeros(2, 2, dtype=torch.long), [1, 2]],
            "engine_logprobs": [[-1.0, -1.0], [-1.0, -1.0]],
            "trainer_logprobs": [[-1.0, -1.0], [-1.0, -1.0]],
        },
        path,
    )
    rep = audit(path)
    assert rep["sequences"] == 1 and rep["issues"][0]["kind"] == "ragged"
    assert rep["issues"][0]["row"] == 0 and rep["issues"][0]["field"] == "response_ids"
    torch.save(
        {
            "id": ["a"],
            "response_ids": torch.zeros(1, 2),
            "engine_logprobs": torch.zeros(1, 2) - 1,
            "trainer_logprobs": torch.zeros(1, 2) - 1,
        },
        path,
    )
    (issue,) = audit(path)["issues"]
    assert issue["kind"] == "bad_type" and issue["message"] == "response_ids[0] = 0.0 (values must be integers)"
