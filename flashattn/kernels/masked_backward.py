"""Masked attention, the backward pass (notebook 14): ``fast_backward``'s two kernels with the forward's skipping.

The algorithm is notebook 12's (P recomputed from the log-sum-exp, ``delta = rowsum(dO ∘ O)`` by
``fast_backward.delta_rows``); what changes is which tiles each program visits, by the same block structure as
the forward (``masked.py``):

* :func:`bwd_dkdv_window` / :func:`bwd_dkdv_blocks`: one program per key block of one K/V head (dK and dV summed
  over its GROUP query heads, no atomics), walking the Q blocks that see its keys: for windows and documents
  from the key block's corners (:func:`_window_q_stages`, the forward's rule turned around), for a dense mask
  from the classification's lists by key block (``q_num_blocks`` / ``q_indices``, FlexAttention's names);
* :func:`bwd_dq_window` / :func:`bwd_dq_blocks`: one program per Q block, the forward's key blocks again.

Full tiles run without ``tl.where``; partial ones recompute the element mask (``masked._window_keep``,
``masked.mask_scores``). Rows the mask covers entirely have log-sum-exp +inf, so their P is 0 and so are their
gradients, as torch's. With ``COUNT``, each program stores its (full, partial) tile counts.
"""

from __future__ import annotations

import contextlib

import torch
import triton
import triton.language as tl

from flashattn import runtime

from . import launch_cache
from .constants import LOG2_E
from .fast import _load_rows
from .fast_options import BACKWARD_FALLBACK_SPACE, backward_shared_bytes, fitting
from .masked import (
    _window_keep,
    _window_rows,
    _window_stages,
    block_table,
    doc_bounds,
    mask_kind,
    mask_scores,
    mask_tile_bytes,
    padded_head_dim,
    precision_of,
    table_strides,
)

# Tiles (BLOCK_M, BLOCK_N, num_warps, num_stages) per padded head dimension, 16-bit inputs; the first is the
# default, the rest what tools/gpu/masks/probe.py sweeps. Taken from fast_backward's spaces (dK/dV: two float32
# accumulators of BLOCK_N × D per program; dQ: one of BLOCK_M × D). Ordered at D = 64 and 128 by the probe's
# sweep on the H200 (2026-12-02; each kernel's tiles varied with the other's default): dK/dV (32, 64, 4, 3) and,
# at D = 64, dQ (64, 64, 4, 3) first; the other head dimensions are not measured.
DKDV_TILES = {
    16: [(64, 64, 4, 3)], 32: [(64, 64, 4, 3)],
    64: [(32, 64, 4, 3), (64, 64, 4, 3), (64, 128, 8, 3)],
    128: [(32, 64, 4, 3), (64, 128, 8, 2), (64, 64, 4, 3)],
    256: [(32, 32, 8, 2), (16, 16, 4, 1)],
}
DQ_TILES = {
    16: [(64, 64, 4, 3)], 32: [(64, 64, 4, 3)],
    64: [(64, 64, 4, 3), (128, 64, 8, 3)],
    128: [(64, 64, 4, 2), (128, 64, 8, 2), (128, 128, 8, 2)],
    256: [(64, 32, 8, 2), (16, 32, 4, 1)],
}
# A dense attn_mask (the blocks kernels): the padding problem's sweep (B 4, 16 heads, N 16k, 2026-12-03, two runs)
# timed dK/dV (64, 64, 4, 3) at 0.92-0.97 of (32, 64, 4, 3)'s forward + backward, at D = 64 and 128, fp16 and bf16
# ((128, 128, 8, 2) the same at D = 64, twice as slow at 128); no dQ tile of that sweep beat the default by more
# than 2 %. tools/gpu/masks/padding_tiles.py (2026-12-04 15:33 UTC, D = 64, fp16 and bf16) tried wider ones: dQ
# (64, 128, 4, 3), 128 keys a step over the long runs of full tiles that padding leaves, took the dQ kernel 6.9 ms
# against (64, 64, 4, 3)'s 9.1 (torch.profiler), the whole step 0.90-0.92 of its time.
MASK_DKDV_TILES = {
    **DKDV_TILES,
    64: [(64, 64, 4, 3), (32, 64, 4, 3), (64, 128, 8, 3), (128, 128, 8, 2)],
    128: [(64, 64, 4, 3), (32, 64, 4, 3), (64, 128, 8, 2), (128, 128, 8, 2)],
}
MASK_DQ_TILES = {**DQ_TILES, 64: [(64, 128, 4, 3), (64, 64, 4, 3), (128, 64, 8, 3)]}
FLOAT32_TILES = [(32, 32, 8, 1), (16, 16, 4, 1)]
INTERPRETER_TILES = (32, 32, 4, 1)


def tiles_for(kernel: str, dtype: torch.dtype, D: int, mode: str | None = None,
              mask: torch.dtype | None = None) -> list[tuple[int, int, int, int]]:
    """The tile candidates of ``kernel`` ("dkdv" or "dq") for this dtype and head dimension (the first: default):
    of the window kernels (``mask`` None: windows, documents), or of the blocks kernels for a dense mask of dtype
    ``mask``."""
    if (mode or runtime.MODE) == "interpreter":
        return [INTERPRETER_TILES]
    tables = {"dkdv": DKDV_TILES, "dq": DQ_TILES} if mask is None else {"dkdv": MASK_DKDV_TILES, "dq": MASK_DQ_TILES}
    space = list(FLOAT32_TILES) if dtype == torch.float32 else list(tables[kernel][padded_head_dim(D)])
    return fitting(space, BACKWARD_FALLBACK_SPACE,
                   lambda c: backward_shared_bytes(kernel, c, D, dtype, extra=mask_tile_bytes(c, mask)),
                   f"masked backward, {kernel} kernel (D={D}, {dtype}{'' if mask is None else ', ' + str(mask) + ' mask'})")


# --- the steps -----------------------------------------------------------------------------------------------

@triton.jit
def _dkdv_step(dkj, dvj, s2T, qi, doi, vj, lse_i, delta_i, PRECISION: tl.constexpr):
    """One tile of dK and dV in transposed form (keys along the rows), from the scaled, masked scores ``s2T``."""
    pT = tl.exp2(s2T - lse_i[None, :])
    dvj = tl.dot(pT.to(doi.dtype), doi, dvj, input_precision=PRECISION)
    dpT = tl.dot(vj, tl.trans(doi), input_precision=PRECISION)
    dsT = (pT * (dpT - delta_i[None, :])).to(qi.dtype)
    return tl.dot(dsT, qi, dkj, input_precision=PRECISION), dvj


@triton.jit
def _dq_step(dqi, s2, doi, kj, vj, lse_i, delta_i, PRECISION: tl.constexpr):
    """One tile of dQ (unscaled), from the scaled, masked scores ``s2``."""
    pij = tl.exp2(s2 - lse_i[:, None])
    dpij = tl.dot(doi, tl.trans(vj), input_precision=PRECISION)
    dsij = pij * (dpij - delta_i[:, None])
    return tl.dot(dsij.to(kj.dtype), kj, dqi, input_precision=PRECISION)


@triton.jit
def _row_stats(LSE, DELTA, offs_m, n_rows, stride_dn):
    """The rows' log-sum-exp (in base 2) and delta; rows past ``n_rows`` read 0 (their pairs are masked)."""
    ok = offs_m < n_rows
    lse_i = tl.load(LSE + offs_m, mask=ok, other=0.0) * LOG2_E
    delta_i = tl.load(DELTA + offs_m.to(tl.int64) * stride_dn, mask=ok, other=0.0)
    return lse_i, delta_i


@triton.jit
def _window_q_stages(n0, L_doc, S_doc, off, left, right, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """The Q blocks that see keys of the block ``n0 .. n0 + BLOCK_N``: masked ``lo .. f_lo``, full ``f_lo .. f_hi``,
    masked ``f_hi .. hi``; the forward's :func:`masked._window_stages` with the roles of rows and keys swapped
    (query i sees key j iff j - off - right <= i <= j - off + left)."""
    n_last = tl.minimum(n0 + BLOCK_N, S_doc) - 1
    lo_row = tl.maximum(n0 - off - right, 0)
    hi = tl.minimum(n_last - off + left + 1, L_doc)
    lo = (lo_row // BLOCK_M) * BLOCK_M
    hi = tl.where(hi <= lo_row, lo, hi)
    f_lo = tl.cdiv(tl.maximum(n0 + BLOCK_N - 1 - off - right, 0), BLOCK_M) * BLOCK_M
    f_hi = (tl.maximum(tl.minimum(n0 - off + left + 1, L_doc), 0) // BLOCK_M) * BLOCK_M
    no_full = (f_hi <= f_lo) | (n0 + BLOCK_N > S_doc)
    f_lo = tl.where(no_full, lo, f_lo)
    f_hi = tl.where(no_full, lo, f_hi)
    return lo, f_lo, f_hi, hi


@triton.jit
def _dkdv_window_blocks(dkj, dvj, kj, vj, Q, DO, LSE, DELTA, lo, hi, offs_n, L_doc, S_doc, off, left, right,
                        stride_qn, stride_qd, stride_don, stride_dod, stride_dn, qk_scale,
                        BLOCK_M: tl.constexpr, D: tl.constexpr, D_PAD: tl.constexpr, MASK: tl.constexpr,
                        PRECISION: tl.constexpr):
    """Q blocks ``lo .. hi`` of one query head against this program's key block; ``MASK``: the window's."""
    for start_m in tl.range(lo, hi, BLOCK_M):
        start_m = tl.multiple_of(start_m, BLOCK_M)
        offs_m = start_m + tl.arange(0, BLOCK_M)
        qi = _load_rows(Q, 0, start_m, L_doc, stride_qn, stride_qd, BLOCK_M, D, D_PAD, False)
        doi = _load_rows(DO, 0, start_m, L_doc, stride_don, stride_dod, BLOCK_M, D, D_PAD, False)
        lse_i, delta_i = _row_stats(LSE, DELTA, offs_m, L_doc, stride_dn)
        s2T = tl.dot(kj, tl.trans(qi), input_precision=PRECISION) * qk_scale
        if MASK:  # the window's mask, keys along the rows (built that way round, not transposed)
            first, last = _window_rows(offs_m, L_doc, off, left, right)
            keepT = (offs_n[:, None] >= first[None, :]) & (offs_n[:, None] <= last[None, :])
            s2T = tl.where(keepT, s2T, float("-inf"))  # keys past S_doc: rows of dK and dV that are not stored
        dkj, dvj = _dkdv_step(dkj, dvj, s2T, qi, doi, vj, lse_i, delta_i, PRECISION)
    return dkj, dvj


@triton.jit
def _dq_window_blocks(dqi, qi, doi, lse_i, delta_i, K, V, lo, hi, offs_m, L_doc, S_doc, off, left, right,
                      stride_kn, stride_kd, stride_vn, stride_vd, qk_scale,
                      BLOCK_N: tl.constexpr, D: tl.constexpr, D_PAD: tl.constexpr, MASK: tl.constexpr,
                      PRECISION: tl.constexpr):
    """Key blocks ``lo .. hi`` against this program's Q block; ``MASK``: the window's."""
    for start_n in tl.range(lo, hi, BLOCK_N):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        kj = _load_rows(K, 0, start_n, S_doc, stride_kn, stride_kd, BLOCK_N, D, D_PAD, False)
        vj = _load_rows(V, 0, start_n, S_doc, stride_vn, stride_vd, BLOCK_N, D, D_PAD, False)
        s2 = tl.dot(qi, tl.trans(kj), input_precision=PRECISION) * qk_scale
        if MASK:
            s2 = tl.where(_window_keep(offs_m, start_n + tl.arange(0, BLOCK_N), L_doc, S_doc, off, left, right), s2,
                          float("-inf"))
        dqi = _dq_step(dqi, s2, doi, kj, vj, lse_i, delta_i, PRECISION)
    return dqi


@triton.jit
def _store_rows(X, tile, offs, n_rows, stride_n, stride_d, D: tl.constexpr, D_PAD: tl.constexpr):
    offs_d = tl.arange(0, D_PAD)
    ptrs = X + offs.to(tl.int64)[:, None] * stride_n + offs_d[None, :] * stride_d
    tl.store(ptrs, tile.to(X.dtype.element_ty), mask=(offs[:, None] < n_rows) & (offs_d[None, :] < D))


# --- windows and documents -----------------------------------------------------------------------------------

@triton.jit
def bwd_dkdv_window(
    Q, K, V, DO, DK, DV, LSE, DELTA, COUNTS, CU_Q, CU_K, TABLE,
    stride_qb, stride_qh, stride_qn, stride_qd, stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd, stride_dob, stride_doh, stride_don, stride_dod,
    stride_lb, stride_lh, stride_db, stride_dh, stride_dn,
    HKV, GROUP, NB, L, S, TN, left, right, qk_scale, scale,
    D: tl.constexpr, D_PAD: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, VARLEN: tl.constexpr,
    BOTTOM_RIGHT: tl.constexpr, PRECISION: tl.constexpr, COUNT: tl.constexpr,
):
    """dK and dV of one key block of one K/V head (DK, DV strided like K, V), over its GROUP query heads."""
    pid, hk = tl.program_id(0), tl.program_id(1)
    b, blk, q0, k0, L_doc, S_doc = doc_bounds(CU_Q, CU_K, TABLE, pid, TN, L, S, VARLEN, False)
    off = S_doc - L_doc if BOTTOM_RIGHT else 0
    b64, hk64 = b.to(tl.int64), hk.to(tl.int64)
    if VARLEN:
        b64 = b64 * 0
    n0 = blk * BLOCK_N
    offs_n = n0 + tl.arange(0, BLOCK_N)
    k_head = K + b64 * stride_kb + hk64 * stride_kh + k0 * stride_kn
    v_head = V + b64 * stride_vb + hk64 * stride_vh + k0 * stride_vn
    kj = _load_rows(k_head, 0, n0, S_doc, stride_kn, stride_kd, BLOCK_N, D, D_PAD, False)
    vj = _load_rows(v_head, 0, n0, S_doc, stride_vn, stride_vd, BLOCK_N, D, D_PAD, False)
    dkj = tl.zeros([BLOCK_N, D_PAD], tl.float32)
    dvj = tl.zeros([BLOCK_N, D_PAD], tl.float32)
    lo, f_lo, f_hi, hi = _window_q_stages(n0, L_doc, S_doc, off, left, right, BLOCK_M, BLOCK_N)
    for g in range(0, GROUP):  # a loop, not unrolled: unrolled, GQA's dK/dV kernels spill more (sm_90)
        h64 = hk64 * GROUP + g
        q_head = Q + b64 * stride_qb + h64 * stride_qh + q0 * stride_qn
        do_head = DO + b64 * stride_dob + h64 * stride_doh + q0 * stride_don
        lse_head = LSE + b64 * stride_lb + h64 * stride_lh + q0
        delta_head = DELTA + b64 * stride_db + h64 * stride_dh + q0 * stride_dn
        dkj, dvj = _dkdv_window_blocks(dkj, dvj, kj, vj, q_head, do_head, lse_head, delta_head, f_lo, f_hi, offs_n,
                                       L_doc, S_doc, off, left, right, stride_qn, stride_qd, stride_don, stride_dod,
                                       stride_dn, qk_scale, BLOCK_M, D, D_PAD, False, PRECISION)
        dkj, dvj = _dkdv_window_blocks(dkj, dvj, kj, vj, q_head, do_head, lse_head, delta_head, lo, f_lo, offs_n,
                                       L_doc, S_doc, off, left, right, stride_qn, stride_qd, stride_don, stride_dod,
                                       stride_dn, qk_scale, BLOCK_M, D, D_PAD, True, PRECISION)
        dkj, dvj = _dkdv_window_blocks(dkj, dvj, kj, vj, q_head, do_head, lse_head, delta_head, f_hi, hi, offs_n,
                                       L_doc, S_doc, off, left, right, stride_qn, stride_qd, stride_don, stride_dod,
                                       stride_dn, qk_scale, BLOCK_M, D, D_PAD, True, PRECISION)
    _store_rows(DK + b64 * stride_kb + hk64 * stride_kh + k0 * stride_kn, dkj * scale, offs_n, S_doc,
                stride_kn, stride_kd, D, D_PAD)
    _store_rows(DV + b64 * stride_vb + hk64 * stride_vh + k0 * stride_vn, dvj, offs_n, S_doc,
                stride_vn, stride_vd, D, D_PAD)
    if COUNT:  # (full, partial) tiles over the group's query heads, at [K/V head, batch or document, key block]
        slot = COUNTS + ((hk64 * NB + b) * TN + blk) * 2
        tl.store(slot, (GROUP * ((f_hi - f_lo) // BLOCK_M)).to(tl.int32), mask=n0 < S_doc)
        tl.store(slot + 1, (GROUP * ((f_lo - lo) // BLOCK_M + tl.cdiv(hi - f_hi, BLOCK_M))).to(tl.int32),
                 mask=n0 < S_doc)


@triton.jit
def bwd_dq_window(
    Q, K, V, DO, DQ, LSE, DELTA, COUNTS, CU_Q, CU_K, TABLE,
    stride_qb, stride_qh, stride_qn, stride_qd, stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd, stride_dob, stride_doh, stride_don, stride_dod,
    stride_lb, stride_lh, stride_db, stride_dh, stride_dn,
    H, GROUP, NB, L, S, TM, left, right, qk_scale, scale,
    D: tl.constexpr, D_PAD: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, VARLEN: tl.constexpr,
    BOTTOM_RIGHT: tl.constexpr, PRECISION: tl.constexpr, COUNT: tl.constexpr,
):
    """dQ of one Q block of one query head (DQ strided like Q), over the forward's key blocks."""
    pid, h = tl.program_id(0), tl.program_id(1)
    b, blk, q0, k0, L_doc, S_doc = doc_bounds(CU_Q, CU_K, TABLE, pid, TM, L, S, VARLEN, True)
    off = S_doc - L_doc if BOTTOM_RIGHT else 0
    b64, h64, hk64 = b.to(tl.int64), h.to(tl.int64), (h // GROUP).to(tl.int64)
    if VARLEN:
        b64 = b64 * 0
    m0 = blk * BLOCK_M
    offs_m = m0 + tl.arange(0, BLOCK_M)
    q_head = Q + b64 * stride_qb + h64 * stride_qh + q0 * stride_qn
    k_head = K + b64 * stride_kb + hk64 * stride_kh + k0 * stride_kn
    v_head = V + b64 * stride_vb + hk64 * stride_vh + k0 * stride_vn
    qi = _load_rows(q_head, 0, m0, L_doc, stride_qn, stride_qd, BLOCK_M, D, D_PAD, False)
    doi = _load_rows(DO + b64 * stride_dob + h64 * stride_doh + q0 * stride_don, 0, m0, L_doc, stride_don, stride_dod,
                     BLOCK_M, D, D_PAD, False)
    lse_i, delta_i = _row_stats(LSE + b64 * stride_lb + h64 * stride_lh + q0,
                                DELTA + b64 * stride_db + h64 * stride_dh + q0 * stride_dn, offs_m, L_doc, stride_dn)
    dqi = tl.zeros([BLOCK_M, D_PAD], tl.float32)
    lo, f_lo, f_hi, hi = _window_stages(m0, L_doc, S_doc, off, left, right, BLOCK_M, BLOCK_N)
    dqi = _dq_window_blocks(dqi, qi, doi, lse_i, delta_i, k_head, v_head, f_lo, f_hi, offs_m, L_doc, S_doc, off, left,
                            right, stride_kn, stride_kd, stride_vn, stride_vd, qk_scale, BLOCK_N, D, D_PAD, False,
                            PRECISION)
    dqi = _dq_window_blocks(dqi, qi, doi, lse_i, delta_i, k_head, v_head, lo, f_lo, offs_m, L_doc, S_doc, off, left,
                            right, stride_kn, stride_kd, stride_vn, stride_vd, qk_scale, BLOCK_N, D, D_PAD, True,
                            PRECISION)
    dqi = _dq_window_blocks(dqi, qi, doi, lse_i, delta_i, k_head, v_head, f_hi, hi, offs_m, L_doc, S_doc, off, left,
                            right, stride_kn, stride_kd, stride_vn, stride_vd, qk_scale, BLOCK_N, D, D_PAD, True,
                            PRECISION)
    _store_rows(DQ + b64 * stride_qb + h64 * stride_qh + q0 * stride_qn, dqi * scale, offs_m, L_doc, stride_qn,
                stride_qd, D, D_PAD)
    if COUNT:
        slot = COUNTS + ((h64 * NB + b) * TM + blk) * 2
        tl.store(slot, ((f_hi - f_lo) // BLOCK_N).to(tl.int32), mask=m0 < L_doc)
        tl.store(slot + 1, ((f_lo - lo) // BLOCK_N + tl.cdiv(hi - f_hi, BLOCK_N)).to(tl.int32), mask=m0 < L_doc)


# --- dense masks ---------------------------------------------------------------------------------------------

@triton.jit
def _dkdv_listed(dkj, dvj, kj, vj, Q, DO, LSE, DELTA, MASK, IDX, n, offs_n, L, S, stride_qn, stride_qd, stride_don,
                 stride_dod, stride_dn, stride_mm, stride_mn, qk_scale, BLOCK_M: tl.constexpr, D: tl.constexpr,
                 D_PAD: tl.constexpr, MASK_KIND: tl.constexpr, CAUSAL: tl.constexpr, PRECISION: tl.constexpr):
    """The ``n`` Q blocks listed at ``IDX`` against this program's key block; MASK_KIND 0: full tiles, no mask."""
    for i in tl.range(0, n):
        start_m = tl.multiple_of(tl.load(IDX + i) * BLOCK_M, BLOCK_M)
        offs_m = start_m + tl.arange(0, BLOCK_M)
        qi = _load_rows(Q, 0, start_m, L, stride_qn, stride_qd, BLOCK_M, D, D_PAD, False)
        doi = _load_rows(DO, 0, start_m, L, stride_don, stride_dod, BLOCK_M, D, D_PAD, False)
        lse_i, delta_i = _row_stats(LSE, DELTA, offs_m, L, stride_dn)
        sT = tl.dot(kj, tl.trans(qi), input_precision=PRECISION)
        if MASK_KIND == 0:
            s2T = sT * qk_scale
        else:
            s2T = mask_scores(sT, MASK, offs_m, offs_n, L, S, stride_mm, stride_mn, qk_scale, MASK_KIND, CAUSAL,
                              TRANSPOSED=True)
        dkj, dvj = _dkdv_step(dkj, dvj, s2T, qi, doi, vj, lse_i, delta_i, PRECISION)
    return dkj, dvj


@triton.jit
def bwd_dkdv_blocks(
    Q, K, V, DO, DK, DV, LSE, DELTA, COUNTS, MASK, Q_NUM, Q_IDX, FULL_NUM, FULL_IDX,
    stride_qb, stride_qh, stride_qn, stride_qd, stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd, stride_dob, stride_doh, stride_don, stride_dod,
    stride_lb, stride_lh, stride_db, stride_dh, stride_dn, stride_mb, stride_mh, stride_mm, stride_mn,
    table_b, table_h, HKV, GROUP, B, L, S, TM, TN, qk_scale, scale,
    D: tl.constexpr, D_PAD: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, MASK_KIND: tl.constexpr,
    CAUSAL: tl.constexpr, PRECISION: tl.constexpr, COUNT: tl.constexpr,
):
    """dK and dV of one key block of one K/V head, over the Q blocks its column of the tables lists, for each of
    the GROUP query heads (each with its own row of the tables where the mask has heads)."""
    blk, pid_bh = tl.program_id(0), tl.program_id(1)
    b, hk = pid_bh // HKV, pid_bh % HKV
    b64, hk64 = b.to(tl.int64), hk.to(tl.int64)
    n0 = blk * BLOCK_N
    offs_n = n0 + tl.arange(0, BLOCK_N)
    k_head = K + b64 * stride_kb + hk64 * stride_kh
    v_head = V + b64 * stride_vb + hk64 * stride_vh
    kj = _load_rows(k_head, 0, n0, S, stride_kn, stride_kd, BLOCK_N, D, D_PAD, False)
    vj = _load_rows(v_head, 0, n0, S, stride_vn, stride_vd, BLOCK_N, D, D_PAD, False)
    dkj = tl.zeros([BLOCK_N, D_PAD], tl.float32)
    dvj = tl.zeros([BLOCK_N, D_PAD], tl.float32)
    for g in range(0, GROUP):
        h = hk * GROUP + g
        h64 = h.to(tl.int64)
        q_head = Q + b64 * stride_qb + h64 * stride_qh
        do_head = DO + b64 * stride_dob + h64 * stride_doh
        lse_head = LSE + b64 * stride_lb + h64 * stride_lh
        delta_head = DELTA + b64 * stride_db + h64 * stride_dh
        mask_head = MASK + b64 * stride_mb + h64 * stride_mh
        col = ((b * table_b + h * table_h) * TN + blk).to(tl.int64)  # this key block's column of the tables
        n_full, n_part = tl.load(FULL_NUM + col), tl.load(Q_NUM + col)
        dkj, dvj = _dkdv_listed(dkj, dvj, kj, vj, q_head, do_head, lse_head, delta_head, mask_head, FULL_IDX + col * TM,
                                n_full, offs_n, L, S, stride_qn, stride_qd, stride_don, stride_dod, stride_dn, stride_mm,
                                stride_mn, qk_scale, BLOCK_M, D, D_PAD, 0, CAUSAL, PRECISION)
        dkj, dvj = _dkdv_listed(dkj, dvj, kj, vj, q_head, do_head, lse_head, delta_head, mask_head, Q_IDX + col * TM,
                                n_part, offs_n, L, S, stride_qn, stride_qd, stride_don, stride_dod, stride_dn, stride_mm,
                                stride_mn, qk_scale, BLOCK_M, D, D_PAD, MASK_KIND, CAUSAL, PRECISION)
    _store_rows(DK + b64 * stride_kb + hk64 * stride_kh, dkj * scale, offs_n, S, stride_kn, stride_kd, D, D_PAD)
    _store_rows(DV + b64 * stride_vb + hk64 * stride_vh, dvj, offs_n, S, stride_vn, stride_vd, D, D_PAD)
    if COUNT:  # (full, partial) tiles over the group's query heads
        n_full = tl.zeros([], tl.int32)
        n_part = tl.zeros([], tl.int32)
        for g in range(0, GROUP):
            col = ((b * table_b + (hk * GROUP + g) * table_h) * TN + blk).to(tl.int64)
            n_full += tl.load(FULL_NUM + col)
            n_part += tl.load(Q_NUM + col)
        slot = COUNTS + ((hk64 * B + b64) * TN + blk) * 2
        tl.store(slot, n_full)
        tl.store(slot + 1, n_part)


@triton.jit
def bwd_dq_blocks(
    Q, K, V, DO, DQ, LSE, DELTA, COUNTS, MASK, KV_NUM, KV_IDX, FULL_NUM, FULL_IDX,
    stride_qb, stride_qh, stride_qn, stride_qd, stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd, stride_dob, stride_doh, stride_don, stride_dod,
    stride_lb, stride_lh, stride_db, stride_dh, stride_dn, stride_mb, stride_mh, stride_mm, stride_mn,
    table_b, table_h, H, GROUP, B, L, S, TM, TN, qk_scale, scale,
    D: tl.constexpr, D_PAD: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, MASK_KIND: tl.constexpr,
    CAUSAL: tl.constexpr, PRECISION: tl.constexpr, COUNT: tl.constexpr,
):
    """dQ of one Q block of one query head, over the key blocks its row of the tables lists."""
    blk, pid_bh = tl.program_id(0), tl.program_id(1)
    if CAUSAL:
        blk = TM - 1 - blk
    b, h = pid_bh // H, pid_bh % H
    b64, h64, hk64 = b.to(tl.int64), h.to(tl.int64), (h // GROUP).to(tl.int64)
    m0 = blk * BLOCK_M
    offs_m = m0 + tl.arange(0, BLOCK_M)
    k_head = K + b64 * stride_kb + hk64 * stride_kh
    v_head = V + b64 * stride_vb + hk64 * stride_vh
    mask_head = MASK + b64 * stride_mb + h64 * stride_mh
    qi = _load_rows(Q + b64 * stride_qb + h64 * stride_qh, 0, m0, L, stride_qn, stride_qd, BLOCK_M, D, D_PAD, False)
    doi = _load_rows(DO + b64 * stride_dob + h64 * stride_doh, 0, m0, L, stride_don, stride_dod, BLOCK_M, D, D_PAD,
                     False)
    lse_i, delta_i = _row_stats(LSE + b64 * stride_lb + h64 * stride_lh, DELTA + b64 * stride_db + h64 * stride_dh,
                                offs_m, L, stride_dn)
    row = ((b * table_b + h * table_h) * TM + blk).to(tl.int64)
    n_full, n_part = tl.load(FULL_NUM + row), tl.load(KV_NUM + row)
    dqi = tl.zeros([BLOCK_M, D_PAD], tl.float32)
    for i in tl.range(0, n_full):
        start_n = tl.multiple_of(tl.load(FULL_IDX + row * TN + i) * BLOCK_N, BLOCK_N)
        kj = _load_rows(k_head, 0, start_n, S, stride_kn, stride_kd, BLOCK_N, D, D_PAD, False)
        vj = _load_rows(v_head, 0, start_n, S, stride_vn, stride_vd, BLOCK_N, D, D_PAD, False)
        s2 = tl.dot(qi, tl.trans(kj), input_precision=PRECISION) * qk_scale
        dqi = _dq_step(dqi, s2, doi, kj, vj, lse_i, delta_i, PRECISION)
    for i in tl.range(0, n_part):
        start_n = tl.multiple_of(tl.load(KV_IDX + row * TN + i) * BLOCK_N, BLOCK_N)
        kj = _load_rows(k_head, 0, start_n, S, stride_kn, stride_kd, BLOCK_N, D, D_PAD, False)
        vj = _load_rows(v_head, 0, start_n, S, stride_vn, stride_vd, BLOCK_N, D, D_PAD, False)
        sij = tl.dot(qi, tl.trans(kj), input_precision=PRECISION)
        s2 = mask_scores(sij, mask_head, offs_m, start_n + tl.arange(0, BLOCK_N), L, S, stride_mm, stride_mn,
                         qk_scale, MASK_KIND, CAUSAL)
        dqi = _dq_step(dqi, s2, doi, kj, vj, lse_i, delta_i, PRECISION)
    _store_rows(DQ + b64 * stride_qb + h64 * stride_qh, dqi * scale, offs_m, L, stride_qn, stride_qd, D, D_PAD)
    if COUNT:
        slot = COUNTS + ((h64 * B + b64) * TM + blk) * 2
        tl.store(slot, n_full)
        tl.store(slot + 1, n_part)


JIT_KERNELS = (bwd_dkdv_window, bwd_dq_window, bwd_dkdv_blocks, bwd_dq_blocks)


# --- launches ------------------------------------------------------------------------------------------------

def _stats(lse: torch.Tensor, delta: torch.Tensor) -> tuple:
    """The strides of the (B, H, rows) views of the log-sum-exp (rows contiguous) and of delta."""
    assert lse.stride(2) == 1, "the log-sum-exp's rows must be contiguous"
    return (lse.stride(0), lse.stride(1), *delta.stride())


# The dQ kernel on a second CUDA stream beside the dK/dV kernel, so that each fills the SMs the other's last programs
# leave idle (FlexAttention runs both in one launch). Off: tools/gpu/masks/concurrent_dq.py timed it on the H200
# (stop 48) slower than the kernels in turn on most of its cells (two kernels on one GPU slow each other down more
# than the idle tails they fill), faster only on the packed documents at D = 128, and not by enough to pass
# FlexAttention there.
CONCURRENT_DQ = False
_side_streams: dict = {}


def _fork(device):
    """A second stream that has waited for the current one's work so far (None where the kernels run one after the
    other): launches on it run beside the next ones on the current stream, until :func:`_join`."""
    if not (CONCURRENT_DQ and runtime.MODE == "gpu" and device.type == "cuda"):
        return None
    side = _side_streams.get(device)
    if side is None:
        side = _side_streams[device] = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    return side


def _on(side, name: str):
    return torch.cuda.stream(side) if side is not None and name == "dq" else contextlib.nullcontext()


def _join(side, device) -> None:
    if side is not None:  # what follows on the current stream (the gradients' use, their memory's reuse) waits
        torch.cuda.current_stream(device).wait_stream(side)


def backward_window(q, k, v, do, lse, delta, dq, dk, dv, *, left: int, right: int, scale: float, dkdv_tiles,
                    dq_tiles, cu_q=None, cu_k=None, max_seqlen_q=None, max_seqlen_k=None, bottom_right=False,
                    counts: dict | None = None) -> None:
    """Launch the two window kernels. q, k, v, do, lse as ``masked.forward_window`` takes them ((B, H, N, D) and
    (B, H, N) strided views; packed documents: (1, H, total, …) views), ``delta`` (``fast_backward.delta_rows``)
    a (B, H, N) view like lse, dq, dk, dv strided views like q, k, v to fill; ``counts``: None, or a dict that gets
    int32 "dkdv" (Hkv, B or documents, TN, 2) and "dq" (Hq, …, TM, 2) tensors."""
    (B, H, L, D), (Hkv, S) = q.shape, k.shape[1:3]
    varlen = cu_q is not None
    nb = cu_q.numel() - 1 if varlen else B
    common = dict(D=D, D_PAD=padded_head_dim(D), VARLEN=varlen, BOTTOM_RIGHT=bottom_right,
                  PRECISION=precision_of(q.dtype), COUNT=counts is not None)
    strides = (*q.stride(), *k.stride(), *v.stride(), *do.stride(), *_stats(lse, delta))
    launches = (("dkdv", bwd_dkdv_window, (q, k, v, do, dk, dv, lse, delta), dkdv_tiles, Hkv, 1, cu_k, S,
                 max_seqlen_k, False),
                ("dq", bwd_dq_window, (q, k, v, do, dq, lse, delta), dq_tiles, H, 0, cu_q, L, max_seqlen_q, True))
    stream = _fork(q.device)
    for name, fn, tensors, (bm, bn, warps, stages), heads, side, cu, n, longest, reverse in launches:
        block = (bm, bn)[side]  # the dK/dV kernel's programs are key blocks, the dQ kernel's Q blocks
        blocks = triton.cdiv(longest if varlen else n, block)
        with _on(stream, name):
            table = block_table(cu, n, block, reverse=reverse) if varlen else None
            grid = (table.shape[0] if varlen else B * blocks, heads)
            found = None if counts is None else torch.zeros((heads, nb, blocks, 2), dtype=torch.int32,
                                                            device=q.device)
            launch_cache.launch(fn, grid, (*tensors, found, cu_q, cu_k, table, *strides, heads, H // Hkv, nb, L, S,
                                           blocks, left, right, scale * LOG2_E.value, scale),
                                dict(common, BLOCK_M=bm, BLOCK_N=bn), num_warps=warps, num_stages=stages)
        if counts is not None:
            counts[name] = found
    _join(stream, q.device)


def backward_blocks(q, k, v, do, lse, delta, dq, dk, dv, mask, dkdv_tables, dq_tables, *, causal: bool,
                    scale: float, dkdv_tiles, dq_tiles, counts: dict | None = None) -> None:
    """Launch the two dense-mask kernels: ``mask`` as ``masked.forward_blocks`` takes it, ``dkdv_tables`` and
    ``dq_tables`` its ``mask_blocks.BlockTables`` at each kernel's tiles; the rest as :func:`backward_window`."""
    (B, H, L, D), (Hkv, S) = q.shape, k.shape[1:3]
    elements = mask.view(torch.uint8) if mask.dtype == torch.bool else mask
    common = dict(D=D, D_PAD=padded_head_dim(D), MASK_KIND=mask_kind(mask), CAUSAL=causal,
                  PRECISION=precision_of(q.dtype), COUNT=counts is not None)
    strides = (*q.stride(), *k.stride(), *v.stride(), *do.stride(), *_stats(lse, delta), *mask.stride())
    stream = _fork(q.device)
    for name, tiles, tables in (("dkdv", dkdv_tiles, dkdv_tables), ("dq", dq_tiles, dq_tables)):
        bm, bn, warps, stages = tiles
        assert (tables.block_m, tables.block_n) == (bm, bn), "tables classified at other tiles"
        tm, tn = triton.cdiv(L, bm), triton.cdiv(S, bn)
        if name == "dkdv":
            fn, grid, heads, blocks = bwd_dkdv_blocks, (tn, B * Hkv), Hkv, tn
            outputs = (q, k, v, do, dk, dv, lse, delta)
            lists = (tables.q_num_blocks, tables.q_indices, tables.full_q_num_blocks, tables.full_q_indices)
        else:
            fn, grid, heads, blocks = bwd_dq_blocks, (tm, B * H), H, tm
            outputs = (q, k, v, do, dq, lse, delta)
            lists = (tables.kv_num_blocks, tables.kv_indices, tables.full_kv_num_blocks, tables.full_kv_indices)
        with _on(stream, name):
            found = None if counts is None else torch.zeros((heads, B, blocks, 2), dtype=torch.int32,
                                                            device=q.device)
            launch_cache.launch(fn, grid, (*outputs, found, elements, *lists, *strides, *table_strides(lists[0]),
                                           heads, H // Hkv, B, L, S, tm, tn, scale * LOG2_E.value, scale),
                                dict(common, BLOCK_M=bm, BLOCK_N=bn), num_warps=warps, num_stages=stages)
        if counts is not None:
            counts[name] = found
    _join(stream, q.device)


def bind_window(q, k, v, do, lse, delta, dq, dk, dv, **options):
    """:func:`backward_window` for one window problem without documents, counts or a second stream, bound: a function
    ``run(q, k, v, do, lse, delta, dq, dk, dv)`` for tensors with these ones' shapes, strides, dtypes and alignment
    (a caller keys it so, as ``launch_cache.bind`` asks) that launches the two kernels again without working out
    their arguments and keys (a short window's backward costs the host more than the GPU, and the autograd engine
    runs it on a thread where Python is slower). The launches are the ones :func:`backward_window` makes, recorded
    once (``launch_cache.capturing``) with these tensors in their places. None where it does not apply."""
    templates = (q, k, v, do, lse, delta, dq, dk, dv)
    if CONCURRENT_DQ or options.get("cu_q") is not None or options.get("counts") is not None:
        return None
    if len({id(t) for t in templates}) < len(templates):  # one tensor in two places: its place would be ambiguous
        return None
    with launch_cache.capturing() as launches:
        backward_window(*templates, **options)
    bound = []
    for kernel, grid, args, constexprs, launch_options in launches:
        places = tuple((i, next((j for j, t in enumerate(templates) if a is t), None)) for i, a in enumerate(args)
                       if isinstance(a, torch.Tensor))
        if any(j is None for _, j in places):  # a tensor made inside (none for a window): not a bound problem
            return None
        kept = tuple(None if isinstance(a, torch.Tensor) else a for a in args)  # no reference to these tensors kept
        bound.append((launch_cache.bind(kernel, grid, constexprs, **launch_options), kept, places))

    def run(*tensors):
        for launch, args, places in bound:
            args = list(args)
            for i, j in places:
                args[i] = tensors[j]
            launch(*args)

    return run
