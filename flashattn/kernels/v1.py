"""FlashAttention v1 loop order (taught in notebook 04): outer loop over K/V blocks, inner loop over Q blocks.

One program per (batch, head). For every K/V block j, every Q block i re-reads its partial output
O_i and its running max m_i and sum l_i from HBM, updates them, and writes them back: HBM is used
as the place where the running state lives. The output is normalized (divided by l) at every step.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from flashattn import runtime
from flashattn.validate import TILE_KEYS, check_kernel_inputs, resolve_options

from . import device


@triton.jit
def v1_update(qi, kj, vj, oi, li, mi, keep, scale, PRECISION: tl.constexpr):
    """The inner loop's step: Q block i's normalized output ``oi``, sum ``li`` and max ``mi`` after K/V block j.
    Returns ``(oi_new, li_new, mi_new)``."""
    sij = tl.dot(qi, tl.trans(kj), input_precision=PRECISION) * scale
    sij = tl.where(keep, sij, float("-inf"))

    mij = tl.max(sij, 1)
    # A row can be fully masked inside a diagonal block (mij = -inf); exp(-inf - -inf)
    # would be NaN, so such rows take their exponent offset from 0 (their pij are all 0).
    pij = tl.exp(sij - tl.where(mij == float("-inf"), 0.0, mij)[:, None])
    lij = tl.sum(pij, 1)

    mi_new = tl.maximum(mi, mij)
    alpha = tl.exp(mi - mi_new)
    beta = tl.exp(mij - mi_new)
    li_new = alpha * li + beta * lij
    pv = tl.dot(pij.to(vj.dtype), vj, input_precision=PRECISION)
    oi_new = (alpha[:, None] * li[:, None] * oi + beta[:, None] * pv) / li_new[:, None]
    return oi_new, li_new, mi_new


@triton.jit
def attn_kernel_v1(
    Q, K, V, O, L, M,
    stride_qb, stride_qh, stride_qn, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_ob, stride_oh, stride_on, stride_od,
    H, N, scale,
    D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr, PRECISION: tl.constexpr,
    UPDATE: tl.constexpr = v1_update,  # notebook 04's exercise passes its own
):
    pid_bh = tl.program_id(0)
    off_b, off_h = (pid_bh // H).to(tl.int64), (pid_bh % H).to(tl.int64)
    q_base = Q + off_b * stride_qb + off_h * stride_qh
    k_base = K + off_b * stride_kb + off_h * stride_kh
    v_base = V + off_b * stride_vb + off_h * stride_vh
    o_base = O + off_b * stride_ob + off_h * stride_oh
    lm_base = pid_bh.to(tl.int64) * N  # L and M are contiguous (B·H, N) float32
    offs_d = tl.arange(0, D)

    for start_n in range(0, N, BLOCK_N):  # outer loop: K/V blocks
        offs_n = start_n + tl.arange(0, BLOCK_N)
        kj = tl.load(k_base + offs_n[:, None] * stride_kn + offs_d[None, :] * stride_kd,
                     mask=offs_n[:, None] < N, other=0.0)
        vj = tl.load(v_base + offs_n[:, None] * stride_vn + offs_d[None, :] * stride_vd,
                     mask=offs_n[:, None] < N, other=0.0)
        # causal: Q blocks that end before this K block starts see none of it
        lo = (start_n // BLOCK_M) * BLOCK_M if CAUSAL else 0
        for start_m in range(lo, N, BLOCK_M):  # inner loop: Q blocks
            offs_m = start_m + tl.arange(0, BLOCK_M)
            row_ok = offs_m < N
            qi = tl.load(q_base + offs_m[:, None] * stride_qn + offs_d[None, :] * stride_qd,
                         mask=row_ok[:, None], other=0.0)
            o_ptrs = o_base + offs_m[:, None] * stride_on + offs_d[None, :] * stride_od
            oi = tl.load(o_ptrs, mask=row_ok[:, None], other=0.0).to(tl.float32)
            li = tl.load(L + lm_base + offs_m, mask=row_ok, other=0.0)
            mi = tl.load(M + lm_base + offs_m, mask=row_ok, other=float("-inf"))

            keep = offs_n[None, :] < N  # False where a score is hidden: keys past N, and future keys if causal
            if CAUSAL:
                keep = keep & (offs_n[None, :] <= offs_m[:, None])
            oi, li_new, mi_new = UPDATE(qi, kj, vj, oi, li, mi, keep, scale, PRECISION)

            tl.store(o_ptrs, oi.to(O.dtype.element_ty), mask=row_ok[:, None])
            tl.store(L + lm_base + offs_m, li_new, mask=row_ok)
            tl.store(M + lm_base + offs_m, mi_new, mask=row_ok)
            # The next K/V block re-reads these rows, possibly from other threads of this program.
            tl.debug_barrier()


def default_options(dtype: torch.dtype, D: int, mode: str | None = None) -> dict:
    """64×64 tiles on a GPU and in the interpreter (where fewer, larger programs run faster).

    ``mode`` ("gpu" or "interpreter") defaults to the current one.
    """
    # float32 on CUDA cores needs 8 warps to keep its tiles in registers (4 spill, measured on an H200)
    warps = 8 if dtype == torch.float32 and (mode or runtime.MODE) == "gpu" else 4
    tiles = (64, 64, warps, 1)
    if (mode or runtime.MODE) == "gpu":  # smaller tiles where the GPU has less shared memory (a T4 at D = 128)
        tiles = device.first_fitting([tiles, (32, 32, 4, 1), (16, 16, 4, 1)], lambda c: _shared_bytes(c, D, dtype),
                                     what=f"v1 (D={D}, {dtype})")
    return dict(zip(TILE_KEYS, tiles, strict=True), input_precision="ieee")


def _shared_bytes(tiles: tuple, D: int, dtype: torch.dtype) -> int:
    """v1 keeps its K and V blocks and streams the Q and O blocks past them."""
    bm, bn, _, stages = tiles
    return device.tile_shared_bytes(element=dtype.itemsize, d=D, kept_rows=2 * bn, streamed_rows=2 * bm, stages=stages,
                                    dots=[(bm, bn, D), (bm, D, bn)], p_elements=bm * bn, mma=dtype != torch.float32)


def attention_v1(q, k, v, *, causal=False, scale=None, **options):
    """FlashAttention-1 loop order; O, l and m live in HBM and are re-read for every K/V block."""
    B, H, N, D, scale = check_kernel_inputs(q, k, v, variant="v1", causal=causal, scale=scale)
    opts = resolve_options("v1", options, default_options(q.dtype, D), q.dtype)
    # The running state starts in HBM as O = 0, l = 0, m = -inf (set by PyTorch before the kernel).
    o = torch.zeros((B, H, N, D), dtype=q.dtype, device=q.device)
    l = torch.zeros((B * H, N), dtype=torch.float32, device=q.device)
    m = torch.full((B * H, N), float("-inf"), dtype=torch.float32, device=q.device)
    attn_kernel_v1[(B * H,)](
        q, k, v, o, l, m, *q.stride(), *k.stride(), *v.stride(), *o.stride(), H, N, scale,
        D=D, BLOCK_M=opts["block_m"], BLOCK_N=opts["block_n"], CAUSAL=causal,
        PRECISION=opts["input_precision"], num_warps=opts["num_warps"], num_stages=opts["num_stages"],
    )
    return o
