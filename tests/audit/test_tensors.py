"""from_tensors: the audit of a padded training batch equals the file audit of the same
rows, from numpy or torch on any device (detsample/audit/running/tensors.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from detsample.audit import AuditInputError, audit, from_tensors, to_json
from tests.audit.synth import padded_twin, synth_rollouts, to_records, write_npz

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.fixture(scope="module")
def batch(tmp_path_factory):
    cols = synth_rollouts(30, seed=12, mismatch_rate=0.5)
    cols["id"] = [str(i) for i in range(30)]
    path = tmp_path_factory.mktemp("t") / "b.npz"
    write_npz(cols, str(path))
    return padded_twin(cols, "default", seed=3), to_json(audit(str(path))), str(path)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", ["numpy", "torch"])
def test_from_tensors_equals_the_file_report(batch, device, kind):
    """Pins the training-loop entry: same unpadding, validation and exact metrics as the
    file audit, byte for byte (with the file's name as source)."""
    arrays, want, path = batch
    if kind == "numpy":
        if device != "cpu":
            pytest.skip("numpy arrays live on the host")
        conv = np.asarray
    else:

        def conv(a):
            return torch.from_numpy(a).to(device)

    rep = from_tensors(
        conv(arrays["response_ids"]),
        conv(arrays["engine_logprobs"]),
        conv(arrays["trainer_logprobs"]),
        conv(arrays["mask"]),
        attention_mask=conv(arrays["attention_mask"]),
        prompt_ids=conv(arrays["prompt_ids"]),
        prompt_attention_mask=conv(arrays["prompt_attention_mask"]),
        source=path,
        chunk_tokens=64,
    )
    assert to_json(rep) == want


def test_from_tensors_copies_no_tensor_to_python_lists(batch, monkeypatch):
    """Pins "no copy of the batch to Python lists": tolist and iteration of tensors fail."""
    arrays, want, path = batch

    def refuse(*a, **k):
        raise AssertionError("a tensor was turned into Python objects")

    monkeypatch.setattr(torch.Tensor, "tolist", refuse)
    monkeypatch.setattr(torch.Tensor, "__iter__", refuse)
    t = {k: torch.from_numpy(v) for k, v in arrays.items() if v.ndim == 2}
    rep = from_tensors(
        t["response_ids"],
        t["engine_logprobs"],
        t["trainer_logprobs"],
        t["mask"],
        attention_mask=t["attention_mask"],
        prompt_ids=t["prompt_ids"],
        prompt_attention_mask=t["prompt_attention_mask"],
        source=path,
    )
    assert to_json(rep) == want


def test_bfloat16_is_widened_exactly():
    """Pins bf16 logprobs: audited as their exact float32 values."""
    rng = np.random.default_rng(0)
    e = torch.from_numpy(np.log(rng.random((4, 9)) + 1e-3).astype(np.float32))
    t = (e + 1e-2).clamp(max=0)
    ids = torch.zeros(4, 9, dtype=torch.long)
    a = from_tensors(ids, e.bfloat16(), t.bfloat16())
    b = from_tensors(ids, e.bfloat16().float(), t.bfloat16().float())
    assert a == b and a["tokens"] == 36


def test_without_attention_mask_rows_end_at_the_last_trained_token(batch):
    arrays, _, _ = batch
    rep = from_tensors(arrays["response_ids"], arrays["engine_logprobs"], arrays["trainer_logprobs"], arrays["mask"])
    lens = arrays["attention_mask"].sum(1)
    m = arrays["mask"]
    last = np.where(m.any(1), m.shape[1] - np.argmax(m[:, ::-1], axis=1), 0)
    assert rep["response_tokens"] == int(last.sum()) <= int(lens.sum())
    assert rep["tokens"] == int(m.sum())


BAD = [
    # (change, text)
    (lambda a: {**a, "mask": a["mask"][:, 1:]}, "argument mask of from_tensors: shape"),
    (lambda a: {**a, "engine_logprobs": a["engine_logprobs"][0]}, "engine_logprobs must be 2-D"),
    (lambda a: {**a, "attention_mask": a["attention_mask"] * 3}, "padding masks hold 0/1"),
]


@pytest.mark.parametrize("change,text", BAD)
def test_bad_tensors_are_named(batch, change, text):
    arrays, _, _ = batch
    a = change(dict(arrays))
    with pytest.raises(AuditInputError, match=text.replace("(", r"\(").replace(")", r"\)")):
        from_tensors(
            a["response_ids"],
            a["engine_logprobs"],
            a["trainer_logprobs"],
            a["mask"],
            attention_mask=a["attention_mask"],
        )


def test_bad_values_are_excluded_like_files():
    """Pins the shared validation: a NaN trainer logprob excludes its row, named by row."""
    e = np.full((3, 4), -1.0)
    t = e.copy()
    t[1, 2] = np.nan
    rep = from_tensors(np.ones((3, 4), dtype=np.int64), e, t, ids=["a", "b", "c"])
    assert rep["excluded_by_kind"] == {"nan": 1} and rep["issues"][0]["row"] == 1
    with pytest.raises(AuditInputError, match="ids has 2 entries for 3 rows"):
        from_tensors(np.ones((3, 4), dtype=np.int64), e, e, ids=["a", "b"])


def test_records_and_tensors_agree_on_a_realistic_batch():
    cols = synth_rollouts(16, seed=2, mismatch_rate=1.0, dtype="float64")
    arrays = padded_twin(cols, "default")
    rep = from_tensors(
        arrays["response_ids"],
        arrays["engine_logprobs"],
        arrays["trainer_logprobs"],
        arrays["mask"],
        attention_mask=arrays["attention_mask"],
        ids=cols["id"],
    )
    want = audit(to_records(cols))
    for k in ("tokens", "mean_abs_diff", "k3_kl_mean", "importance_ratio", "abs_diff_quantiles"):
        assert rep[k] == want[k]
