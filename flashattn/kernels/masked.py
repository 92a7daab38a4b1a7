"""Masked attention, the forward pass (notebook 14): ``fast``'s loop over only the key blocks a mask leaves.

``fast.py`` splits its key loop into stages so that only the causal diagonal and the ragged tail pay for
``tl.where``. Here the same loop runs for any mask, from the mask's block structure (``mask_blocks.py``): the key
blocks a Q block's rows cannot see are never loaded, blocks that every row sees in full run through ``fast``'s
unmasked step (``fast._attend`` / ``fast._update`` with ``MASK=False``: no ``tl.where``), and only the blocks
that cross a boundary of the mask apply it element by element. Two kernels:

* :func:`attn_fwd_window`: sliding windows (FlashAttention's ``window_size``) and packed documents
  (``flash_attn_varlen_func``'s layout, ``cu_seqlens``), with the key range of each Q block computed from its
  corners (:func:`_window_stages`): masked left edge, full interior, masked right edge (the diagonal);
* :func:`attn_fwd_blocks`: a dense ``attn_mask`` (boolean, or float added to the scores), classified once per
  call into lists of full and partial key blocks per Q block (FlexAttention's ``BlockMask``), the element mask
  read through its strides (zero along broadcast dimensions) on partial blocks only.

Both: grouped-query heads (query head h reads K/V head h // GROUP), any D up to 256 (padded to D_PAD), rows the
mask covers entirely give 0 (as torch's SDPA) with log-sum-exp +inf (as FlashAttention: the backward's
``exp2(s - lse)`` is then 0), and, with ``COUNT``, each Q block's number of (full, partial) key blocks
computed, which tests compare with the mask's block structure. The backward is ``masked_backward.py``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from flashattn import runtime

from . import launch_cache
from .constants import LN_2, LOG2_E
from .fast import _attend, _load_rows, _update
from .fast_options import FALLBACK_SPACE, document_blocks, fitting, forward_shared_bytes, padded_head_dim

REACH = 1 << 30  # an unbounded window side (-1) as a distance no key is farther than

# Tiles (BLOCK_M, BLOCK_N, num_warps, num_stages) per padded head dimension, 16-bit inputs; the first is the
# default. Ordered at D = 64 and 128 by tools/gpu/masks/probe.py's sweep on the H200 against FlexAttention
# (2026-12-02: (64, 64, 4, 3) the fastest on the window and document problems); the other head dimensions are not
# measured. Narrow key blocks waste less at a window's edges; whole warpgroups (4 or 8 warps) as in fast's space.
FORWARD_TILES = {
    16: [(128, 64, 4, 3), (64, 64, 4, 3)],
    32: [(128, 64, 4, 3), (64, 64, 4, 3)],
    64: [(64, 64, 4, 3), (128, 64, 4, 3), (128, 128, 8, 3), (64, 128, 4, 2), (128, 32, 4, 3), (128, 128, 4, 3)],
    128: [(64, 64, 4, 3), (128, 64, 8, 2), (128, 32, 4, 3), (128, 128, 8, 2), (128, 64, 4, 2)],
    256: [(64, 32, 4, 2), (64, 64, 4, 2), (128, 32, 8, 2)],
}
# A dense attn_mask (attn_fwd_blocks): a key-padding mask leaves long runs of full tiles, where wide Q blocks pay.
# The probe's sweep of the padding problem (B 4, 16 heads, N 16k, fp16 and bf16, 2026-12-03 15:34 UTC): at D = 64
# (128, 64, 4, 3) took 0.83-0.84 of (64, 64, 4, 3)'s time ((128, 128, 4, 3) the same within 1 %), at D = 128
# (128, 64, 4, 3) 0.91; 128 x 128 tiles with 8 warps were slower at both.
MASK_FORWARD_TILES = {
    **FORWARD_TILES,
    64: [(128, 64, 4, 3), (128, 128, 4, 3), (128, 128, 8, 3), (64, 128, 4, 2), (64, 64, 4, 3)],
    128: [(128, 64, 4, 3), (128, 64, 4, 2), (128, 128, 8, 2), (128, 64, 8, 2), (64, 64, 4, 3)],
}
# A causal sliding window on Hopper (16-bit, D = 64 or 128, as many keys as queries, one K/V head per query head):
# fast's Gluon kernel with its WINDOW (fast_gluon.py), which starts each tile's loop at the window's first key
# block. Its options per head dimension (fast_options.resolve's keywords); see gluon_window_options. From
# tools/gpu/masks/gluon_window.py (H200, 2026-12-03 17:26 UTC; windows of 256, 1k and 4k at N 16k and 64k, B 1, 16
# heads, fp16 and bf16; geometric mean of FlexAttention's time over ours): at D = 64 one warpgroup per program,
# (64, 128), 1.26 (persistent with 2 consumers 1.08, specialized 1.00, the Triton window kernel 0.93); at D = 128
# a producer and 2 consumers, (64, 128), 1.34 (persistent 1.33, the Triton window kernel 1.10).
GLUON_WINDOW = {64: dict(block_m=64, block_n=128, num_warps=4, num_stages=2, schedule="single"),
                128: dict(block_m=64, block_n=128, num_warps=4, num_stages=2, schedule="specialized", consumers=2)}
# A boolean key-padding mask ((B, 1, 1, S) broadcast: masking_gluon.takes_gluon_key_mask) on fast's Gluon kernel,
# causal or not, at the head dimensions in GLUON_KEY_MASK_DIMS (the dense mask's Triton kernel elsewhere), reading
# only the partial key blocks' mask bytes (fast_gluon's KEY_MASK 2; the host flags each block:
# masking_gluon.key_mask_blocks): a full block loads no mask bytes and selects nothing. tools/gpu/masks/padding_tiles.py
# (H200, 2026-12-04 17:32 UTC; masks_vs_flex's padding problem, B 4, 16 heads, N 16k, fp16 and bf16, forward),
# FlexAttention's time over ours: at D = 64 a producer and 3 consumers 1.23-1.25 (2 consumers 1.10-1.12, one
# warpgroup 1.14-1.18, the Triton kernel 0.95-0.98); at D = 128 a producer and 2 consumers 1.37-1.41 (the Triton
# kernel 1.04-1.05). Reading every block's bytes (GLUON_KEY_MASK_BLOCKS False, KEY_MASK 1) was slower at every
# schedule: 0.88-0.92 at D = 64 (3 consumers 0.60-0.65: they spill), 1.23-1.25 at D = 128 with 2 consumers.
GLUON_KEY_MASK = {64: dict(block_m=64, block_n=128, num_warps=4, num_stages=2, schedule="specialized", consumers=3),
                  128: dict(block_m=64, block_n=128, num_warps=4, num_stages=2, schedule="specialized", consumers=2)}
GLUON_KEY_MASK_DIMS = (64, 128)
GLUON_KEY_MASK_BLOCKS = True
# Packed documents (attention_varlen with one cu_seqlens for queries and keys, no window) on fast's Gluon kernel
# (its DOCS: each document a sequence of its own, a tile per (document, Q block) from block_table), at the head
# dimensions in GLUON_DOCUMENTS_DIMS. Written 2026-12-04, after masks_vs_flex's documents at D = 128 fwd+bwd came
# to 0.99-1.00x FlexAttention with the Triton forward (1.12-1.13x forward alone); on at D = 128 since it passed
# tests/test_masked_gluon.py on the H200 and masks_vs_flex was recorded with it (stop 53). D = 64 keeps the Triton
# kernels (their documents cells were 1.13x FlexAttention or more).
GLUON_DOCUMENTS = {64: dict(block_m=64, block_n=128, num_warps=4, num_stages=2, schedule="specialized", consumers=2),
                   128: dict(block_m=64, block_n=128, num_warps=4, num_stages=2, schedule="specialized", consumers=2)}
GLUON_DOCUMENTS_DIMS = (128,)
# Their backward on fast's Gluon backward kernel (fast_backward_gluon.py's DOCS: a program per document and key
# block, the ragged ends masked), at the head dimensions in GLUON_DOCUMENTS_BACKWARD_DIMS: written the same day, after
# tools/gpu/masks/docs_backward.py (2026-12-03) put the gap to FlexAttention in the two Triton backward kernels (1.53
# ms against its 1.44). Its first run stopped with "illegal instruction" (lse and delta by 1-D TMA from a start that
# is not 16-byte aligned: tools/gpu/masks/gluon_documents_bisect.py); the consumers now load them by pointer.
GLUON_DOCUMENTS_BACKWARD_DIMS = (128,)
FLOAT32_TILES = [(64, 32, 4, 2), (32, 32, 4, 2)]  # IEEE float32 on the CUDA cores: for checking, not speed
INTERPRETER_TILES = (32, 32, 4, 1)  # small blocks: a test's few dozen keys still make several of them


def mask_tile_bytes(tiles: tuple, mask: torch.dtype | None) -> int:
    """Shared memory a dense mask's element tiles take beside K and V (two in flight); 0 without one (windows and
    documents compute their mask from indices). Booleans are read as bytes."""
    return 0 if mask is None else 2 * (1 if mask == torch.bool else mask.itemsize) * tiles[0] * tiles[1]


def tiles_for(dtype: torch.dtype, D: int, mode: str | None = None,
              mask: torch.dtype | None = None) -> list[tuple[int, int, int, int]]:
    """The forward's tile candidates for this dtype and head dimension (the first is the default): of
    :func:`attn_fwd_window` (``mask`` None: windows, documents), or of :func:`attn_fwd_blocks` for a dense mask of
    dtype ``mask``."""
    if (mode or runtime.MODE) == "interpreter":
        return [INTERPRETER_TILES]
    table = FORWARD_TILES if mask is None else MASK_FORWARD_TILES
    space = list(FLOAT32_TILES) if dtype == torch.float32 else list(table[padded_head_dim(D)])
    return fitting(space, FALLBACK_SPACE,
                   lambda c: forward_shared_bytes(c, D, dtype, extra=mask_tile_bytes(c, mask)),
                   f"masked forward (D={D}, {dtype}{'' if mask is None else ', ' + str(mask) + ' mask'})")


def gluon_window_options(dtype: torch.dtype, D: int, options: dict | None = None):
    """The ``fast_options.FastOptions`` a causal sliding window runs the Gluon kernel with (:data:`GLUON_WINDOW`, or
    ``options`` in its place)."""
    from .fast_options import resolve

    return resolve(dtype, D, True, {"gluon": True, **(options or GLUON_WINDOW[D])})


def gluon_key_mask_options(dtype: torch.dtype, D: int, causal: bool, options: dict | None = None):
    """The ``fast_options.FastOptions`` a key-padding mask runs the Gluon kernel with (:data:`GLUON_KEY_MASK`, or
    ``options`` in its place)."""
    from .fast_options import resolve

    return resolve(dtype, D, causal, {"gluon": True, **(options or GLUON_KEY_MASK[D])})


def gluon_documents_options(dtype: torch.dtype, D: int, causal: bool, options: dict | None = None):
    """The ``fast_options.FastOptions`` packed documents run the Gluon kernel with (:data:`GLUON_DOCUMENTS`, or
    ``options`` in its place)."""
    from .fast_options import resolve

    return resolve(dtype, D, causal, {"gluon": True, **(options or GLUON_DOCUMENTS[D])})


def gluon_window_block(dtype: torch.dtype, D: int, options: dict | None = None) -> tuple[int, int]:
    """(rows, keys) of the tiles the Gluon window kernel computes: a program's rows (its consumers' block_m each)
    against one key block; every consumer goes through every key block its program's rows see."""
    opts = gluon_window_options(dtype, D, options)
    return opts.block_m * (1 if opts.schedule == "single" else opts.consumers), opts.block_n


def gluon_block(config: dict) -> tuple[int, int]:
    """(rows, keys) of the tiles the Gluon kernel computes with ``config`` (an entry of :data:`GLUON_KEY_MASK` or
    :data:`GLUON_DOCUMENTS`), as :func:`gluon_window_block` counts them."""
    return config["block_m"] * (1 if config["schedule"] == "single" else config["consumers"]), config["block_n"]


# --- the steps -----------------------------------------------------------------------------------------------

@triton.jit
def _masked_step(acc, li, mi, s2, vj, PRECISION: tl.constexpr):
    """One key block's online-softmax step for scores already scaled to base 2 and masked (``s2`` is -inf where a
    pair does not take part). Guarded: a row that has seen no key yet (``mi`` = -inf) and sees none in this block
    keeps ``mi`` = -inf and adds nothing (the unguarded step would compute -inf - (-inf) = NaN)."""
    mi_new = tl.maximum(mi, tl.max(s2, 1))
    m_safe = tl.where(mi_new == float("-inf"), 0.0, mi_new)
    alpha = tl.exp2(mi - m_safe)
    pij = tl.exp2(s2 - m_safe[:, None])
    li = li * alpha + tl.sum(pij, 1)
    acc = tl.dot(pij.to(vj.dtype), vj, acc * alpha[:, None], input_precision=PRECISION)
    return acc, li, mi_new


@triton.jit
def _window_rows(offs_m, L_doc, off, left, right):
    """Each query's first and last key: query i sees key j iff i + off - left <= j <= i + off + right (rows past the
    document's end see none: first > last). Per row, so that a tile's mask is two broadcast comparisons."""
    first = tl.where(offs_m < L_doc, offs_m + off - left, 2147483647)
    return first, offs_m + off + right


@triton.jit
def _window_keep(offs_m, offs_n, L_doc, S_doc, off, left, right):
    """(rows, keys) pairs that take part, as a (rows, keys) tile."""
    first, last = _window_rows(offs_m, L_doc, off, left, right)
    return ((offs_n[None, :] >= first[:, None]) & (offs_n[None, :] <= last[:, None])
            & (offs_n < S_doc)[None, :])


@triton.jit
def _window_stages(m0, L_doc, S_doc, off, left, right, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """The key blocks of the Q block ``m0 .. m0 + BLOCK_M``: masked ``lo .. f_lo``, full ``f_lo .. f_hi``, masked
    ``f_hi .. hi`` (``mask_blocks.window_kinds`` is the same rule, for whole matrices of tiles).

    The rows see keys from ``m0 + off - left`` (the first row's left edge) to ``m_last + off + right`` (the last
    row's right edge); a block is full when the last row's left edge is at or before its first key, the first
    row's right edge at or after its last key, and the tile lies inside the problem."""
    m_last = tl.minimum(m0 + BLOCK_M, L_doc) - 1
    lo_key = tl.maximum(m0 + off - left, 0)
    hi = tl.minimum(m_last + off + right + 1, S_doc)
    lo = (lo_key // BLOCK_N) * BLOCK_N
    hi = tl.where(hi <= lo_key, lo, hi)  # no key at all: nothing to visit
    f_lo = tl.cdiv(tl.maximum(m0 + BLOCK_M - 1 + off - left, 0), BLOCK_N) * BLOCK_N
    f_hi = (tl.maximum(tl.minimum(m0 + off + right + 1, S_doc), 0) // BLOCK_N) * BLOCK_N
    no_full = (f_hi <= f_lo) | (m0 + BLOCK_M > L_doc)
    f_lo = tl.where(no_full, lo, f_lo)
    f_hi = tl.where(no_full, lo, f_hi)
    return lo, f_lo, f_hi, hi


@triton.jit
def _attend_window(acc, li, mi, qi, K, V, lo, hi, offs_m, L_doc, S_doc, off, left, right,
                   stride_kn, stride_kd, stride_vn, stride_vd, qk_scale,
                   BLOCK_N: tl.constexpr, D: tl.constexpr, D_PAD: tl.constexpr, PRECISION: tl.constexpr):
    """Key blocks ``lo .. hi`` that cross the window's (or the document's) boundary: the element mask applied."""
    for start_n in tl.range(lo, hi, BLOCK_N):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        kj = _load_rows(K, 0, start_n, S_doc, stride_kn, stride_kd, BLOCK_N, D, D_PAD, False)
        sij = tl.dot(qi, tl.trans(kj), input_precision=PRECISION)
        keep = _window_keep(offs_m, start_n + tl.arange(0, BLOCK_N), L_doc, S_doc, off, left, right)
        s2 = tl.where(keep, sij * qk_scale, float("-inf"))
        vj = _load_rows(V, 0, start_n, S_doc, stride_vn, stride_vd, BLOCK_N, D, D_PAD, False)
        acc, li, mi = _masked_step(acc, li, mi, s2, vj, PRECISION)
    return acc, li, mi


@triton.jit
def _finish(acc, li, mi, O, LSE, offs_m, row_ok, stride_on, stride_od, D: tl.constexpr, D_PAD: tl.constexpr,
            STORE_LSE: tl.constexpr):
    """Divide by the row sums and store; rows that saw no key store 0 and log-sum-exp +inf (a NaN row sum, from a NaN
    in the inputs or the mask, stays NaN in both, so that the backward's gradients are NaN where torch's are)."""
    seen = (li > 0) | (li != li)
    li = tl.where(seen, li, 1.0)
    acc = acc / li[:, None]
    offs_d = tl.arange(0, D_PAD)
    ptrs = O + offs_m[:, None] * stride_on + offs_d[None, :] * stride_od
    tl.store(ptrs, acc.to(O.dtype.element_ty), mask=row_ok[:, None] & (offs_d[None, :] < D))
    if STORE_LSE:  # natural log; mi and log2(li) are in base 2
        tl.store(LSE + offs_m, tl.where(seen, (mi + tl.log2(li)) * LN_2, float("inf")), mask=row_ok)


@triton.jit
def doc_bounds(CU_Q, CU_K, TABLE, pid, TM, L, S, VARLEN: tl.constexpr, REVERSE: tl.constexpr):
    """(batch or document, block within it, first row of its queries and keys, their counts) of program ``pid``.
    Packed documents: from the block table (entries past the last block have document -1: empty); otherwise
    ``pid`` = batch · TM + block, the last blocks first with ``REVERSE`` (heaviest first)."""
    if VARLEN:
        b = tl.load(TABLE + 2 * pid)
        blk = tl.load(TABLE + 2 * pid + 1)
        valid = b >= 0
        b = tl.maximum(b, 0)
        q0, k0 = tl.load(CU_Q + b), tl.load(CU_K + b)
        L_doc = tl.where(valid, tl.load(CU_Q + b + 1) - q0, 0)
        S_doc = tl.where(valid, tl.load(CU_K + b + 1) - k0, 0)
    else:
        b = pid // TM
        blk = TM - 1 - pid % TM if REVERSE else pid % TM
        q0 = pid * 0
        k0 = q0
        L_doc, S_doc = q0 + L, q0 + S
    return b, blk, q0.to(tl.int64), k0.to(tl.int64), L_doc, S_doc


@triton.jit
def varlen_block_table(CU, TABLE, n_docs, n_entries, BLOCK: tl.constexpr, DOCS: tl.constexpr,
                       CHUNK: tl.constexpr, REVERSE: tl.constexpr):
    """Entry t of the packed documents' block table: (document, block within it) of the t-th block, counted over
    the documents in order (each starts a new block: no tile crosses a document), -1 past the last. Built on the
    GPU from ``cu_seqlens`` (no copy to the host, so no synchronisation); REVERSE: a document's last blocks first."""
    t = tl.program_id(0) * CHUNK + tl.arange(0, CHUNK)
    d = tl.arange(0, DOCS)
    start = tl.load(CU + d, mask=d < n_docs, other=0)
    end = tl.load(CU + d + 1, mask=d < n_docs, other=0)
    blocks = tl.where(d < n_docs, tl.cdiv(tl.maximum(end - start, 0), BLOCK), 0)
    last = tl.cumsum(blocks, 0)  # one past each document's last block
    before = last[None, :] <= t[:, None]  # the documents whose blocks all come before t
    doc = tl.sum(before.to(tl.int32), 1)
    first = tl.max(tl.where(before, last[None, :], 0), 1)
    nxt = tl.min(tl.where(before, 2147483647, last[None, :]), 1)
    local = nxt - 1 - t if REVERSE else t - first
    valid = doc < n_docs
    tl.store(TABLE + 2 * t, tl.where(valid, doc, -1), mask=t < n_entries)
    tl.store(TABLE + 2 * t + 1, tl.where(valid, local, 0), mask=t < n_entries)


# --- the kernels ---------------------------------------------------------------------------------------------

@triton.jit
def attn_fwd_window(
    Q, K, V, O, LSE, COUNTS, CU_Q, CU_K, TABLE,
    stride_qb, stride_qh, stride_qn, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_ob, stride_oh, stride_on, stride_od,
    stride_lb, stride_lh, H, GROUP, NB, L, S, TM, left, right, qk_scale,
    D: tl.constexpr, D_PAD: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, VARLEN: tl.constexpr,
    BOTTOM_RIGHT: tl.constexpr, PRECISION: tl.constexpr, STORE_LSE: tl.constexpr, COUNT: tl.constexpr,
):
    """One Q block of one query head against the keys its window leaves, in three stages."""
    pid, h = tl.program_id(0), tl.program_id(1)
    b, blk, q0, k0, L_doc, S_doc = doc_bounds(CU_Q, CU_K, TABLE, pid, TM, L, S, VARLEN, True)
    off = S_doc - L_doc if BOTTOM_RIGHT else 0  # where the diagonal is: 0 top-left (torch), S - L bottom-right
    b64, h64, hk64 = b.to(tl.int64), h.to(tl.int64), (h // GROUP).to(tl.int64)
    if VARLEN:  # one packed batch: the documents are rows q0.. and k0.. of it
        b64 = b64 * 0
    m0 = blk * BLOCK_M
    offs_m = m0 + tl.arange(0, BLOCK_M)
    q_head = Q + b64 * stride_qb + h64 * stride_qh + q0 * stride_qn
    k_head = K + b64 * stride_kb + hk64 * stride_kh + k0 * stride_kn
    v_head = V + b64 * stride_vb + hk64 * stride_vh + k0 * stride_vn
    qi = _load_rows(q_head, 0, m0, L_doc, stride_qn, stride_qd, BLOCK_M, D, D_PAD, False)

    mi = tl.full([BLOCK_M], float("-inf"), tl.float32)
    li = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D_PAD], tl.float32)
    lo, f_lo, f_hi, hi = _window_stages(m0, L_doc, S_doc, off, left, right, BLOCK_M, BLOCK_N)
    # the full interior first: fast's unmasked loop, no tl.where
    acc, li, mi = _attend(acc, li, mi, qi, k_head, v_head, 0, f_lo, f_hi, offs_m, S_doc,
                          stride_kn, stride_kd, stride_vn, stride_vd, qk_scale,
                          BLOCK_N=BLOCK_N, D=D, D_PAD=D_PAD, MASK=False, CAUSAL=False, USE_TMA=False,
                          PRECISION=PRECISION)
    # the edges: the window's left edge, and its right edge (the diagonal, the end of the document)
    acc, li, mi = _attend_window(acc, li, mi, qi, k_head, v_head, lo, f_lo, offs_m, L_doc, S_doc, off, left, right,
                                 stride_kn, stride_kd, stride_vn, stride_vd, qk_scale, BLOCK_N, D, D_PAD, PRECISION)
    acc, li, mi = _attend_window(acc, li, mi, qi, k_head, v_head, f_hi, hi, offs_m, L_doc, S_doc, off, left, right,
                                 stride_kn, stride_kd, stride_vn, stride_vd, qk_scale, BLOCK_N, D, D_PAD, PRECISION)

    o_head = O + b64 * stride_ob + h64 * stride_oh + q0 * stride_on
    lse_head = LSE + b64 * stride_lb + h64 * stride_lh + q0
    _finish(acc, li, mi, o_head, lse_head, offs_m, offs_m < L_doc, stride_on, stride_od, D, D_PAD, STORE_LSE)
    if COUNT:  # (full, partial) key blocks computed, at [h, batch or document, block]
        slot = COUNTS + ((h64 * NB + b) * TM + blk) * 2
        tl.store(slot, ((f_hi - f_lo) // BLOCK_N).to(tl.int32), mask=m0 < L_doc)
        tl.store(slot + 1, ((f_lo - lo) // BLOCK_N + tl.cdiv(hi - f_hi, BLOCK_N)).to(tl.int32), mask=m0 < L_doc)


@triton.jit
def mask_scores(sij, MASK_TILE, offs_m, offs_n, L, S, stride_mm, stride_mn, qk_scale,
                MASK_KIND: tl.constexpr, CAUSAL: tl.constexpr, TRANSPOSED: tl.constexpr = False):
    """Raw scores of a partial tile, scaled to base 2 with the element mask applied: a boolean mask (MASK_KIND 1,
    stored as bytes) keeps the True pairs; a float mask (2) is added to the scaled scores, in natural units as
    torch adds it; pairs outside L × S (and, with CAUSAL, right of the diagonal) get -inf. ``TRANSPOSED``: the
    tile is (keys, rows), as the dK/dV kernel holds it; the mask is read that way round, not transposed."""
    rows = MASK_TILE + offs_m.to(tl.int64) * stride_mm  # a pointer per row: the tile adds int32 key offsets
    if TRANSPOSED:
        inside = (offs_n < S)[:, None] & (offs_m < L)[None, :]
        ptrs = rows[None, :] + (offs_n * stride_mn)[:, None]
        before = offs_n[:, None] <= offs_m[None, :]
    else:
        inside = (offs_m < L)[:, None] & (offs_n < S)[None, :]
        ptrs = rows[:, None] + (offs_n * stride_mn)[None, :]
        before = offs_n[None, :] <= offs_m[:, None]
    if MASK_KIND == 1:
        s2 = tl.where(tl.load(ptrs, mask=inside, other=0) != 0, sij * qk_scale, float("-inf"))
    else:
        bias = tl.load(ptrs, mask=inside, other=float("-inf")).to(tl.float32)
        # finite masks as low as float32's min (a common "masked" value) must not overflow to -inf once multiplied
        # by log2(e): torch treats them as finite; a NaN stays NaN (the maximum would drop it), and makes its row NaN,
        # as torch's
        bias = tl.where((bias == float("-inf")) | (bias != bias), bias, tl.maximum(bias, -1e30))
        s2 = sij * qk_scale + bias * LOG2_E
    if CAUSAL:
        s2 = tl.where(before, s2, float("-inf"))
    return s2


@triton.jit
def attn_fwd_blocks(
    Q, K, V, O, LSE, COUNTS, MASK, KV_NUM, KV_IDX, FULL_NUM, FULL_IDX,
    stride_qb, stride_qh, stride_qn, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_ob, stride_oh, stride_on, stride_od,
    stride_lb, stride_lh, stride_mb, stride_mh, stride_mm, stride_mn,
    table_b, table_h, H, GROUP, B, L, S, TM, TN, qk_scale,
    D: tl.constexpr, D_PAD: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, MASK_KIND: tl.constexpr,
    CAUSAL: tl.constexpr, PRECISION: tl.constexpr, STORE_LSE: tl.constexpr, COUNT: tl.constexpr,
):
    """One Q block of one query head against the key blocks its row of the block tables lists: the full ones
    through fast's unmasked step, the partial ones with the element mask."""
    blk, pid_bh = tl.program_id(0), tl.program_id(1)
    if CAUSAL:  # the heaviest Q blocks (the last rows) first
        blk = TM - 1 - blk
    b, h = pid_bh // H, pid_bh % H
    b64, h64, hk64 = b.to(tl.int64), h.to(tl.int64), (h // GROUP).to(tl.int64)
    m0 = blk * BLOCK_M
    offs_m = m0 + tl.arange(0, BLOCK_M)
    q_head = Q + b64 * stride_qb + h64 * stride_qh
    k_head = K + b64 * stride_kb + hk64 * stride_kh
    v_head = V + b64 * stride_vb + hk64 * stride_vh
    mask_head = MASK + b64 * stride_mb + h64 * stride_mh
    qi = _load_rows(q_head, 0, m0, L, stride_qn, stride_qd, BLOCK_M, D, D_PAD, False)
    row = ((b * table_b + h * table_h) * TM + blk).to(tl.int64)  # this Q block's row of the tables
    n_full, n_part = tl.load(FULL_NUM + row), tl.load(KV_NUM + row)

    mi = tl.full([BLOCK_M], float("-inf"), tl.float32)
    li = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D_PAD], tl.float32)
    for i in tl.range(0, n_full):
        start_n = tl.multiple_of(tl.load(FULL_IDX + row * TN + i) * BLOCK_N, BLOCK_N)
        kj = _load_rows(k_head, 0, start_n, S, stride_kn, stride_kd, BLOCK_N, D, D_PAD, False)
        sij = tl.dot(qi, tl.trans(kj), input_precision=PRECISION)
        acc, li, mi = _update(acc, li, mi, sij, v_head, 0, start_n, offs_m, S, stride_vn, stride_vd, qk_scale,
                              BLOCK_N, D, D_PAD, False, False, False, PRECISION)
    for i in tl.range(0, n_part):
        start_n = tl.multiple_of(tl.load(KV_IDX + row * TN + i) * BLOCK_N, BLOCK_N)
        offs_n = start_n + tl.arange(0, BLOCK_N)
        kj = _load_rows(k_head, 0, start_n, S, stride_kn, stride_kd, BLOCK_N, D, D_PAD, False)
        sij = tl.dot(qi, tl.trans(kj), input_precision=PRECISION)
        s2 = mask_scores(sij, mask_head, offs_m, offs_n, L, S, stride_mm, stride_mn, qk_scale, MASK_KIND, CAUSAL)
        vj = _load_rows(v_head, 0, start_n, S, stride_vn, stride_vd, BLOCK_N, D, D_PAD, False)
        acc, li, mi = _masked_step(acc, li, mi, s2, vj, PRECISION)

    _finish(acc, li, mi, O + b64 * stride_ob + h64 * stride_oh, LSE + b64 * stride_lb + h64 * stride_lh, offs_m,
            offs_m < L, stride_on, stride_od, D, D_PAD, STORE_LSE)
    if COUNT:
        slot = COUNTS + ((h64 * B + b64) * TM + blk) * 2
        tl.store(slot, n_full)
        tl.store(slot + 1, n_part)


JIT_KERNELS = (attn_fwd_window, attn_fwd_blocks, varlen_block_table)


# --- launches ------------------------------------------------------------------------------------------------

def block_table(cu: torch.Tensor, total: int, block: int, reverse: bool) -> torch.Tensor:
    """The (entries, 2) int32 block table of packed documents (:func:`varlen_block_table`): one entry per block the
    documents can take at most (``fast_options.document_blocks``), those past the last block marked -1."""
    n_docs = cu.numel() - 1
    entries = document_blocks(total, block, n_docs)
    table = torch.empty((max(entries, 1), 2), dtype=torch.int32, device=cu.device)
    docs = max(16, triton.next_power_of_2(n_docs))
    chunk = max(16, min(256, 8192 // docs))
    launch_cache.launch(varlen_block_table, (triton.cdiv(entries, chunk),), (cu, table, n_docs, entries),
                        dict(BLOCK=block, DOCS=docs, CHUNK=chunk, REVERSE=reverse))
    return table


def precision_of(dtype: torch.dtype) -> str:
    return "ieee" if dtype == torch.float32 else "tf32"  # tf32 is ignored for 16-bit inputs


def forward_window(q, k, v, o, lse, *, left: int, right: int, scale: float, tiles, cu_q=None, cu_k=None,
                   max_seqlen_q=None, bottom_right=False, counts=None) -> None:
    """Launch :func:`attn_fwd_window`. q, o (B, Hq, L, D), k, v (B, Hkv, S, D), lse (B, Hq, L): strided views
    (packed documents: (1, H, total, D) views of (total, H, D), with ``cu_q``/``cu_k`` their offsets); ``left``/
    ``right`` >= 0 (:data:`REACH` for unbounded); ``counts``: an int32 (Hq, B or documents, TM, 2) tensor of
    zeros to fill, or None."""
    (B, H, L, D), (Hkv, S) = q.shape, k.shape[1:3]
    bm, bn, warps, stages = tiles
    varlen = cu_q is not None
    if varlen:
        nb, tm = cu_q.numel() - 1, triton.cdiv(max_seqlen_q, bm)
        table = block_table(cu_q, L, bm, reverse=True)
        grid = (table.shape[0], H)
    else:
        nb, tm, table = B, triton.cdiv(L, bm), None
        grid = (B * tm, H)
    launch_cache.launch(
        attn_fwd_window, grid,
        (q, k, v, o, lse, counts, cu_q, cu_k, table, *q.stride(), *k.stride(), *v.stride(), *o.stride(),
         lse.stride(0), lse.stride(1), H, H // Hkv, nb, L, S, tm, left, right, scale * LOG2_E.value),
        dict(D=D, D_PAD=padded_head_dim(D), BLOCK_M=bm, BLOCK_N=bn, VARLEN=varlen, BOTTOM_RIGHT=bottom_right,
             PRECISION=precision_of(q.dtype), STORE_LSE=True, COUNT=counts is not None),
        num_warps=warps, num_stages=stages)


def mask_kind(mask: torch.Tensor) -> int:
    return 1 if mask.dtype == torch.bool else 2


def table_strides(kv_num: torch.Tensor) -> tuple[int, int]:
    """How far (in rows of TM) the tables' batch and head indices move: 0 along a broadcast dimension."""
    Bm, Hm = kv_num.shape[:2]
    return (Hm if Bm > 1 else 0), (1 if Hm > 1 else 0)


def forward_blocks(q, k, v, o, lse, mask, tables, *, causal: bool, scale: float, tiles, counts=None) -> None:
    """Launch :func:`attn_fwd_blocks`: ``mask`` a (B, Hq, L, S) view of the mask (zero strides where it
    broadcasts; booleans seen as bytes), ``tables`` the ``mask_blocks.BlockTables`` of its classification at
    these tiles (leading dimensions (Bm, Hm), 1 where the mask broadcasts)."""
    (B, H, L, D), (Hkv, S) = q.shape, k.shape[1:3]
    bm, bn, warps, stages = tiles
    assert (tables.block_m, tables.block_n) == (bm, bn), "tables classified at other tiles"
    tm, tn = triton.cdiv(L, bm), triton.cdiv(S, bn)
    elements = mask.view(torch.uint8) if mask.dtype == torch.bool else mask
    launch_cache.launch(
        attn_fwd_blocks, (tm, B * H),
        (q, k, v, o, lse, counts, elements, tables.kv_num_blocks, tables.kv_indices, tables.full_kv_num_blocks,
         tables.full_kv_indices, *q.stride(), *k.stride(), *v.stride(), *o.stride(), lse.stride(0), lse.stride(1),
         *mask.stride(), *table_strides(tables.kv_num_blocks), H, H // Hkv, B, L, S, tm, tn, scale * LOG2_E.value),
        dict(D=D, D_PAD=padded_head_dim(D), BLOCK_M=bm, BLOCK_N=bn, MASK_KIND=mask_kind(mask), CAUSAL=causal,
             PRECISION=precision_of(q.dtype), STORE_LSE=True, COUNT=counts is not None),
        num_warps=warps, num_stages=stages)
