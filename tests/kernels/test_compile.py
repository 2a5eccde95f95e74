"""Every kernel compiles for an sm_90 GPU (H100/H200) ahead of time, with no GPU here.

Triton lowers a kernel to PTX and assembles it with the ``ptxas`` its wheel ships, so a
CPU machine can check that the kernels the interpreter runs are also valid GPU programs
(types, loop-carried values, scalar control flow, layouts of sort/histogram/dot). The
signatures and constants are those the launchers use. Compiled in this process (where
triton is imported without the interpreter) into a temporary cache directory.
"""

import inspect
import re

import pytest

triton = pytest.importorskip("triton")

I32, F32, P32, PI32, PI64, P64 = "i32", "fp32", "*fp32", "*i32", "*i64", "*fp64"


def _sampler_kernels():
    from detsample.kernels import filters, logprobs, prepare, rng

    return [
        (
            "topk_draw",
            filters._topk_draw_kernel,
            dict(
                z_ptr=P32,
                stride=I32,
                V=I32,
                rows_ptr=PI64,
                k_ptr=PI64,
                p_ptr=P64,
                el_ptr=P32,
                el_stride=I32,
                u_ptr=P64,
                bufv_ptr=P32,
                bufi_ptr=PI64,
                tau_ptr=P32,
                total_ptr=PI64,
                tok_ptr=PI64,
                spill_ptr=PI32,
            ),
            dict(FRAC=44, BLOCK=1024, KP=64, CH=16, DRAW=True),
            {},
        ),
        (
            "sorted_threshold",
            filters._sorted_threshold_kernel,
            dict(
                s_ptr=P32,
                stride=I32,
                V=I32,
                rows_ptr=PI64,
                k_ptr=PI64,
                p_ptr=P64,
                el_ptr=P32,
                el_stride=I32,
                tau_ptr=P32,
            ),
            dict(FRAC=44, BLOCK=1024),
            {},
        ),
        (
            "draw_full",
            filters._draw_full_kernel,
            dict(
                z_ptr=P32,
                stride=I32,
                V=I32,
                rows_ptr=PI64,
                tau_ptr=P32,
                el_ptr=P32,
                el_stride=I32,
                u_ptr=P64,
                total_ptr=PI64,
                tok_ptr=PI64,
            ),
            dict(FRAC=44, BLOCK=1024, NB=256, DRAW=True),
            {},
        ),
        (
            "row_stats",
            prepare._row_stats_kernel,
            dict(x_ptr=P32, stride=I32, V=I32, m_ptr=P32, status_ptr=PI32),
            dict(BLOCK=1024),
            {},
        ),
        (
            "sanitize",
            prepare._sanitize_kernel,
            dict(x_ptr=P32, out_ptr=P32, stride_x=I32, stride_o=I32, V=I32),
            dict(BLOCK=1024),
            {},
        ),
        (
            "scale",
            prepare._scale_kernel,
            dict(x_ptr=P32, m_ptr=P32, t_ptr=P32, out_ptr=P32, stride_x=I32, stride_o=I32, V=I32),
            dict(BLOCK=1024),
            {},
        ),
        ("exp", logprobs._exp_kernel, dict(x_ptr=P32, out_ptr=P32, N=I32), dict(BLOCK=1024), {}),
        (
            "log_softmax",
            logprobs._log_softmax_kernel,
            dict(x_ptr=P32, out_ptr=P32, m_ptr=P32, g_ptr=P32, stride_x=I32, stride_o=I32, N=I32),
            dict(FRAC=44, BLOCK=1024, WRITE=True),
            {},
        ),
        (
            "normalisers",
            logprobs._log_softmax_kernel,
            dict(x_ptr=P32, out_ptr=P32, m_ptr=P32, g_ptr=P64, stride_x=I32, stride_o=I32, N=I32),
            dict(FRAC=44, BLOCK=1024, WRITE=False),
            {},
        ),
        (
            "uniforms",
            rng._uniforms_kernel,
            dict(seed_ptr=PI64, pos_ptr=PI64, out_ptr=P64, N=I32),
            dict(STREAM=0, BLOCK=128),
            {},
        ),
    ]


def _invariant_kernels():
    import triton.language as tl

    from detsample.kernels import attention, matmul, rowwise

    mm = {
        n: I32
        for n in [
            "M",
            "N",
            "K",
            "BATCH",
            "PROGRAMS",
            "s_ab",
            "s_am",
            "s_ak",
            "s_bb",
            "s_bk",
            "s_bn",
            "s_cb",
            "s_cm",
            "s_cn",
            "s_xb",
            "s_xm",
            "s_xn",
        ]
    }
    at = {
        n: I32
        for n in [
            "H",
            "GROUP",
            "Lq",
            "Lk",
            "D",
            "q_off",
            "s_qb",
            "s_qh",
            "s_qm",
            "s_qd",
            "s_kb",
            "s_kh",
            "s_kn",
            "s_kd",
            "s_vb",
            "s_vh",
            "s_vn",
            "s_vd",
            "s_mb",
            "s_mh",
            "s_mm",
            "s_mn",
            "s_ob",
            "s_oh",
            "s_om",
            "s_od",
        ]
    }
    out = [
        (
            "softmax",
            rowwise._softmax_kernel,
            dict(x_ptr="*bf16", out_ptr=P32, stride_x=I32, stride_o=I32, N=I32),
            dict(SAFE=True, BLOCK=1024),
            {},
        ),
        (
            "mean",
            rowwise._sum_kernel,
            dict(x_ptr="*bf16", out_ptr="*bf16", stride_x=I32, N=I32),
            dict(MEAN=True, ACC=tl.float32, BLOCK=1024),
            {},
        ),
        (
            "layer_norm",
            rowwise._layer_norm_kernel,
            dict(
                x_ptr="*bf16",
                w_ptr="*bf16",
                b_ptr="*bf16",
                out_ptr="*bf16",
                mean_ptr=P32,
                rstd_ptr=P32,
                stride_x=I32,
                stride_o=I32,
                N=I32,
                eps=F32,
            ),
            dict(HAS_W=True, HAS_B=True, ACC=tl.float32, BLOCK=1024),
            {},
        ),
        (
            "rms_norm",
            rowwise._rms_norm_kernel,
            dict(
                x_ptr="*bf16", w_ptr="*bf16", out_ptr="*bf16", rstd_ptr=P32, stride_x=I32, stride_o=I32, N=I32, eps=F32
            ),
            dict(HAS_W=True, ACC=tl.float32, F64=False, BLOCK=1024),
            {},
        ),
    ]
    for dt, (bm, bn, bk, warps) in matmul.TILES.items():
        name = str(dt).replace("torch.", "")
        ty = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}[name]
        out.append(
            (
                f"matmul_{name}",
                matmul._matmul_kernel,
                dict(mm, a_ptr=f"*{ty}", b_ptr=f"*{ty}", c_ptr=f"*{ty}", bias_ptr=f"*{ty}", alpha=F32, beta=F32),
                dict(HAS_BIAS=True, IEEE=ty == "fp32", BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk),
                {"num_warps": warps},
            )
        )
    for ty, mask, mty in (("bf16", 1, "*i8"), ("fp32", 2, P32)):
        out.append(
            (
                f"attention_{ty}",
                attention._attn_kernel,
                dict(at, q_ptr=f"*{ty}", k_ptr=f"*{ty}", v_ptr=f"*{ty}", m_ptr=mty, o_ptr=f"*{ty}", scale=F32),
                dict(
                    CAUSAL=True,
                    MASK=mask,
                    IEEE=ty == "fp32",
                    BLOCK_M=attention.BLOCK_M,
                    BLOCK_N=attention.BLOCK_N,
                    BLOCK_D=64,
                ),
                {},
            )
        )
    return out


def compile_for_sm90(kernel, types, consts, options, cache_dir):
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from detsample.kernels.common import OPTS

    if not hasattr(kernel, "fn") or type(kernel).__name__ == "InterpretedFunction":
        pytest.skip("this process runs the Triton interpreter")
    names = list(inspect.signature(kernel.fn).parameters)
    sig = {n: "constexpr" if n in consts else types[n] for n in names}
    opts = dict(OPTS, **options)
    with triton.knobs.cache.scope():
        triton.knobs.cache.dir = str(cache_dir)
        compiled = triton.compile(
            ASTSource(fn=kernel, signature=sig, constexprs=consts), target=GPUTarget("cuda", 90, 32), options=opts
        )
    return compiled.asm


#: PTX instructions that would make a kernel's bits the GPU's instead of the definition's:
#: a fused multiply-add (one rounding where the definition has two), the approximate
#: transcendental units (what ``tl.exp`` / ``tl.log`` / libdevice's fast paths become),
#: approximate division or reciprocal, and flush-to-zero of subnormals
NOT_IEEE = re.compile(
    r"\b(fma\.|mad\.(rn|rz|rm|rp|f)|ex2\.|lg2\.|rcp\.|sqrt\.approx|"
    r"div\.(approx|full)|[a-z0-9]+\.[a-z0-9.]*ftz)"
)


def test_sampler_kernels_compile_for_sm90(tmp_path):
    """The kernels of Sampler(backend="triton") are valid sm_90 programs (PTX and
    cubin), and their PTX holds only IEEE arithmetic: no FMA (``enable_fp_fusion=False``
    reaches the compiler), no ``ex2`` / ``lg2`` (no ``tl.exp`` / ``tl.log`` left in a
    path; detsample.arith's helpers instead), no approximate division, no flush to zero;
    float64 -> float32 rounds to nearest (``cvt.rn.f32.f64``) and float -> int truncates
    (``cvt.rzi``). Bugs it pins: an interpreter-only construct (a Python-level
    loop-carried type change, a constexpr reassigned in a static loop) that fails only
    on a real GPU; a ``tl.exp`` or a contracted product, which the interpreter cannot
    show (it ignores launch options and computes ``tl.exp`` with numpy)."""
    for name, kernel, types, consts, options in _sampler_kernels():
        asm = compile_for_sm90(kernel, types, consts, options, tmp_path)
        assert "cubin" in asm and len(asm["ptx"]) > 100, name
        bad = sorted({m.group(0) for m in NOT_IEEE.finditer(asm["ptx"])})
        assert not bad, (name, bad)
        if name in ("exp", "log_softmax", "normalisers", "topk_draw", "draw_full"):
            assert "cvt.rn.f32.f64" in asm["ptx"], name
        if name in ("log_softmax", "normalisers", "topk_draw", "draw_full"):
            assert "cvt.rzi.s64.f64" in asm["ptx"], name


def test_the_ptx_check_sees_a_contraction(tmp_path):
    """The same exp kernel compiled with ``enable_fp_fusion=True`` holds ``fma.rn.f64``
    (the pattern of the test above finds what it looks for)."""
    name, kernel, types, consts, options = next(k for k in _sampler_kernels() if k[0] == "exp")
    asm = compile_for_sm90(kernel, types, consts, dict(options, enable_fp_fusion=True), tmp_path)
    assert NOT_IEEE.search(asm["ptx"]) and "fma.rn.f64" in asm["ptx"]


@pytest.mark.triton_full
def test_invariant_kernels_compile_for_sm90(tmp_path):
    for name, kernel, types, consts, options in _invariant_kernels():
        asm = compile_for_sm90(kernel, types, consts, options, tmp_path)
        assert "cubin" in asm and len(asm["ptx"]) > 100, name
        if name == "softmax":  # arith's exp, not ex2.approx (the attention keeps tl.exp)
            assert not NOT_IEEE.search(asm["ptx"]), name
