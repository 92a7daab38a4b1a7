"""Every TMA descriptor the kernels of ``fast`` take, made in one place (notebooks 10 to 12).

A TMA descriptor tells Hopper's copy engine where a matrix lies in global memory (its base, shape and
strides) and which tile one copy moves; the kernel then asks for a tile by its coordinates. The course's
kernels see each (B, H, N, D) input as one (B·H·N, D) matrix of rows, and ask for the rows of a head by
the head's first row; ``lse`` and ``delta`` are vectors of B·H·N floats. The copy engine wants each row's
start 16-byte aligned, so the inputs are contiguous and their base addresses aligned (:func:`tma_ready`).

Triton's kernels take ``TensorDescriptor`` s (``triton.tools``); the Gluon kernels take Gluon's, which also
carry the tile's shared-memory layout (its swizzle).
"""

from __future__ import annotations

import functools

import torch

from . import triton_compat as tc


def tma_ready(x: torch.Tensor) -> torch.Tensor:
    """``x`` itself if the copy engine can read it as a matrix of rows (contiguous, 16-byte aligned), else a copy."""
    if x.is_contiguous() and x.data_ptr() % 16 == 0:
        return x
    return x.clone(memory_format=torch.contiguous_format)


def rows(x: torch.Tensor, block_rows: int):
    """A Triton TMA descriptor over contiguous ``x`` (…, N, D) seen as one (all rows, D) matrix, in
    (block_rows, D) tiles."""
    D = x.shape[-1]
    return tc.TensorDescriptor(x, shape=[x.numel() // D, D], strides=[D, 1], block_shape=[block_rows, D])


@functools.lru_cache(maxsize=64)
def _tile_layout(block: tuple, dtype: torch.dtype):
    """The swizzled shared-memory layout of a Gluon tile (remembered: working it out costs ~20 µs)."""
    return tc.gl.NVMMASharedLayout.get_default_for(list(block), _GL_DTYPES[dtype]())


_GL_DTYPES = {torch.float16: lambda: tc.gl.float16, torch.bfloat16: lambda: tc.gl.bfloat16,
              torch.float32: lambda: tc.gl.float32}


def gluon_rows(x: torch.Tensor, block_rows: int):
    """A Gluon TMA descriptor over contiguous ``x`` (…, N, D) seen as one (all rows, D) matrix, in (block_rows, D)
    tiles with the swizzle the tensor cores read (float16, bfloat16, or float32 for dQ's sums)."""
    D = x.shape[-1]
    return tc.GluonTensorDescriptor(x, [x.numel() // D, D], [D, 1], [block_rows, D], _tile_layout((block_rows, D), x.dtype))


def gluon_vector(x: torch.Tensor, block: int):
    """A Gluon TMA descriptor over contiguous float32 ``x`` (lse, delta) seen as one vector, in blocks of ``block``."""
    layout = tc.gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=32, rank=1)
    return tc.GluonTensorDescriptor(x, [x.numel()], [1], [block], layout)
