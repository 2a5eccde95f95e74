"""Kernel benchmarks for a CUDA device: the batch-invariant matmul against cuBLAS.

``matmul_rows(device)`` times :func:`detsample.kernels.matmul.mm` (fixed tiles, no
split-K) and ``torch.mm`` (cuBLAS) on the same operands, for M in ``ms``, K = N = 4096,
in bfloat16 and float32, and reports each as TFLOP/s and the invariant kernel's
throughput as a fraction of cuBLAS (ratios measured in one run). Never used by tests
as an assertion.
"""

from __future__ import annotations

import torch

from detsample.benchmarks.sampler import median_ms

MS = (1, 8, 64, 512)
DTYPES = (torch.bfloat16, torch.float32)


def matmul_rows(
    device: str = "cuda", ms=MS, k: int = 4096, n: int = 4096, dtypes=DTYPES, repeat: int = 20
) -> list[dict]:
    from detsample.kernels import matmul

    rows = []
    g = torch.Generator(device=device).manual_seed(0)
    for dtype in dtypes:
        b = torch.randn(k, n, generator=g, device=device).to(dtype)
        for m in ms:
            a = torch.randn(m, k, generator=g, device=device).to(dtype)
            inv = median_ms(lambda: matmul.mm(a, b), repeat, device)
            ref = median_ms(lambda: torch.mm(a, b), repeat, device)
            flop = 2.0 * m * k * n
            rows.append(
                dict(
                    M=m,
                    K=k,
                    N=n,
                    dtype=str(dtype).replace("torch.", ""),
                    invariant_ms=round(inv, 4),
                    cublas_ms=round(ref, 4),
                    invariant_tflops=round(flop / inv / 1e9, 2),
                    cublas_tflops=round(flop / ref / 1e9, 2),
                    fraction_of_cublas=round(ref / inv, 3),
                )
            )
    return rows


def markdown(rows: list[dict]) -> str:
    lines = [
        "| dtype | M | K=N | invariant ms | cuBLAS ms | invariant TFLOP/s | fraction of cuBLAS |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['dtype']} | {r['M']} | {r['K']} | {r['invariant_ms']} | "
            f"{r['cublas_ms']} | {r['invariant_tflops']} | {r['fraction_of_cublas']} |"
        )
    return "\n".join(lines)
