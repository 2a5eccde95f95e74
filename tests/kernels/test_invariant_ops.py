"""detsample.kernels.invariant_ops: the aten signatures and semantics of CUDA_IMPLS."""

import pytest
import torch

from tests.kernels.test_rowwise import TOL

#: the aten overload each CUDA_IMPLS entry stands for
ATEN = {
    "mm": torch.ops.aten.mm.default, "addmm": torch.ops.aten.addmm.default,
    "bmm": torch.ops.aten.bmm.default, "_softmax": torch.ops.aten._softmax.default,
    "_log_softmax": torch.ops.aten._log_softmax.default, "mean.dim": torch.ops.aten.mean.dim,
    "rms_norm": torch.ops.aten.rms_norm.default,
    "_fused_rms_norm": torch.ops.aten._fused_rms_norm.default,
}


def _impl_info():
    import inspect

    from detsample.kernels.invariant_ops import ATTENTION, CUDA_IMPLS
    sig = {name: [(p.name, p.kind.name) for p in inspect.signature(f).parameters.values()]
           for name, f in CUDA_IMPLS.items()}
    att = [p.name for p in inspect.signature(ATTENTION).parameters.values()]
    return sig, att


def test_keys_and_argument_names_mirror_aten(interp):
    """Each implementation takes the aten op's arguments by the same names, keyword-only
    where aten says so, so the mode can register it for the op unchanged."""
    sig, att = interp(_impl_info)
    assert set(sig) == set(ATEN)
    for name, op in ATEN.items():
        want = [(a.name, "KEYWORD_ONLY" if a.kwarg_only else "POSITIONAL_OR_KEYWORD")
                for a in op._schema.arguments]
        assert sig[name] == want, name
    assert att[:5] == ["module", "query", "key", "value", "attention_mask"]


CASES = [  # (name, args builder) on CPU tensors, compared with the aten op itself
    ("_softmax", lambda x: (x, 1, False)),
    ("_softmax", lambda x: (x.to(torch.bfloat16), -1, True)),
    ("_log_softmax", lambda x: (x, 0, False)),
    ("mean.dim", lambda x: (x, [1, 2], True)),
    ("mean.dim", lambda x: (x, [0], False)),
    ("mean.dim", lambda x: (x, None, False)),
    ("mean.dim", lambda x: (x.to(torch.bfloat16), [-1], False)),
    ("rms_norm", lambda x: (x, [x.shape[-1]], torch.linspace(0.5, 1.5, x.shape[-1]), None)),
    ("rms_norm", lambda x: (x.to(torch.bfloat16), [x.shape[-2], x.shape[-1]], None, 1e-3)),
    ("_fused_rms_norm", lambda x: (x, [x.shape[-1]], None, 1e-6)),
]


def _run_case(name, args, kwargs):
    from detsample.kernels.invariant_ops import CUDA_IMPLS
    return CUDA_IMPLS[name](*args, **kwargs)


@pytest.mark.parametrize("case", range(len(CASES)))
def test_semantics_match_the_aten_op(interp, case):
    """dims, keepdim, half_to_float, dtype, eps=None (the compute dtype's epsilon) and
    the output shapes/dtypes follow the aten op. Bug it pins: a mapping that reduces the
    wrong dim or returns the wrong dtype under the mode."""
    name, build = CASES[case]
    x = torch.randn(3, 4, 24, generator=torch.Generator().manual_seed(case))
    args = build(x)
    got = interp(_run_case, name, args, {})
    if name == "_softmax" and args[2]:  # aten on CPU refuses half_to_float: its meaning
        want = torch.softmax(args[0].float(), args[1])
    else:
        want = ATEN[name](*args)
    for g, w in zip(got if isinstance(got, tuple) else (got,),
                    want if isinstance(want, tuple) else (want,)):
        assert g.shape == w.shape and g.dtype == w.dtype, (name, g.shape, w.shape)
        assert float((g.double() - w.double()).abs().max()) <= 4 * TOL[w.dtype] * (
            1 + float(w.double().abs().max())), name


def test_addmm_keywords(interp):
    a, b = torch.randn(4, 8), torch.randn(8, 3)
    bias = torch.randn(3)
    got = interp(_run_case, "addmm", (bias, a, b), {"beta": 0.5, "alpha": 2})
    want = torch.addmm(bias, a, b, beta=0.5, alpha=2)
    assert float((got - want).abs().max()) <= 1e-5
