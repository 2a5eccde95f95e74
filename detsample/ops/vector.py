"""Elementwise aten kernels with every element on torch's vector loop.

torch runs a contiguous tensor through a vectorised loop and the last ``numel % step``
elements (and each thread's chunk's tail) through a scalar loop whose formula can round
differently (silu, sigmoid, tanh-gelu, pow, exp2 measured), so an element's bits would
depend on its position and on the tensor's size. :func:`pointwise` copies the input into
a buffer padded to a multiple of :data:`PAD` elements and runs it in blocks of
:data:`BLOCK` elements (below torch's 32768-element grain, so one thread and one loop
per block): every element takes the vector path. (That the vector path's bits then depend
on the element alone is a property of torch's kernels, which the batch-invariant mode
verifies on the running machine before it relies on it.)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

PAD = 64  # buffers: a multiple of every vector loop's step (AVX-512: 16 floats x 2)
BLOCK = 16384  # elements per call (a multiple of PAD, below torch's GRAIN_SIZE)


def pointwise(out_op: Callable[..., torch.Tensor], x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    """``out_op(x, *args, out=..., **kwargs)`` with every element on the vector path.

    ``out_op`` is an elementwise aten ``.out`` overload (``aten.silu.out``) whose output
    has ``x``'s dtype. The result is contiguous, shaped and typed like ``x``.
    """
    n = x.numel()
    if x.is_contiguous() and n % PAD == 0:
        if n <= BLOCK:
            return out_op(x, *args, out=torch.empty_like(x), **kwargs)
        buf, npad = x.view(-1), n
    else:
        npad = -(-n // PAD) * PAD
        buf = x.new_zeros((npad,))
        buf[:n].copy_(x.reshape(-1))
    out = buf.new_empty((npad,))
    if npad <= BLOCK:  # one block: no slices to cut
        out_op(buf, *args, out=out, **kwargs)
    else:
        for s in range(0, npad, BLOCK):
            out_op(buf[s : s + BLOCK], *args, out=out[s : s + BLOCK], **kwargs)
    return out[:n].view(x.shape)
