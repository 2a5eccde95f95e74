"""An odd vocabulary (GPT-2's 50257) padded as vLLM pads it: TP=1's bits, and no padded column
ever reaches the sampler.

The padded rows (zeros in the weights) give logit columns that the vocab-parallel head cuts
before anything reads the logits. The tests make those columns live (the last rank's
padding rows of ``lm_head`` set to large values, so a padded logit is the row's maximum)
and show that the cut logits, tokens and logprobs are still TP=1's, while the uncut row (the
negative control: a head that forgets the cut) has its greedy token in the padding and
other logprob bits.
"""

from __future__ import annotations

import pytest
import torch

from detsample import Request, Sampler, SamplingBatch, SamplingParams
from detsample.models import load_model
from detsample.parallel import TensorParallelError, TPModelSpec, plan, tp_group
from detsample.parallel.layout import VOCAB_PADDING, padded_vocab
from detsample.probe.parallel import forwards, job_forwards
from tests.parallel import models
from tests.parallel.tp import CFG, START, assert_bitwise, bits, tp_runs

PROMPT = [5, 300, 17, 42, 7, 511, 9]


@pytest.fixture(scope="module")
def reference():
    return load_model(models.ODD_VOCAB, batch_invariant=True, portable=True)


@pytest.mark.parametrize(
    "vocab, tp, padded",
    [
        (models.GPT2_VOCAB, 1, 50304),
        (models.GPT2_VOCAB, 2, 50304),
        (models.GPT2_VOCAB, 4, 50304),
        (models.GPT2_VOCAB, 8, 50304),
        (512, 4, 512),
        (510, 2, 512),
        (1, 2, 64),
        (65, 2, 128),
    ],
)
def test_padding_rule_is_vllms(vocab, tp, padded):
    # vLLM: pad_vocab_size(vocab, 64) = ceil(vocab / 64) * 64, then divide(padded, tp)
    assert padded_vocab(vocab, tp) == padded
    assert padded % VOCAB_PADDING == 0 and padded % tp == 0 and padded - vocab < VOCAB_PADDING


def test_padding_a_tp_size_cannot_split_is_refused_by_name():
    with pytest.raises(
        TensorParallelError,
        match=r"tp=3 does not divide the padded vocabulary 128 "
        r"\(config.vocab_size=65 rounded up to a multiple of 64",
    ):
        padded_vocab(65, 3)


@pytest.mark.parametrize("tp, rows", [(2, 25152), (4, 12576)])
def test_gpt2_vocab_layout(tp, rows):
    lay = plan(models.llama_gpt2_vocab(), tp)
    assert (lay.vocab, lay.vocab_size) == (rows, models.GPT2_VOCAB)
    assert lay.vocab_rows(tp - 1).stop == 50304 > models.GPT2_VOCAB  # the last rank holds the padding


def _make_padding_live(lm, comm) -> int:
    """Set the last rank's padding rows of lm_head to 10x the prompt's last hidden state, so
    a padded logit is that row's maximum (10 |h|^2); returns the padded size."""
    head = lm.module.lm_head
    seen = []
    hook = head.register_forward_hook(lambda mod, args, out: seen.append(args[0][0, -1].clone()))
    lm.forward([lm.new_cache()], [PROMPT])
    hook.remove()
    rows = head.shard.weight.shape[0]
    if comm.rank == comm.world - 1:
        with torch.no_grad():
            head.shard.weight[head.vocab - comm.rank * rows :] = 10.0 * seen[0]
    return rows * comm.world


def _sample(logits: torch.Tensor, width: int):
    reqs = [
        Request("g", SamplingParams(temperature=0.0, logprobs=3), PROMPT, []),
        Request("s", SamplingParams(temperature=1.0, seed=3, logprobs=3), PROMPT, []),
    ]
    batch = SamplingBatch.from_requests(reqs, vocab_size=width)
    rows = logits[-1:].expand(2, -1).contiguous()
    out = Sampler().sample(rows, batch, torch.tensor([len(PROMPT)] * 2))
    return {
        "tokens": out.token_ids,
        "logprobs": out.logprobs,
        "top": out.top_logprobs[0],
        "top_ids": out.top_logprobs[1],
    }


def job_live_padding(lm, comm):
    """The cut logits and their samples, then the uncut ones (a head that forgets the cut)."""
    padded = _make_padding_live(lm, comm)
    cut = lm.forward([lm.new_cache()], [PROMPT])[0]
    lm.module.lm_head.vocab = padded  # the negative control: no cut (past the
    inner = getattr(lm, "inner", lm)  # adapter's shape check, which would refuse it)
    uncut = inner.forward([inner.new_cache()], [PROMPT])[0]
    return {
        "cut": cut,
        "cut_samples": _sample(cut, cut.shape[-1]),
        "uncut": uncut,
        "uncut_samples": _sample(uncut, uncut.shape[-1]),
    }


def test_tp2_gpt2_vocab_logits_equal_tp1_bitwise(reference):
    want, got, live = tp_runs(models.ODD_VOCAB, 2, job_live_padding)
    assert want["prefill"].shape[-1] == models.GPT2_VOCAB
    assert_bitwise(got, want)
    tp1 = reference.forward([reference.new_cache()], [PROMPT])[0]
    assert torch.equal(bits(live["cut"]), bits(tp1))
    want_s = _sample(tp1, models.GPT2_VOCAB)
    for k, v in want_s.items():
        assert torch.equal(live["cut_samples"][k], v), k
    assert int(live["cut_samples"]["top_ids"].max()) < models.GPT2_VOCAB
    # negative control: uncut, the live padding is drawn and the logprobs normalise over it
    assert live["uncut"].shape[-1] == 50304
    assert torch.equal(bits(live["uncut"][:, : models.GPT2_VOCAB]), bits(tp1))
    assert int(live["uncut_samples"]["tokens"][0]) >= models.GPT2_VOCAB
    assert not torch.equal(live["uncut_samples"]["logprobs"], want_s["logprobs"])


@pytest.mark.tp_full
def test_tp4_gpt2_vocab_logits_equal_tp1_bitwise(reference):
    with tp_group(TPModelSpec(models.ODD_VOCAB, 4, True, True), timeout=300, start_method=START) as g:
        got = g.call(job_forwards, CFG)
    assert_bitwise(got, forwards(reference, CFG))
