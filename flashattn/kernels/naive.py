"""Naive attention in Triton (taught in notebook 02): three kernels, with S and P written to HBM in between.

    S = scale · Q·Kᵀ          scores_kernel    writes S  (B·H·N² float32 values)
    P = softmax(S, rows)      softmax_kernel   reads S three times, writes P (B·H·N² values)
    O = P·V                   pv_kernel        reads P, writes O

Each kernel is simple; the trouble is the two N×N intermediates that travel through HBM.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from flashattn.validate import check_kernel_inputs, resolve_options


@triton.jit
def scores_kernel(
    Q, K, S,
    stride_qb, stride_qh, stride_qn, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    H, N, scale,
    D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr, PRECISION: tl.constexpr,
):
    pid_m, pid_n, pid_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    off_b, off_h = (pid_bh // H).to(tl.int64), (pid_bh % H).to(tl.int64)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, D)

    q_ptrs = Q + off_b * stride_qb + off_h * stride_qh + offs_m[:, None] * stride_qn + offs_d[None, :] * stride_qd
    k_ptrs = K + off_b * stride_kb + off_h * stride_kh + offs_n[:, None] * stride_kn + offs_d[None, :] * stride_kd
    qi = tl.load(q_ptrs, mask=offs_m[:, None] < N, other=0.0)
    kj = tl.load(k_ptrs, mask=offs_n[:, None] < N, other=0.0)

    sij = tl.dot(qi, tl.trans(kj), input_precision=PRECISION) * scale
    if CAUSAL:
        sij = tl.where(offs_n[None, :] <= offs_m[:, None], sij, float("-inf"))

    s_ptrs = S + pid_bh.to(tl.int64) * N * N + offs_m[:, None] * N + offs_n[None, :]
    tl.store(s_ptrs, sij, mask=(offs_m[:, None] < N) & (offs_n[None, :] < N))


@triton.jit
def softmax_kernel(S, P, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Safe softmax of BLOCK_M rows of S: one pass for the max, one for the sum, one to write P."""
    pid_m, pid_bh = tl.program_id(0), tl.program_id(1)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    base = pid_bh.to(tl.int64) * N * N + rows[:, None] * N

    mi = tl.full([BLOCK_M], float("-inf"), tl.float32)
    for start in range(0, N, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        mask = (rows[:, None] < N) & (cols[None, :] < N)
        sij = tl.load(S + base + cols[None, :], mask=mask, other=float("-inf"))
        mi = tl.maximum(mi, tl.max(sij, 1))
    mi = tl.where(rows < N, mi, 0.0)  # rows past N are never stored; keep them finite

    li = tl.zeros([BLOCK_M], tl.float32)
    for start in range(0, N, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        mask = (rows[:, None] < N) & (cols[None, :] < N)
        sij = tl.load(S + base + cols[None, :], mask=mask, other=float("-inf"))
        li += tl.sum(tl.exp(sij - mi[:, None]), 1)
    li = tl.where(rows < N, li, 1.0)

    for start in range(0, N, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        mask = (rows[:, None] < N) & (cols[None, :] < N)
        sij = tl.load(S + base + cols[None, :], mask=mask, other=float("-inf"))
        pij = tl.exp(sij - mi[:, None]) / li[:, None]
        tl.store(P + base + cols[None, :], pij.to(P.dtype.element_ty), mask=mask)


@triton.jit
def pv_kernel(
    P, V, O,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_ob, stride_oh, stride_on, stride_od,
    H, N,
    D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, PRECISION: tl.constexpr,
):
    pid_m, pid_bh = tl.program_id(0), tl.program_id(1)
    off_b, off_h = (pid_bh // H).to(tl.int64), (pid_bh % H).to(tl.int64)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, D)
    p_base = P + pid_bh.to(tl.int64) * N * N + rows[:, None] * N
    v_base = V + off_b * stride_vb + off_h * stride_vh + offs_d[None, :] * stride_vd

    acc = tl.zeros([BLOCK_M, D], tl.float32)
    for start in range(0, N, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        pij = tl.load(p_base + cols[None, :], mask=(rows[:, None] < N) & (cols[None, :] < N), other=0.0)
        vj = tl.load(v_base + cols[:, None] * stride_vn, mask=cols[:, None] < N, other=0.0)
        acc = tl.dot(pij, vj, acc, input_precision=PRECISION)

    o_ptrs = O + off_b * stride_ob + off_h * stride_oh + rows[:, None] * stride_on + offs_d[None, :] * stride_od
    tl.store(o_ptrs, acc.to(O.dtype.element_ty), mask=rows[:, None] < N)


def default_options(dtype: torch.dtype, D: int, mode: str | None = None) -> dict:
    """64×64 tiles on a GPU and in the interpreter (where fewer, larger programs run faster)."""
    return dict(block_m=64, block_n=64, num_warps=4, num_stages=2, input_precision="ieee")


def naive_attention(q, k, v, *, causal=False, scale=None, return_intermediates=False, **options):
    """Attention as three Triton kernels with S (float32) and P (q.dtype) stored in HBM.

    With ``return_intermediates=True`` returns ``(o, S, P)`` so the N×N buffers can be inspected.
    """
    B, H, N, D, scale = check_kernel_inputs(q, k, v, variant="naive", causal=causal, scale=scale)
    opts = resolve_options("naive", options, default_options(q.dtype, D), q.dtype)
    bm, bn, prec = opts["block_m"], opts["block_n"], opts["input_precision"]
    launch = dict(num_warps=opts["num_warps"], num_stages=opts["num_stages"])

    S = torch.empty((B, H, N, N), dtype=torch.float32, device=q.device)
    P = torch.empty((B, H, N, N), dtype=q.dtype, device=q.device)
    o = torch.empty((B, H, N, D), dtype=q.dtype, device=q.device)

    scores_kernel[(triton.cdiv(N, bm), triton.cdiv(N, bn), B * H)](
        q, k, S, *q.stride(), *k.stride(), H, N, scale,
        D=D, BLOCK_M=bm, BLOCK_N=bn, CAUSAL=causal, PRECISION=prec, **launch,
    )
    softmax_kernel[(triton.cdiv(N, bm), B * H)](S, P, N, BLOCK_M=bm, BLOCK_N=bn, **launch)
    pv_kernel[(triton.cdiv(N, bm), B * H)](
        P, v, o, *v.stride(), *o.stride(), H, N,
        D=D, BLOCK_M=bm, BLOCK_N=bn, PRECISION=prec, **launch,
    )
    return (o, S, P) if return_intermediates else o
