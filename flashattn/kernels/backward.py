"""The backward pass of FlashAttention-2, the teaching version (notebook 12).

Dao (2023), Algorithm 2, in three kernels. The forward pass saved its output O and, for every query
row, the log-sum-exp of its scaled scores, ``lse_i = mi + log(li)`` (the forward's running max and sum at
the end). Given the gradient dO of the output:

* ``bwd_preprocess_kernel``: ``delta_i = rowsum(doi ∘ oi)``, one number per query row;
* ``bwd_dkdv_kernel``: one program per K/V block ``j``; it keeps ``kj``, ``vj`` and the accumulators
  ``dkj``, ``dvj`` on chip and walks over the Q blocks ``i``::

      sij  = qi · kjᵀ · scale
      pij  = exp(sij − lse_i)             # P recomputed, never stored: no N×N matrix anywhere
      dvj += pijᵀ · doi
      dpij = doi · vjᵀ
      dsij = pij ∘ (dpij − delta_i)
      dkj += dsijᵀ · qi · scale

* ``bwd_dq_kernel``: one program per Q block ``i``, walking over the K/V blocks with the same ``sij``,
  ``pij``, ``dpij``, ``dsij`` and ``dqi += dsij · kj · scale``.

Why dQ gets its own kernel, and no atomics: ``dqi`` sums over *all* K/V blocks, and in the dK/dV kernel
each K/V block is a different program. Adding into dQ from there needs atomic adds into a float32
buffer (FlashAttention-2's CUDA code does that): the sum's order then changes from run to run (so do
the last bits of dQ), and the buffer costs memory and a conversion pass. A second kernel in which each
program owns its rows of dQ recomputes ``sij`` and ``dpij`` (7 matrix products instead of 5), but it is
deterministic and reads like the forward pass. ``fast_backward.py`` measures the other choice.

Inputs are made contiguous on the host, so every (B, H, N, D) tensor has the same strides and a
(batch, head) starts at ``pid_bh · N · D``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from flashattn import runtime
from flashattn.validate import check_kernel_inputs, check_o_lse_do, resolve_options

from . import device
from .fast_options import backward_shared_bytes


@triton.jit
def bwd_preprocess_kernel(O, DO, DELTA, N, D: tl.constexpr, BLOCK_M: tl.constexpr):
    """``delta_i = rowsum(doi ∘ oi)`` for one block of query rows."""
    pid_m, pid_bh = tl.program_id(0), tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, D)
    ptrs = pid_bh.to(tl.int64) * N * D + offs_m[:, None] * D + offs_d[None, :]
    row_ok = offs_m < N
    oi = tl.load(O + ptrs, mask=row_ok[:, None], other=0.0).to(tl.float32)
    doi = tl.load(DO + ptrs, mask=row_ok[:, None], other=0.0).to(tl.float32)
    delta_i = tl.sum(doi * oi, axis=1)
    tl.store(DELTA + pid_bh.to(tl.int64) * N + offs_m, delta_i, mask=row_ok)


@triton.jit
def load_q_block(Q, DO, LSE, DELTA, q_ptrs, rows, offs_m, row_ok):
    """Q block i's tiles ``qi``, ``doi`` and its rows' ``lse_i``, ``delta_i`` (rows past N read as 0)."""
    qi = tl.load(Q + q_ptrs, mask=row_ok[:, None], other=0.0)
    doi = tl.load(DO + q_ptrs, mask=row_ok[:, None], other=0.0)
    lse_i = tl.load(LSE + rows + offs_m, mask=row_ok, other=0.0)
    delta_i = tl.load(DELTA + rows + offs_m, mask=row_ok, other=0.0)
    return qi, doi, lse_i, delta_i


@triton.jit
def bwd_dkdv_kernel(
    Q, K, V, DO, LSE, DELTA, DK, DV, N, scale,
    D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr, PRECISION: tl.constexpr,
):
    """dK and dV of one K/V block: ``kj``, ``vj``, ``dkj``, ``dvj`` stay on chip; Q blocks stream past."""
    pid_n, pid_bh = tl.program_id(0), tl.program_id(1)
    head = pid_bh.to(tl.int64) * N * D  # this (batch, head)'s first element
    rows = pid_bh.to(tl.int64) * N      # and its first row of lse and delta
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, D)
    kv_ptrs = head + offs_n[:, None] * D + offs_d[None, :]
    kv_ok = offs_n[:, None] < N
    kj = tl.load(K + kv_ptrs, mask=kv_ok, other=0.0)
    vj = tl.load(V + kv_ptrs, mask=kv_ok, other=0.0)
    dkj = tl.zeros([BLOCK_N, D], tl.float32)
    dvj = tl.zeros([BLOCK_N, D], tl.float32)

    # causal: the queries before this block's first key see none of its keys
    lo = (pid_n * BLOCK_N // BLOCK_M) * BLOCK_M if CAUSAL else 0
    for start_m in range(lo, N, BLOCK_M):
        offs_m = start_m + tl.arange(0, BLOCK_M)
        q_ptrs = head + offs_m[:, None] * D + offs_d[None, :]
        row_ok = offs_m < N
        qi, doi, lse_i, delta_i = load_q_block(Q, DO, LSE, DELTA, q_ptrs, rows, offs_m, row_ok)

        # recompute this tile of P from the saved log-sum-exp
        sij = tl.dot(qi, tl.trans(kj), input_precision=PRECISION) * scale
        keep = row_ok[:, None] & (offs_n[None, :] < N)
        if CAUSAL:
            keep = keep & (offs_n[None, :] <= offs_m[:, None])
        pij = tl.where(keep, tl.exp(sij - lse_i[:, None]), 0.0)

        dvj = tl.dot(tl.trans(pij.to(doi.dtype)), doi, dvj, input_precision=PRECISION)    # dV += Pᵀ·dO
        dpij = tl.dot(doi, tl.trans(vj), input_precision=PRECISION)                        # dP = dO·Vᵀ
        dsij = pij * (dpij - delta_i[:, None])                                              # dS = P∘(dP − delta)
        dkj = tl.dot(tl.trans(dsij.to(qi.dtype)), qi, dkj, input_precision=PRECISION)     # dK += dSᵀ·Q

    dkj = dkj * scale  # S = scale·Q·Kᵀ: the scale once, at the end
    tl.store(DK + kv_ptrs, dkj.to(DK.dtype.element_ty), mask=kv_ok)
    tl.store(DV + kv_ptrs, dvj.to(DV.dtype.element_ty), mask=kv_ok)


@triton.jit
def bwd_dq_kernel(
    Q, K, V, DO, LSE, DELTA, DQ, N, scale,
    D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr, PRECISION: tl.constexpr,
):
    """dQ of one Q block: ``qi``, ``doi``, ``lse_i``, ``delta_i`` and ``dqi`` stay on chip; K/V blocks stream past."""
    pid_m, pid_bh = tl.program_id(0), tl.program_id(1)
    head = pid_bh.to(tl.int64) * N * D
    rows = pid_bh.to(tl.int64) * N
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, D)
    q_ptrs = head + offs_m[:, None] * D + offs_d[None, :]
    row_ok = offs_m < N
    qi, doi, lse_i, delta_i = load_q_block(Q, DO, LSE, DELTA, q_ptrs, rows, offs_m, row_ok)
    dqi = tl.zeros([BLOCK_M, D], tl.float32)

    # causal: keys after the last query of this block are never seen
    hi = tl.minimum(N, (pid_m + 1) * BLOCK_M) if CAUSAL else N
    for start_n in range(0, hi, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        kv_ptrs = head + offs_n[:, None] * D + offs_d[None, :]
        kj = tl.load(K + kv_ptrs, mask=offs_n[:, None] < N, other=0.0)
        vj = tl.load(V + kv_ptrs, mask=offs_n[:, None] < N, other=0.0)

        sij = tl.dot(qi, tl.trans(kj), input_precision=PRECISION) * scale
        keep = row_ok[:, None] & (offs_n[None, :] < N)
        if CAUSAL:
            keep = keep & (offs_n[None, :] <= offs_m[:, None])
        pij = tl.where(keep, tl.exp(sij - lse_i[:, None]), 0.0)
        dpij = tl.dot(doi, tl.trans(vj), input_precision=PRECISION)
        dsij = pij * (dpij - delta_i[:, None])
        dqi = tl.dot(dsij.to(kj.dtype), kj, dqi, input_precision=PRECISION)               # dQ += dS·K

    dqi = dqi * scale
    tl.store(DQ + q_ptrs, dqi.to(DQ.dtype.element_ty), mask=row_ok[:, None])


def default_options(dtype: torch.dtype, D: int, mode: str | None = None) -> dict:
    """Tiles of the teaching backward. Each program keeps two (BLOCK, D) float32 accumulators (dK and dV)
    or one (dQ) next to its input tiles, so larger head dimensions get smaller tiles or more warps (chosen so
    that every kernel compiles for sm_90 without spilling registers; float32 products run on the CUDA cores,
    which need the smallest tiles; float32 at D = 256 still spills a few bytes). D = 128 in half precision runs
    one stage: with two, Triton 3.6's pipelined loop at these tiles raced on the H200 (dK changed from run to
    run, well above rounding error; found by tools/diagnose_teaching_dk.py, guarded by a GPU test)."""
    if (mode or runtime.MODE) == "interpreter":
        tiles = (64, 64, 4, 1)  # few, large programs: the interpreter runs each in Python
    else:
        if dtype == torch.float32:
            tiles = {16: (32, 32, 8, 1), 32: (32, 32, 8, 1), 64: (16, 32, 4, 1), 128: (16, 32, 8, 1)}.get(D, (16, 16, 4, 1))
        else:
            tiles = {16: (64, 64, 4, 2), 32: (64, 64, 4, 2), 64: (64, 64, 8, 2), 128: (32, 64, 8, 1)}.get(D, (16, 16, 4, 1))
        # smaller tiles where the GPU has less shared memory (a T4 at D = 128); both kernels use the same tiles
        tiles = device.first_fitting([tiles, (32, 32, 4, 1), (16, 32, 4, 1), (16, 16, 4, 1)],
                                     lambda c: max(backward_shared_bytes(kernel, c, D, dtype, teaching=True) for kernel in ("dkdv", "dq")),
                                     what=f"backward (D={D}, {dtype})")
    return dict(zip(("block_m", "block_n", "num_warps", "num_stages"), tiles, strict=True), input_precision="ieee")


def check_backward_inputs(q, k, v, o, lse, do, *, variant: str, causal, scale):
    """The forward's inputs as the forward checks them, and O, lse and dO shaped to match. Returns
    (B, H, N, D, scale)."""
    B, H, N, D, scale = check_kernel_inputs(q, k, v, variant=variant, causal=causal, scale=scale)
    check_o_lse_do(q, o, lse, do, variant=variant)
    return B, H, N, D, scale


def attention_backward(q, k, v, o, lse, do, *, causal=False, scale=None, **options):
    """dQ, dK, dV of ``o = attention(q, k, v)`` given ``do``, from the forward's output ``o`` and its
    log-sum-exp ``lse`` (``attention_v2(..., return_lse=True)``). Options: block_m, block_n, num_warps,
    num_stages, input_precision (float32 only)."""
    B, H, N, D, scale = check_backward_inputs(q, k, v, o, lse, do, variant="backward", causal=causal, scale=scale)
    opts = resolve_options("backward", options, default_options(q.dtype, D), q.dtype)
    q, k, v, o, do = (t.contiguous() for t in (q, k, v, o, do))
    lse = lse.contiguous()
    dq, dk, dv = (torch.empty_like(t) for t in (q, k, v))
    delta = torch.empty((B, H, N), dtype=torch.float32, device=q.device)
    bm, bn = opts["block_m"], opts["block_n"]
    launch = dict(num_warps=opts["num_warps"], num_stages=opts["num_stages"])
    tiles = dict(D=D, BLOCK_M=bm, BLOCK_N=bn, CAUSAL=causal, PRECISION=opts["input_precision"])
    bwd_preprocess_kernel[(triton.cdiv(N, bm), B * H)](o, do, delta, N, D=D, BLOCK_M=bm, num_warps=opts["num_warps"])
    bwd_dkdv_kernel[(triton.cdiv(N, bn), B * H)](q, k, v, do, lse, delta, dk, dv, N, scale, **tiles, **launch)
    bwd_dq_kernel[(triton.cdiv(N, bm), B * H)](q, k, v, do, lse, delta, dq, N, scale, **tiles, **launch)
    return dq, dk, dv


JIT_KERNELS = (bwd_preprocess_kernel, bwd_dkdv_kernel, bwd_dq_kernel)
