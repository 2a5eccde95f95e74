"""Writes the preset example files next to this script (run it from the repository root:
``python -m tests.data.audit_presets.make_examples``: it reads the test-data generator
``tests/audit/synth.py``). The files are committed; the tests
read them, they never regenerate them.

One small batch of 8 rollouts (2 prompts x 4 samples, GRPO-style), float32 logprobs, a
multi-turn sample whose tool-result tokens are masked out (engine logprob 0.0 there, as
verl and OpenRLHF write), one sample that matches bitwise, the others with small
engine/trainer differences, stored five ways:

* ``rollouts.jsonl``: the ragged truth, under the audit's own column names;
* ``verl.parquet``: a verl DataProto batch (uid, prompts left-padded, responses
  right-padded, attention_mask over prompt + response, response_mask,
  rollout_log_probs, old_log_probs), written as Parquet list columns;
* ``openrlhf.pt``: an OpenRLHF Experience (sequences, attention_mask, action_mask,
  rollout_log_probs, action_log_probs; per-token entries shifted by one), torch.save;
* ``trl.pt``: TRL GRPOTrainer inputs (prompt_ids / prompt_mask left-padded,
  completion_ids / completion_mask right-padded, sampling_per_token_logps,
  old_per_token_logps, tool_mask padded with 1), torch.save;
* ``slime.pt``: a slime --save-debug-train-data dump (format_version 2, "samples": one
  dict per sample with tokens, response_lengths, loss_masks, rollout_log_probs,
  log_probs, sample_index; tensors where slime keeps tensors), torch.save.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from tests.audit.synth import from_records, padded_twin, slime_samples, write_columns

HERE = Path(__file__).resolve().parent


def records() -> list[dict]:
    rng = np.random.default_rng(20261201)
    out = []
    for i in range(8):
        group = i // 4
        prompt = [101 + group, 7, 8 + group, 9][: 3 + group]
        n = int(rng.integers(3, 9))
        resp = rng.integers(1000, 2000, n).tolist()
        eng = np.log(rng.random(n) * 0.98 + 0.01).astype(np.float32)
        trn = eng.copy()
        mask = [1] * n
        if i == 5:  # multi-turn: tokens 2..3 are a tool result (masked, engine 0.0)
            mask[2:4] = [0, 0]
            eng[2:4] = 0.0
        if i != 2:  # sample 2 matches bitwise; the others differ on some tokens
            hit = rng.random(n) < 0.6
            trn = np.minimum(trn + hit * rng.normal(0, 1e-3, n).astype(np.float32), 0.0)
            trn = trn.astype(np.float32)
        out.append(
            {
                "id": f"{group}",
                "prompt_ids": prompt,
                "response_ids": resp,
                "engine_logprobs": eng.tolist(),
                "trainer_logprobs": trn.tolist(),
                "mask": mask,
            }
        )
    return out


def main() -> None:
    recs = records()
    with open(HERE / "rollouts.jsonl", "w") as f:
        for r in recs:
            f.write(json.dumps(r) + "\n")
    cols = from_records(recs)
    verl = padded_twin(cols, "verl", seed=1)
    verl["uid"] = np.array([f"uid-{r['id']}" for r in recs])  # one uid per prompt group
    write_columns(verl, str(HERE / "verl.parquet"))
    write_columns(padded_twin(cols, "openrlhf", seed=2), str(HERE / "openrlhf.pt"))
    write_columns(padded_twin(cols, "trl", seed=3), str(HERE / "trl.pt"))
    samples = []
    for k, s in enumerate(slime_samples(cols)):
        samples.append(
            {
                "data_parallel_rank": 0,
                "sample_index": k,
                "tokens": torch.tensor(s["tokens"]),
                "response_lengths": s["response_length"],
                "loss_masks": torch.tensor(s["loss_mask"], dtype=torch.int32),
                "rollout_log_probs": s["rollout_log_probs"],
                "log_probs": torch.tensor(s["log_probs"], dtype=torch.float32),
            }
        )
    torch.save({"format_version": 2, "rollout_id": 0, "rank": 0, "samples": samples}, HERE / "slime.pt")


if __name__ == "__main__":
    main()
