"""detsample.kernels.invariant_ops: the aten signatures and semantics of CUDA_IMPLS."""

import pytest
import torch

from tests.kernels.test_rowwise import TOL

#: the aten overload each CUDA_IMPLS entry stands for
ATEN = {
    "mm": torch.ops.aten.mm.default,
    "addmm": torch.ops.aten.addmm.default,
    "bmm": torch.ops.aten.bmm.default,
    "_softmax": torch.ops.aten._softmax.default,
    "_log_softmax": torch.ops.aten._log_softmax.default,
    "mean.dim": torch.ops.aten.mean.dim,
    "rms_norm": torch.ops.aten.rms_norm.default,
    "_fused_rms_norm": torch.ops.aten._fused_rms_norm.default,
    "baddbmm": torch.ops.aten.baddbmm.default,
    "mv": torch.ops.aten.mv.default,
    "dot": torch.ops.aten.dot.default,
    "sum": torch.ops.aten.sum.default,
    "sum.dim_IntList": torch.ops.aten.sum.dim_IntList,
    "mean": torch.ops.aten.mean.default,
    "_safe_softmax": torch.ops.aten._safe_softmax.default,
    "native_layer_norm": torch.ops.aten.native_layer_norm.default,
}


def _impl_info():
    import inspect

    from detsample.kernels.invariant_ops import ATTENTION, CUDA_IMPLS

    sig = {
        name: [(p.name, p.kind.name) for p in inspect.signature(f).parameters.values()]
        for name, f in CUDA_IMPLS.items()
    }
    att = [p.name for p in inspect.signature(ATTENTION).parameters.values()]
    return sig, att


def test_keys_and_argument_names_mirror_aten(interp):
    """Each implementation takes the aten op's arguments by the same names, keyword-only
    where aten says so, so the mode can register it for the op unchanged."""
    sig, att = interp(_impl_info)
    assert set(sig) == set(ATEN)
    for name, op in ATEN.items():
        want = [(a.name, "KEYWORD_ONLY" if a.kwarg_only else "POSITIONAL_OR_KEYWORD") for a in op._schema.arguments]
        assert sig[name] == want, name
    assert att[:5] == ["module", "query", "key", "value", "attention_mask"]


FULL = pytest.mark.triton_full


def case(name, build, id, full=False):
    return pytest.param(name, build, id=id, marks=[FULL] if full else [])


def masked(x):
    """Every fifth column -inf, and the slices x[:, 2] entirely -inf."""
    x = x.masked_fill(torch.arange(x.shape[-1]) % 5 == 0, float("-inf"))
    return x.index_fill(1, torch.tensor([2]), float("-inf"))


def ramp(x, lo, hi):
    return torch.linspace(lo, hi, x.shape[-1])


# (aten op name, args builder) on CPU tensors x (3, 4, 24), compared with the aten op
# itself; one or two cases per op in the default run, the rest with -m triton_full
CASES = [
    case("_softmax", lambda x: (x, 1, False), "softmax-dim1"),
    case("_softmax", lambda x: (x.to(torch.bfloat16), -1, True), "softmax-half-to-float"),
    case("_log_softmax", lambda x: (x, 0, False), "log_softmax-dim0", full=True),
    case("mean.dim", lambda x: (x, [1, 2], True), "mean-dims-keepdim"),
    case("mean.dim", lambda x: (x, [0], False), "mean-dim0"),
    case("mean.dim", lambda x: (x, None, False), "mean-all", full=True),
    case("mean.dim", lambda x: (x.to(torch.bfloat16), [-1], False), "mean-bf16", full=True),
    case("rms_norm", lambda x: (x, [24], ramp(x, 0.5, 1.5), None), "rms_norm"),
    case("rms_norm", lambda x: (x.to(torch.bfloat16), [4, 24], None, 1e-3), "rms_norm-bf16", full=True),
    case("_fused_rms_norm", lambda x: (x, [24], None, 1e-6), "fused_rms_norm", full=True),
    case("sum.dim_IntList", lambda x: (x, [0, 2], True), "sum-dims", full=True),
    case("sum.dim_IntList", lambda x: (x.to(torch.bfloat16), [-1], False, torch.float32), "sum-bf16-dtype"),
    case("sum.dim_IntList", lambda x: ((x * 4).to(torch.int32), [1], False), "sum-int-native"),
    case("sum", lambda x: (x,), "sum-all", full=True),
    case("mean", lambda x: (x,), "mean-all-elements", full=True),
    case("_safe_softmax", lambda x: (masked(x), -1), "safe_softmax"),
    case("native_layer_norm", lambda x: (x, [24], ramp(x, 0.5, 1.5), ramp(x, -1, 1), 1e-5), "layer_norm"),
    case(
        "native_layer_norm", lambda x: (x.to(torch.bfloat16), [4, 24], None, None, 1e-5), "layer_norm-bf16", full=True
    ),
    case("baddbmm", lambda x: (x[:, :1, :8], x[:, :, :12], x.reshape(3, 12, 8)), "baddbmm"),
    case("mv", lambda x: (x[0], x[1, 0]), "mv"),
    case("dot", lambda x: (x[0, 0], x[1, 1]), "dot", full=True),
]


def _run_case(name, args, kwargs):
    from detsample.kernels.invariant_ops import CUDA_IMPLS

    return CUDA_IMPLS[name](*args, **kwargs)


def _kwargs_of(name, args):
    """sum.dim_IntList's fourth case argument is its keyword-only dtype."""
    if name == "sum.dim_IntList" and len(args) == 4:
        return args[:3], {"dtype": args[3]}
    return args, {}


@pytest.mark.parametrize("name,build", CASES)
def test_semantics_match_the_aten_op(interp, name, build):
    """dims, keepdim, half_to_float, dtype, eps=None (the compute dtype's epsilon) and
    the output shapes/dtypes follow the aten op. Bug it pins: a mapping that reduces the
    wrong dim or returns the wrong dtype under the mode."""
    x = torch.randn(3, 4, 24, generator=torch.Generator().manual_seed(len(name)))
    args, kwargs = _kwargs_of(name, build(x))
    got = interp(_run_case, name, args, kwargs)
    if name == "_softmax" and args[2]:  # aten on CPU refuses half_to_float: its meaning
        want = torch.softmax(args[0].float(), args[1])
    else:
        want = ATEN[name](*args, **kwargs)
    want = want if isinstance(want, tuple) else (want,)
    if name == "native_layer_norm":  # CUDA keeps mean/rstd in the accumulate type (CPU not)
        want = (want[0],) + ATEN[name](args[0].float(), *args[1:])[1:]
    for g, w in zip(got if isinstance(got, tuple) else (got,), want):
        assert g.shape == w.shape and g.dtype == w.dtype, (name, g.shape, w.shape)
        if not w.dtype.is_floating_point:
            assert torch.equal(g, w), name
            continue
        assert float((g.double() - w.double()).abs().max()) <= 4 * TOL[w.dtype] * (1 + float(w.double().abs().max())), (
            name
        )


def test_addmm_keywords(interp):
    a, b = torch.randn(4, 8), torch.randn(8, 3)
    bias = torch.randn(3)
    got = interp(_run_case, "addmm", (bias, a, b), {"beta": 0.5, "alpha": 2})
    want = torch.addmm(bias, a, b, beta=0.5, alpha=2)
    assert float((got - want).abs().max()) <= 1e-5


def test_log_softmax_is_detsample_arith(interp):
    """aten ``_log_softmax`` under the mode is detsample.arith's log_softmax of each
    slice (float32: bit for bit; bfloat16: arith's float32 result rounded once to
    bfloat16), along any dim, with -inf entries and a NaN slice. Bug it pins: the
    mode's log_softmax computed with the GPU's ``ex2`` / ``lg2`` (a float32 sum and
    ``tl.log``), whose bits are the GPU kind's."""
    from detsample import arith

    x = torch.randn(3, 4, 24, generator=torch.Generator().manual_seed(4)) * 5
    x[0, 1, ::2] = float("-inf")
    x[2, 3, 5] = float("nan")
    got = interp(_run_case, "_log_softmax", (x, -1, False), {})
    assert torch.equal(got.view(torch.int32), arith.log_softmax(x).view(torch.int32))
    got = interp(_run_case, "_log_softmax", (x, 1, False), {})
    want = arith.log_softmax(x.movedim(1, -1).contiguous()).movedim(-1, 1)
    assert torch.equal(got.view(torch.int32), want.view(torch.int32))
    b = x.to(torch.bfloat16)
    got = interp(_run_case, "_log_softmax", (b, -1, False), {})
    assert got.dtype == torch.bfloat16
    assert torch.equal(got.view(torch.int16), arith.log_softmax(b.float()).to(torch.bfloat16).view(torch.int16))
