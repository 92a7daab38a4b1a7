"""The small kernels of the Triton primer (notebooks 01 and 01b), each showing one idea, each with its launcher.

* ``program_ids``: which program wrote which element (programs, the grid, a masked ragged end)
* ``masked_load``: what ``tl.load`` returns where its mask is False (``other=``)
* ``row_sums``: a 2-D tile read through strides and reduced along one axis
* ``dot_tile`` (01b): one ``tl.dot`` of an (M, K) tile with a (K, N) tile
* ``count`` (01b): many programs adding into one number, with a plain read-add-write (a race that the
  interpreter, which runs one program after another, never shows) or with ``tl.atomic_add``

The exercises of notebook 01 (a scaled add, a transpose) and 01b (a row softmax, a tiled matmul) are written
by the learner; their checks are in ``flashattn.exercises.primer``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from flashattn import runtime


@triton.jit
def program_ids_kernel(OUT, N, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    tl.store(OUT + offs, pid, mask=offs < N)


def program_ids(N: int, block: int, programs: int | None = None) -> torch.Tensor:
    """Launch ``programs`` programs (default: enough to cover N) of ``block`` elements; -1 = not written."""
    out = torch.full((N,), -1, dtype=torch.int32, device=runtime.DEVICE)
    grid = (triton.cdiv(N, block) if programs is None else programs,)
    program_ids_kernel[grid](out, N, BLOCK=block)
    return out


@triton.jit
def masked_load_kernel(X, OUT, N, other, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    x = tl.load(X + offs, mask=offs < N, other=other)
    tl.store(OUT + offs, x)  # the whole block: OUT has BLOCK elements


def masked_load(x: torch.Tensor, block: int, other: float) -> torch.Tensor:
    """One program loads a block of ``block`` elements from x (fewer than that) and stores all of it."""
    out = torch.empty(block, dtype=x.dtype, device=x.device)
    masked_load_kernel[(1,)](x, out, x.numel(), other, BLOCK=block)
    return out


@triton.jit
def row_sums_kernel(X, OUT, M, N, stride_xm, stride_xn, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_N)
    mask = (rows[:, None] < M) & (cols[None, :] < N)
    x = tl.load(X + rows[:, None] * stride_xm + cols[None, :] * stride_xn, mask=mask, other=0.0)
    tl.store(OUT + rows, tl.sum(x, axis=1), mask=rows < M)


def row_sums(x: torch.Tensor, block_m: int = 16) -> torch.Tensor:
    """Sum of each row of a 2-D tensor, any strides (a whole row fits one block)."""
    M, N = x.shape
    out = torch.empty(M, dtype=torch.float32, device=x.device)
    row_sums_kernel[(triton.cdiv(M, block_m),)](x, out, M, N, x.stride(0), x.stride(1),
                                                BLOCK_M=block_m, BLOCK_N=triton.next_power_of_2(N))
    return out


@triton.jit
def dot_tile_kernel(A, B, C, M: tl.constexpr, N: tl.constexpr, K: tl.constexpr, PRECISION: tl.constexpr):
    offs_m, offs_n, offs_k = tl.arange(0, M), tl.arange(0, N), tl.arange(0, K)
    a = tl.load(A + offs_m[:, None] * K + offs_k[None, :])
    b = tl.load(B + offs_k[:, None] * N + offs_n[None, :])
    c = tl.dot(a, b, input_precision=PRECISION)  # (M, K) @ (K, N) -> (M, N), float32
    tl.store(C + offs_m[:, None] * N + offs_n[None, :], c)


def dot_tile(a: torch.Tensor, b: torch.Tensor, precision: str = "ieee") -> torch.Tensor:
    """One program, one tl.dot: contiguous a (M, K) and b (K, N), powers of two of at least 16."""
    (M, K), (K2, N) = a.shape, b.shape
    if K != K2 or not all(n >= 16 and n & (n - 1) == 0 for n in (M, N, K)):
        raise ValueError(f"dot_tile takes (M, K) @ (K, N) with M, N, K powers of two >= 16, got "
                         f"{tuple(a.shape)} @ {tuple(b.shape)}")
    c = torch.empty(M, N, dtype=torch.float32, device=a.device)
    dot_tile_kernel[(1,)](a.contiguous(), b.contiguous(), c, M=M, N=N, K=K, PRECISION=precision)
    return c


@triton.jit
def racy_count_kernel(COUNT, N, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    n = tl.sum((offs < N).to(tl.int32), axis=0)  # how many of this block's elements are < N
    tl.store(COUNT, tl.load(COUNT) + n)  # read, add, write: another program may write in between


@triton.jit
def atomic_count_kernel(COUNT, N, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    n = tl.sum((offs < N).to(tl.int32), axis=0)
    tl.atomic_add(COUNT, n)  # the read-add-write happens as one indivisible step in memory


def count(N: int, block: int = 128, *, atomic: bool) -> int:
    """Count 0..N-1 with cdiv(N, block) programs that each add their share into one integer."""
    total = torch.zeros(1, dtype=torch.int32, device=runtime.DEVICE)
    kernel = atomic_count_kernel if atomic else racy_count_kernel
    kernel[(triton.cdiv(N, block),)](total, N, BLOCK=block)
    return int(total.item())
