"""Every TMA descriptor the kernels of ``fast`` take, made in one place (notebooks 10 to 12).

A TMA descriptor tells Hopper's copy engine where a matrix lies in global memory (its base, shape and
strides) and which tile one copy moves; the kernel then asks for a tile by its coordinates. The course's
kernels see each (B, H, N, D) input as one (B·H·N, D) matrix of rows, and ask for the rows of a head by
the head's first row; ``lse`` and ``delta`` are vectors of B·H·N floats. The copy engine wants each row's
start 16-byte aligned, so the inputs are contiguous and their base addresses aligned (:func:`tma_ready`).

The Gluon kernels also read (B, H, N, D) views of (B, N, H, D) memory in place, the layout a model's
``qkv(x).view(B, N, H, D).transpose(1, 2)`` (or a slice of one fused QKV projection) hands them: there the
heads lie side by side in each row, so the kernels see one (B·N, H·D) matrix and ask for head h's tile at
column h·D (:func:`heads_in_columns`). A descriptor takes the row stride, so a fused projection's rows of
3·H·D elements need no copy either.

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


def _bnhd_row_stride(x: torch.Tensor) -> int | None:
    """The stride between consecutive rows of the (B·N, H·D) matrix that (B, H, N, D) ``x`` is a view of, or None
    if it is not such a view (heads side by side in each row, rows of one batch evenly spaced, the batches one
    after another) with 16-byte-aligned rows."""
    B, H, N, D = x.shape
    if x.stride(3) != 1 or (H > 1 and x.stride(1) != D):
        return None
    row = x.stride(2) if N > 1 else x.stride(0) if B > 1 else H * D
    if row < H * D or (B > 1 and x.stride(0) != N * row) or (row * x.element_size()) % 16:
        return None
    return row


def model_layout(x: torch.Tensor) -> bool:
    """Whether (B, H, N, D) ``x`` is a view of (B, N, H, D) memory (not contiguous): what a model hands the drop-in.
    The outputs follow their inputs by this rule (o and dq like q, dk like k, dv like v), on every path and in the
    operators' fake implementations, which see only shapes and strides (:func:`empty_in_layout_of`)."""
    return x.dim() == 4 and not x.is_contiguous() and _bnhd_row_stride(x) is not None


def empty_in_layout_of(x: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """A new tensor shaped like (B, H, N, D) ``x``, laid out as :func:`model_layout` says: (B, N, H, D) memory seen
    through ``transpose(1, 2)``, or contiguous."""
    dtype = x.dtype if dtype is None else dtype
    if model_layout(x):
        B, H, N, D = x.shape
        return x.new_empty((B, N, H, D), dtype=dtype).transpose(1, 2)
    return x.new_empty(x.shape, dtype=dtype)


def in_layout_of(t: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """``t`` laid out as :func:`empty_in_layout_of` would lay out a tensor like ``x`` (a copy only where it is not)."""
    if model_layout(x):
        if t.transpose(1, 2).is_contiguous():
            return t
        out = empty_in_layout_of(x, t.dtype)
        out.copy_(t)
        return out
    return t.contiguous()


def heads_in_columns(*xs: torch.Tensor) -> bool | None:
    """How the Gluon kernels read every one of the (B, H, N, D) tensors ``xs`` in place: False, as one (B·H·N, D)
    matrix (each is contiguous); True, as one (B·N, H·D) matrix with head h in columns h·D .. h·D + D (each is a
    (B, N, H, D) layout seen through ``transpose(1, 2)``, :func:`gluon_heads`); None: neither for all of them, or a
    base address not 16-byte aligned (then the caller copies, :func:`tma_ready`)."""
    if any(x.data_ptr() % 16 for x in xs):
        return None
    if all(x.is_contiguous() for x in xs):
        return False
    if all(_bnhd_row_stride(x) is not None for x in xs):
        return True
    return None


def gluon_heads(x: torch.Tensor, block_rows: int, in_columns: bool):
    """A Gluon TMA descriptor over (B, H, N, D) ``x`` in (block_rows, D) tiles: :func:`gluon_rows` when ``in_columns``
    is False, else over the (B·N, H·D) matrix of :func:`heads_in_columns` (row stride as ``x`` has it)."""
    if not in_columns:
        return gluon_rows(x, block_rows)
    B, H, N, D = x.shape
    return tc.GluonTensorDescriptor(x, [B * N, H * D], [_bnhd_row_stride(x), 1], [block_rows, D],
                                    _tile_layout((block_rows, D), x.dtype))


def rebase(desc, x: torch.Tensor):
    """``desc`` over ``x`` instead of its base: for an ``x`` with the base's shape, strides, dtype and alignment (a
    prepared problem's next call), without validating the layout again (a Gluon descriptor's checks cost several
    µs per descriptor per call)."""
    new = object.__new__(type(desc))
    new.__dict__.update(desc.__dict__)
    new.base = x
    return new


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
