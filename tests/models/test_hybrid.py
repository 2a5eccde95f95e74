"""A hybrid through HFCausalLM: per-row convolution windows and recurrent states beside the
keys and values (detsample/models/hybrid.py, detsample/models/hf.py).

Under the batch-invariant mode a row's logits AND its states (compared by their bits) are
those of the row run alone by one prefill, in a ragged batch of rows with different cached
lengths and different numbers of new tokens, padded left or right, at 1 and 2 threads;
without the mode the adapter runs (numerics within 1e-4 of the plain forward).

Pins: padding leaking into a state (a padded position advances a convolution window and
decays a recurrent state: the negative control feeds the padded positions to the state
layers and gets other bits), a row's state split from the wrong batch index, a new row
beside rows with state started from anything but zeros, a cache truncated past a state it
cannot undo, a model keeping its state in a cache class of its own run silently.

Qwen3.5 (gated delta-net) in the default suite; LFM2 (short convolutions), Qwen3-Next,
Qwen3.5-MoE, Kimi-Linear, Nemotron-H (Mamba 2) and Jamba (Mamba) with ``-m panel``.
"""

from __future__ import annotations

import pytest
import torch

from detsample.models import HFCausalLM, ModelError, prefill
from detsample.models.hf import HFSeqCache
from detsample.models.hybrid import own_cache_class, row_states, state_layers
from detsample.probe.threads import torch_threads
from tests.invariant.architectures import BY_NAME, build

GEN = torch.Generator().manual_seed(5)
#: (cached tokens, new tokens) per row: mixed pasts, mixed chunk lengths, a new row, a decode
ROWS = [(5, 7), (0, 12), (9, 1), (3, 3)]
SEQS = [torch.randint(3, 512, (p + n,), generator=GEN).tolist() for p, n in ROWS]
MODELS = [pytest.param("qwen35", id="qwen35")] + [
    pytest.param(name, id=name, marks=pytest.mark.panel)
    for name in ("lfm2", "qwen3next", "qwen35moe", "kimilinear", "nemotronh", "jamba")
]


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.int32)


def _same_states(a: HFSeqCache, b: HFSeqCache) -> bool:
    """Every state tensor of ``a`` equal, bit for bit, to ``b``'s (and the same keys)."""
    flat = [
        {(i, attr, k): t for i, d in c.states.items() for attr, h in d.items() for k, t in h.items()} for c in (a, b)
    ]
    return flat[0].keys() == flat[1].keys() and all(
        torch.equal(_bits(flat[0][key]), _bits(flat[1][key])) for key in flat[0]
    )


def _alone(lm: HFCausalLM) -> list[tuple[torch.Tensor, HFSeqCache]]:
    """Each sequence by one prefill of its own: logits and cache."""
    out = []
    for s in SEQS:
        c = lm.new_cache()
        out.append((prefill(lm, s, c), c))
    return out


def _ragged(lm: HFCausalLM) -> tuple[list[torch.Tensor], list[HFSeqCache]]:
    """The rows' pasts by a ragged call, then their new tokens by another."""
    caches = [lm.new_cache() for _ in SEQS]
    have = [(c, s[:p]) for c, s, (p, _) in zip(caches, SEQS, ROWS) if p]
    lm.forward([c for c, _ in have], [t for _, t in have])
    news = lm.forward(caches, [s[p:] for s, (p, _) in zip(SEQS, ROWS)])
    return news, caches


@pytest.mark.parametrize("name", MODELS)
def test_ragged_rows_are_their_alone_bits_under_the_mode(name):
    """Logits and states of every row of a ragged, padded batch == the row alone, bitwise,
    both paddings, 1 and 2 threads (and the same bits at both)."""
    model = build(BY_NAME[name])
    alone = _alone(HFCausalLM(model, batch_invariant=True))
    for threads in (1, 2):
        for padding in ("left", "right"):
            with torch_threads(threads):
                news, caches = _ragged(HFCausalLM(model, padding=padding, batch_invariant=True))
            for b, ((p, _), (full, c)) in enumerate(zip(ROWS, alone)):
                assert torch.equal(_bits(news[b]), _bits(full[p:])), (threads, padding, b)
                assert _same_states(caches[b], c), (threads, padding, b)
                assert caches[b].states and caches[b].token_ids == SEQS[b]


def test_padding_fed_to_the_state_layers_gives_other_bits():
    """Negative control: the same ragged call as ONE padded forward (the state layers fed
    the padded positions) leaves other bits in the states and in the next decode step."""
    lm = HFCausalLM(build(BY_NAME["qwen35"]), padding="left", batch_invariant=True)
    alone = _alone(lm)
    caches = [lm.new_cache() for _ in SEQS]
    have = [(c, s[:p]) for c, s, (p, _) in zip(caches, SEQS, ROWS) if p]
    lm.forward([c for c, _ in have], [t for _, t in have])
    lm._padded(caches, [s[p:] for s, (p, _) in zip(SEQS, ROWS)])  # no segments
    padded = [b for b, (_, n) in enumerate(ROWS) if n < max(n for _, n in ROWS)]
    assert not any(_same_states(caches[b], alone[b][1]) for b in padded)
    nxt = lm.forward([caches[0]], [[7]])[0]
    assert not torch.equal(nxt, lm.forward([alone[0][1]], [[7]])[0])


DEFAULT_KERNEL_MODELS = [pytest.param("qwen35", id="qwen35")] + [
    pytest.param(name, id=name, marks=pytest.mark.panel)
    for name in ("lfm2", "kimilinear", "nemotronh", "bamba", "granitehybrid")
]


@pytest.mark.parametrize("name", DEFAULT_KERNEL_MODELS)
def test_default_kernels_run_a_hybrid_close_to_the_plain_forward(name):
    """Without the mode the adapter runs a hybrid (variant bits allowed), the Mamba 2 ones
    the mode refuses included: each row of the ragged calls within 1e-4 of transformers'
    own one-sequence forward (a state carried to the wrong row, or lost, is O(1))."""
    model = build(BY_NAME[name])
    for padding in ("left", "right"):
        news, caches = _ragged(HFCausalLM(model, padding=padding))
        for s, (p, _), got in zip(SEQS, ROWS, news):
            with torch.no_grad():
                want = model(torch.tensor([s])).logits[0, p:]
            assert (got - want).abs().max() < 1e-4


def test_row_states_are_copies_of_one_batch_row():
    lm = HFCausalLM(build(BY_NAME["qwen35"]))
    caches = [lm.new_cache(), lm.new_cache()]
    lm.forward(caches, [SEQS[0][:4], SEQS[1][:4]])
    ((layer, attrs),) = caches[0].states.items()
    assert layer == 0 and set(attrs) == {"conv_states", "recurrent_states"}
    conv0, conv1 = caches[0].states[0]["conv_states"][0], caches[1].states[0]["conv_states"][0]
    assert conv0.shape[0] == 1 and not torch.equal(conv0, conv1)
    assert conv0.untyped_storage().nbytes() == conv0.numel() * conv0.element_size()


def test_a_hybrid_cache_cannot_go_back():
    lm = HFCausalLM(build(BY_NAME["qwen35"]))
    c = lm.new_cache()
    prefill(lm, SEQS[0], c)
    c.truncate(len(c))  # nothing dropped: allowed
    with pytest.raises(
        ModelError,
        match=r"truncate: this cache holds state beside keys and "
        r"values \(layer 0 \(conv_states/recurrent_states\)\)",
    ):
        c.truncate(len(c) - 1)


def test_a_model_with_a_cache_class_of_its_own_is_refused_by_name():
    """MiniMax keeps its lightning attention's state in MiniMaxCache.linear_cache, not in
    the layers the adapter carries: refused at construction, naming the class."""
    model = build(BY_NAME["minimax"])
    assert own_cache_class(model) == "MiniMaxCache"
    with pytest.raises(
        ModelError,
        match=r"keeps state beside keys and values \(layer 0 "
        r"\(LinearAttentionLayer\)\) in a cache class of its "
        r"own \(MiniMaxCache\)",
    ):
        HFCausalLM(model)


@pytest.mark.parametrize(
    "name,layers",
    [("qwen35", ["layer 0 (LinearAttentionLayer)"]), ("lfm2", ["layer 0 (LinearAttentionLayer)"]), ("llama", [])],
)
def test_state_layers_and_own_cache_class(name, layers):
    model = build(BY_NAME[name])
    assert state_layers(model) == layers and own_cache_class(model) is None
    assert row_states(object(), 0) == {}


def test_speculative_decoding_refuses_a_hybrid_before_it_starts():
    """Its caches cannot drop rejected drafts: named when the engine is built, not at the
    first rejected draft."""
    from detsample.errors import InvalidSamplingParams
    from detsample.refmodel.engine import Engine
    from detsample.refmodel.speculative import NGram, Speculative

    lm = HFCausalLM(build(BY_NAME["qwen35"]))
    with pytest.raises(
        InvalidSamplingParams,
        match=r"model 'Qwen3_5ForCausalLM': speculative "
        r"decoding needs caches with truncate\(n\); "
        r"its caches keep state beside keys",
    ):
        Engine(lm, speculative=Speculative(NGram(), 2))
    Engine(HFCausalLM(build(BY_NAME["llama"])), speculative=Speculative(NGram(), 2))


def test_a_first_forward_shorter_than_the_convolution_window():
    """Pins a refusal of a valid call: a prompt shorter than the kernel (transformers pads
    the window with zeros, ``constant_pad_nd``) as a model's first forward under the mode;
    it continues to the bits of one prefill."""
    lm = HFCausalLM(build(BY_NAME["qwen35"]), batch_invariant=True)
    c = lm.new_cache()
    parts = [prefill(lm, SEQS[1][:2], c), prefill(lm, SEQS[1][2:], c)]
    assert torch.equal(_bits(torch.cat(parts)), _bits(prefill(lm, SEQS[1])))
