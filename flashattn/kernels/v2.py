"""FlashAttention v2 (taught in notebook 05, its K layouts in 06): the loops inverted, the state in registers.

One program per (Q block, batch·head). It loads its Q block once, then walks over all K/V blocks
keeping ``acc`` (the unnormalized output), ``mi`` (running max) and ``li`` (running sum) in
registers, and divides by ``li`` once at the end (deferred normalization). The update is the
FlashAttention-2 one: scores are exponentiated against the new running max directly, so only the
old state needs rescaling (by ``alpha``) and the second product accumulates in place.

Variants built on this one kernel:

* ``v2``          K read as (BLOCK_N, D) tiles, scores by ``tl.dot(qi, tl.trans(kj))``
* ``v2_kt``       K transposed and made contiguous on the host, (D, BLOCK_N) tiles, ``tl.dot(qi, kj)``
* ``v2_kt_view``  the same (D, BLOCK_N) tiles read through K's transposed strides, no copy
* ``v2_padded``   head dimension padded to D_PAD (the source's compute_padded_headdim)
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from flashattn import runtime
from flashattn.validate import TILE_KEYS, check_kernel_inputs, resolve_options

from . import device
from .constants import LN_2
from .fast_options import forward_shared_bytes


@triton.jit
def attn_kernel_v2(
    Q, K, V, O,
    stride_qb, stride_qh, stride_qn, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_ob, stride_oh, stride_on, stride_od,
    H, N, scale,
    D: tl.constexpr,             # true head dimension
    D_PAD: tl.constexpr,         # head dimension of the tiles (D_PAD >= D, zero-filled)
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr, PRECISION: tl.constexpr,
    K_TRANSPOSED: tl.constexpr,  # load K as (D_PAD, BLOCK_N) tiles instead of (BLOCK_N, D_PAD)
    DEFERRED_NORM: tl.constexpr, # divide by li once at the end (True) or at every step (v1 style)
    USE_EXP2: tl.constexpr,      # exp2 with log2(e) folded into the scale
    LSE=None,                    # (B·H·N,) float32: each row's log-sum-exp, stored when STORE_LSE
    STORE_LSE: tl.constexpr = False,  # for the backward pass (notebook 12), which recomputes P from it
):
    pid_m, pid_bh = tl.program_id(0), tl.program_id(1)
    off_b, off_h = (pid_bh // H).to(tl.int64), (pid_bh % H).to(tl.int64)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, D_PAD)
    d_ok = offs_d < D
    k_base = K + off_b * stride_kb + off_h * stride_kh
    v_base = V + off_b * stride_vb + off_h * stride_vh

    # load the query block once
    q_ptrs = Q + off_b * stride_qb + off_h * stride_qh + offs_m[:, None] * stride_qn + offs_d[None, :] * stride_qd
    qi = tl.load(q_ptrs, mask=(offs_m[:, None] < N) & d_ok[None, :], other=0.0)

    # running state, in registers
    mi = tl.full([BLOCK_M], float("-inf"), tl.float32)
    li = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D_PAD], tl.float32)
    if USE_EXP2:
        scale = scale * 1.4426950408889634  # exp(x) = exp2(x · log2 e)

    # causal: keys after the last query of this block are never needed
    hi = tl.minimum(N, (pid_m + 1) * BLOCK_M) if CAUSAL else N
    for start_n in range(0, hi, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        if K_TRANSPOSED:
            kj = tl.load(k_base + offs_d[:, None] * stride_kd + offs_n[None, :] * stride_kn,
                         mask=d_ok[:, None] & (offs_n[None, :] < N), other=0.0)
            sij = tl.dot(qi, kj, input_precision=PRECISION) * scale
        else:
            kj = tl.load(k_base + offs_n[:, None] * stride_kn + offs_d[None, :] * stride_kd,
                         mask=(offs_n[:, None] < N) & d_ok[None, :], other=0.0)
            sij = tl.dot(qi, tl.trans(kj), input_precision=PRECISION) * scale
        keep = offs_n[None, :] < N
        if CAUSAL:
            keep = keep & (offs_n[None, :] <= offs_m[:, None])
        sij = tl.where(keep, sij, float("-inf"))

        # online softmax, FlashAttention-2 form: one exponential per score, and the old state
        # rescaled by alpha = exp(mi - mi_new) (the first block has a valid key in every row,
        # so mi_new is finite from there on)
        mi_new = tl.maximum(mi, tl.max(sij, 1))
        if USE_EXP2:
            pij = tl.exp2(sij - mi_new[:, None])
            alpha = tl.exp2(mi - mi_new)
        else:
            pij = tl.exp(sij - mi_new[:, None])
            alpha = tl.exp(mi - mi_new)
        li_new = alpha * li + tl.sum(pij, 1)

        vj = tl.load(v_base + offs_n[:, None] * stride_vn + offs_d[None, :] * stride_vd,
                     mask=(offs_n[:, None] < N) & d_ok[None, :], other=0.0)
        if DEFERRED_NORM:
            acc = tl.dot(pij.to(vj.dtype), vj, acc * alpha[:, None], input_precision=PRECISION)
        else:  # v1 style: keep acc normalized, a division per element at every step
            pv = tl.dot(pij.to(vj.dtype), vj, input_precision=PRECISION)
            acc = (acc * (alpha * li)[:, None] + pv) / li_new[:, None]
        mi, li = mi_new, li_new

    if DEFERRED_NORM:
        acc = acc / li[:, None]
    if STORE_LSE:  # log-sum-exp of the scaled scores in natural log: mi + log(li), mi in base 2 with exp2
        lse = (mi + tl.log2(li)) * LN_2 if USE_EXP2 else mi + tl.log(li)
        tl.store(LSE + pid_bh.to(tl.int64) * N + offs_m, lse, mask=offs_m < N)
    o_ptrs = O + off_b * stride_ob + off_h * stride_oh + offs_m[:, None] * stride_on + offs_d[None, :] * stride_od
    tl.store(o_ptrs, acc.to(O.dtype.element_ty), mask=(offs_m[:, None] < N) & d_ok[None, :])


def compute_padded_headdim(D: int) -> int:
    """The source's rule: a power of two is doubled, anything else rounded up to a power of two."""
    if D <= 0:
        return 1
    if D & (D - 1) == 0:
        return D * 2
    return 1 << (D - 1).bit_length()


FALLBACK_TILES = [(64, 64, 4, 2), (64, 32, 4, 1), (32, 32, 4, 1), (16, 16, 4, 1)]  # GPUs with less shared memory


def _tiles(preferred: tuple, D: int, dtype: torch.dtype, variant: str) -> dict:
    """``preferred`` (the tiles measured on the H200) if they fit the live GPU's shared memory, else the first of
    :data:`FALLBACK_TILES` that does."""
    tiles = device.first_fitting([preferred, *FALLBACK_TILES], lambda c: forward_shared_bytes(c, D, dtype),
                                 what=f"{variant} (D={D}, {dtype})")
    return dict(zip(TILE_KEYS, tiles, strict=True))


def default_options(dtype: torch.dtype, D: int, mode: str | None = None) -> dict:
    """Tile sizes and options of v2, v2_kt and v2_kt_view; ``mode`` defaults to the current one."""
    if (mode or runtime.MODE) == "interpreter":
        tiles = dict(block_m=64, block_n=64, num_warps=4, num_stages=1)  # few programs run faster
    elif dtype == torch.float32:
        # CUDA-core dot: at D >= 64, 4 warps run out of registers (measured on an H200: heavy spills)
        tiles = _tiles((64, 64, 4 if D <= 32 else 8, 2), D, dtype, "v2")
    else:
        tiles = _tiles((128, 64, 4 if D <= 64 else 8, 3), D, dtype, "v2")
    return dict(tiles, input_precision="ieee", deferred_norm=True, use_exp2=False)


def padded_default_options(dtype: torch.dtype, D: int, mode: str | None = None) -> dict:
    opts = default_options(dtype, D, mode)
    if (mode or runtime.MODE) == "gpu":  # tiles twice as wide: smaller blocks keep shared memory in bounds
        d_pad = compute_padded_headdim(D)
        opts.update(_tiles((64, 64 if d_pad <= 128 else 32, 8 if dtype == torch.float32 else opts["num_warps"], 2),
                           d_pad, dtype, "v2_padded"))
    return opts


def _launch(q, k_tiles, k_strides, v, *, causal, scale, D, d_pad, k_transposed, opts, return_lse=False):
    B, H, N, _ = q.shape
    o = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    lse = torch.empty((B, H, N), dtype=torch.float32, device=q.device) if return_lse else None
    grid = (triton.cdiv(N, opts["block_m"]), B * H)
    attn_kernel_v2[grid](
        q, k_tiles, v, o, *q.stride(), *k_strides, *v.stride(), *o.stride(), H, N, scale,
        D=D, D_PAD=d_pad, BLOCK_M=opts["block_m"], BLOCK_N=opts["block_n"], CAUSAL=causal,
        PRECISION=opts["input_precision"], K_TRANSPOSED=k_transposed,
        DEFERRED_NORM=opts["deferred_norm"], USE_EXP2=opts["use_exp2"], LSE=lse, STORE_LSE=return_lse,
        num_warps=opts["num_warps"], num_stages=opts["num_stages"],
    )
    return (o, lse) if return_lse else o


def attention_v2(q, k, v, *, causal=False, scale=None, return_lse=False, **options):
    """FlashAttention v2; K read row-major, ``tl.trans`` in the kernel.

    Extra options: ``deferred_norm`` (default True) and ``use_exp2`` (default False). ``return_lse=True``
    also returns the (B, H, N) float32 log-sum-exp of the scaled scores (natural log), which the backward
    pass (``flashattn.kernels.backward``) recomputes P from.
    """
    B, H, N, D, scale = check_kernel_inputs(q, k, v, variant="v2", causal=causal, scale=scale)
    if not isinstance(return_lse, bool):
        raise TypeError(f"v2: return_lse must be True or False, got {return_lse!r}")
    opts = resolve_options("v2", options, default_options(q.dtype, D), q.dtype)
    return _launch(q, k, k.stride(), v, causal=causal, scale=scale, D=D, d_pad=D,
                   k_transposed=False, opts=opts, return_lse=return_lse)


def _k_logical_strides(kt: torch.Tensor) -> tuple[int, int, int, int]:
    """Strides of a (B, H, D, N) tensor given in K's (b, h, n, d) order."""
    sb, sh, sd, sn = kt.stride()
    return sb, sh, sn, sd


def attention_v2_kt(q, k, v, *, causal=False, scale=None, **options):
    """v2 with K transposed to (B, H, D, N) and made contiguous on the host (an extra copy of K)."""
    B, H, N, D, scale = check_kernel_inputs(q, k, v, variant="v2_kt", causal=causal, scale=scale)
    opts = resolve_options("v2_kt", options, default_options(q.dtype, D), q.dtype)
    kt = k.transpose(-1, -2).contiguous()
    return _launch(q, kt, _k_logical_strides(kt), v, causal=causal, scale=scale,
                   D=D, d_pad=D, k_transposed=True, opts=opts)


def attention_v2_kt_view(q, k, v, *, causal=False, scale=None, **options):
    """v2 loading (D, BLOCK_N) tiles of K through transposed strides: no copy, same bytes as v2."""
    B, H, N, D, scale = check_kernel_inputs(q, k, v, variant="v2_kt_view", causal=causal, scale=scale)
    opts = resolve_options("v2_kt_view", options, default_options(q.dtype, D), q.dtype)
    kt = k.transpose(-1, -2)  # a view: no data moves
    return _launch(q, kt, _k_logical_strides(kt), v, causal=causal, scale=scale, D=D, d_pad=D,
                   k_transposed=True, opts=opts)


PADDED_MAX_D = 128


def attention_v2_padded(q, k, v, *, causal=False, scale=None, **options):
    """v2 with tiles D_PAD = compute_padded_headdim(D) wide, zero-filled past D (no host copy).

    Also the variant for head dimensions that are not powers of two (e.g. 40, 48, 80, 96).
    """
    head_dims = range(1, PADDED_MAX_D + 1)
    B, H, N, D, scale = check_kernel_inputs(q, k, v, variant="v2_padded", causal=causal,
                                            scale=scale, head_dims=head_dims)
    opts = resolve_options("v2_padded", options, padded_default_options(q.dtype, D), q.dtype)
    d_pad = max(16, compute_padded_headdim(D))  # tl.dot needs at least 16
    return _launch(q, k, k.stride(), v, causal=causal, scale=scale, D=D,
                   d_pad=d_pad, k_transposed=False, opts=opts)
