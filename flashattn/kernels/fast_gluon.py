"""The Hopper path of ``fast`` (notebook 11): the same loop written in Gluon, so that the overlap is ours to schedule.

Triton decides by itself when a ``tl.dot`` waits for the tensor cores. Gluon, Triton's lower-level
language, lets the kernel say it: ``warpgroup_mma(..., is_async=True)`` issues a Hopper ``wgmma`` and
returns at once, ``warpgroup_mma_wait(n)`` waits until at most ``n`` of them are still running. That
is what FlashAttention-3's *intra-warpgroup overlap* needs. For key block j the loop (``_step``)

1. issues ``sij = qi · kjᵀ``                       (tensor cores)
2. issues ``acc += p(j-1) · v(j-1)`` for the block before   (tensor cores, queued behind 1)
3. waits for 1 only, and runs block j's softmax     (exp2 units, while 2 runs)
4. waits for 2, and rescales ``acc`` by block j's ``alpha``.

(``OVERLAP=False`` waits for each product as soon as it is issued: the same kernel without the overlap,
for the ablation.)

So the exponentials of one block overlap the second matrix product of the previous one. K and V tiles
arrive by TMA into rings of ``STAGES`` shared-memory slots (``k_ring``, ``v_ring``), each slot with an
mbarrier that says "landed"; a slot is handed back as soon as the product that reads it has finished.

Two ways to lay out a program, one loop (``_attend_tile``) for both:

* one warpgroup per program (``_one_warpgroup``): it issues its own TMA copies, and refills a slot itself;
* ``WARP_SPECIALIZE`` (FlashAttention-3's layout): one *producer* warp issues every TMA copy and
  ``CONSUMERS`` (2 or 3) *consumer* warpgroups, each with its own BLOCK_M rows of Q, run the loop on the
  same K/V rings, so a program covers CONSUMERS·BLOCK_M rows and every K/V tile loaded serves them all.
  The producer needs almost no registers; ``setmaxnreg`` hands them to the consumers (240 per thread for
  two, 160 for three). mbarriers pass the slots around: "ready" (the copy landed) and "empty" (every
  consumer is done with it). The programs loop over tiles, so the same kernel also runs *persistent*
  (``PERSISTENT``: one program per SM, the producer already loading the next tile's Q and K/V while the
  consumers finish the last one).

Same names and results as ``attn_kernel_fast``: the running max ``mi`` in scaled base-2 units, ``li``,
``acc`` normalized once at the end, the log-sum-exp on request. Hopper only (``wgmma`` is sm_90's
instruction), 16-bit inputs, D = 64 or 128, as many keys as queries and one K/V head per query head;
other problems use the Triton kernel.
"""

from __future__ import annotations

import torch
import triton

from . import device, launch_cache, triton_compat

if not triton_compat.HAS_GLUON:  # fast then runs its Triton kernel (fast_options.gluon_available)
    raise ImportError(f"Triton's Gluon is incomplete here: {triton_compat.MISSING}")

from . import descriptors  # noqa: E402
from .constants import LN_2, LOG2_E  # noqa: E402
from .fast_gluon_keys import _block_kind, _document, _kept_keys, _key_blocks, _key_mask, _m_tiles  # noqa: E402
from .fast_options import WS_MAXNREG, document_blocks  # noqa: E402
from .triton_compat import gl, gluon, mbarrier, tma_load, warpgroup_mma, warpgroup_mma_wait  # noqa: E402

DTYPES = {torch.float16: gl.float16, torch.bfloat16: gl.bfloat16}


@gluon.constexpr_function
def _mma_layout(num_warps, n):
    """The register layout of a wgmma result with ``n`` columns: the warps stacked along its rows."""
    return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, n, 16])


@gluon.jit
def _head(bh, N, H, D: gl.constexpr, HEADS_IN_COLUMNS: gl.constexpr):
    """Where head ``bh`` (= b·H + h) starts in the descriptors' matrix: (first row, first column). Contiguous inputs
    are one (B·H·N, D) matrix, the head's rows one after another; (B, N, H, D) memory is one (B·N, H·D) matrix,
    the head in columns h·D .. (``descriptors.heads_in_columns``)."""
    if HEADS_IN_COLUMNS:
        return (bh // H) * N, (bh % H) * D
    else:
        return bh * N, 0


@gluon.jit
def _load_tile(desc, bars, ring, slot, row, col, pred):
    """TMA: rows ``row .. row + block`` (from column ``col``) of ``desc`` into slot ``slot`` of ``ring``; its barrier
    counts the bytes."""
    bar = bars.index(slot)
    mbarrier.expect(bar, desc.block_type.nbytes, pred=pred)
    tma_load(desc, [row, col], bar, ring.index(slot), pred=pred)


@gluon.jit
def _softmax(sij, mi, li, start_n, m0, offs_m, N, qk_scale, left, kept,
             BLOCK_N: gl.constexpr, CAUSAL: gl.constexpr, WINDOW: gl.constexpr, KEY_MASK: gl.constexpr,
             s_layout: gl.constexpr):
    """Block j's online-softmax step: returns ``pij``, the new ``mi`` and ``li``, and ``alpha``. ``kept``: with
    KEY_MASK 1 the block's keys that take part (:func:`_kept_keys`), with 2 (whether it is partial, the mask)."""
    BLOCK_M: gl.constexpr = sij.shape[0]
    # only the causal diagonal, the ragged tail (N not a multiple of BLOCK_N) and, with a WINDOW, the blocks that
    # cross its left edge (query i sees keys i - left .. i) need a mask
    if ((start_n + BLOCK_N > N) or (CAUSAL and start_n + BLOCK_N > m0 + 1)
            or (WINDOW and start_n + left < m0 + BLOCK_M - 1)):
        offs_n = start_n + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
        keep = offs_n[None, :] < N
        if CAUSAL:
            keep = keep & (offs_n[None, :] <= offs_m[:, None])
        if WINDOW:
            keep = keep & (offs_n[None, :] + left >= offs_m[:, None])
        sij = gl.where(keep, sij, float("-inf"))
    if KEY_MASK == 1:
        sij = gl.where(kept[None, :], sij, float("-inf"))
    if KEY_MASK == 2:  # a full block's keys all take part: only a partial one reads its mask bytes
        partial, kmask = kept
        if partial:
            sij = gl.where(_kept_keys(kmask, start_n, N, BLOCK_N, s_layout)[None, :], sij, float("-inf"))
    mi_new = gl.maximum(mi, gl.max(sij, 1) * qk_scale)
    if WINDOW or KEY_MASK:  # a row may have seen no key yet (mi_new = -inf): keep it at 0, not -inf - -inf = NaN
        m_safe = gl.where(mi_new == float("-inf"), 0.0, mi_new)
    else:
        m_safe = mi_new
    pij = gl.exp2(sij * qk_scale - m_safe[:, None])
    alpha = gl.exp2(mi - m_safe)
    li = li * alpha + gl.sum(pij, 1)
    return pij, mi_new, li, alpha


@gluon.jit
def _free(which: gl.constexpr, ring, refill, frees, slot, j, n_blocks):
    """Block j's K tile (``which`` "k") or V tile ("v") has been read. A warpgroup that loads its own tiles
    (``refill``: K, V and the head's first key row) refills the slot with block j + STAGES; a consumer
    (``frees``) tells the producer, and after its last block also lets go of its Q tile (with K), so that the
    producer may load the next tile's."""
    k_ring, v_ring, k_ready, v_ready = ring
    tiles, ready = (k_ring, k_ready) if which == "k" else (v_ring, v_ready)
    STAGES: gl.constexpr = tiles.shape[0]
    BLOCK_N: gl.constexpr = tiles.shape[1]
    if refill is not None:
        K, V, kv_row0, col = refill
        _load_tile(K if which == "k" else V, ready, tiles, slot, kv_row0 + (j + STAGES) * BLOCK_N, col,
                   j + STAGES < n_blocks)
    else:
        k_empty, v_empty, q_empty = frees
        mbarrier.arrive((k_empty if which == "k" else v_empty).index(slot), count=1)
        if which == "k":
            mbarrier.arrive(q_empty, count=1, pred=j == n_blocks - 1)


@gluon.jit
def _step(j, c, n_blocks, qi, pij, acc, mi, li, ring, refill, frees, m0, offs_m, N, qk_scale, n0, left, kmask,
          CAUSAL: gl.constexpr, WINDOW: gl.constexpr, KEY_MASK: gl.constexpr, OVERLAP: gl.constexpr):
    """Key block j >= 1 of the tile's (keys from ``n0``), the c-th block through the rings: steps 1-4 of the module
    docstring. Returns the block's ``pij`` (for the next step's p · v), and ``acc``, ``mi``, ``li``."""
    k_ring, v_ring, k_ready, v_ready = ring
    STAGES: gl.constexpr = k_ring.shape[0]
    BLOCK_N: gl.constexpr = k_ring.shape[1]
    BLOCK_M: gl.constexpr = qi.shape[0]
    s_layout: gl.constexpr = _mma_layout(gl.num_warps(), BLOCK_N)
    p_layout: gl.constexpr = pij.type.layout
    s_init = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, layout=s_layout)  # ignored: use_acc=False
    slot = c % STAGES
    prev = (c - 1) % STAGES
    kept = _block_kind(kmask, n0 + j * BLOCK_N, N, BLOCK_N, KEY_MASK, s_layout)  # a key-padding mask's (masking.py)
    mbarrier.wait(k_ready.index(slot), (c // STAGES) & 1)  # kj landed (the phase flips each lap of the ring)
    sij = warpgroup_mma(qi, k_ring.index(slot).permute((1, 0)), s_init, use_acc=False, is_async=True)
    if not OVERLAP:  # for comparison: each product waited for at once, nothing runs beside the softmax
        sij = warpgroup_mma_wait(0, deps=[sij])
    mbarrier.wait(v_ready.index(prev), ((c - 1) // STAGES) & 1)
    pv = warpgroup_mma(pij, v_ring.index(prev), acc, is_async=True)  # the previous block's p · v
    if not OVERLAP:
        pv, pij = warpgroup_mma_wait(0, deps=[pv, pij])
    sij = warpgroup_mma_wait(1, deps=[sij])  # scores done; p · v may still run
    _free("k", ring, refill, frees, slot, j, n_blocks)
    p_next, mi, li, alpha = _softmax(sij, mi, li, n0 + j * BLOCK_N, m0, offs_m, N, qk_scale, left, kept, BLOCK_N,
                                     CAUSAL, WINDOW, KEY_MASK, s_layout)
    acc, pij = warpgroup_mma_wait(0, deps=[pv, pij])  # pij's registers stay live until p · v is done
    if refill is None:  # a consumer hands the V slot back to the producer at once
        _free("v", ring, refill, frees, prev, j - 1, n_blocks)
    acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, acc.type.layout))[:, None]
    if refill is not None:  # a lone warpgroup issues its own copy after the rescale (the order it was measured in)
        _free("v", ring, refill, frees, prev, j - 1, n_blocks)
    return gl.convert_layout(p_next.to(k_ring.dtype), p_layout), acc, mi, li


@gluon.jit
def _attend_tile(qi, ring, refill, frees, c0, n_blocks, m0, N, qk_scale, n0, left, kmask,
                 CAUSAL: gl.constexpr, WINDOW: gl.constexpr, KEY_MASK: gl.constexpr, OVERLAP: gl.constexpr):
    """One warpgroup's rows ``m0 .. m0 + BLOCK_M`` (Q in ``qi``, landed) against ``n_blocks`` key blocks from key
    ``n0`` on, block j in slot (c0 + j) % STAGES of the rings. Returns ``acc`` (not yet normalized), ``li`` and
    ``mi``."""
    k_ring, v_ring, k_ready, v_ready = ring
    STAGES: gl.constexpr = k_ring.shape[0]
    BLOCK_N: gl.constexpr = k_ring.shape[1]
    BLOCK_M: gl.constexpr = qi.shape[0]
    D: gl.constexpr = qi.shape[1]
    # Register layouts of the two products' results (wgmma's accumulator layout), and pij's layout as
    # wgmma's left operand straight from registers.
    s_layout: gl.constexpr = _mma_layout(gl.num_warps(), BLOCK_N)
    o_layout: gl.constexpr = _mma_layout(gl.num_warps(), D)
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    row_s: gl.constexpr = gl.SliceLayout(1, s_layout)

    offs_m = m0 + gl.arange(0, BLOCK_M, layout=row_s)
    mi = gl.full([BLOCK_M], float("-inf"), gl.float32, layout=row_s)
    li = gl.full([BLOCK_M], 0.0, gl.float32, layout=row_s)
    acc = gl.zeros([BLOCK_M, D], gl.float32, layout=o_layout)
    s_init = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, layout=s_layout)  # ignored: use_acc=False

    # block 0: scores and softmax, nothing to overlap with yet
    kept = _block_kind(kmask, n0, N, BLOCK_N, KEY_MASK, s_layout)
    slot = c0 % STAGES
    mbarrier.wait(k_ready.index(slot), (c0 // STAGES) & 1)
    sij = warpgroup_mma(qi, k_ring.index(slot).permute((1, 0)), s_init, use_acc=False, is_async=True)
    sij = warpgroup_mma_wait(0, deps=[sij])
    _free("k", ring, refill, frees, slot, 0, n_blocks)
    pij, mi, li, alpha = _softmax(sij, mi, li, n0, m0, offs_m, N, qk_scale, left, kept, BLOCK_N, CAUSAL, WINDOW,
                                  KEY_MASK, s_layout)
    pij = gl.convert_layout(pij.to(k_ring.dtype), p_layout)

    for j in range(1, n_blocks):
        pij, acc, mi, li = _step(j, c0 + j, n_blocks, qi, pij, acc, mi, li, ring, refill, frees, m0, offs_m, N,
                                 qk_scale, n0, left, kmask, CAUSAL, WINDOW, KEY_MASK, OVERLAP)

    # the last block's p · v
    c = c0 + n_blocks - 1
    mbarrier.wait(v_ready.index(c % STAGES), (c // STAGES) & 1)
    acc = warpgroup_mma(pij, v_ring.index(c % STAGES), acc, is_async=True)
    acc = warpgroup_mma_wait(0, deps=[acc])
    if refill is None:  # a consumer hands the last V slot back (a lone warpgroup has nothing left to load)
        _free("v", ring, refill, frees, c % STAGES, n_blocks - 1, n_blocks)
    return acc, li, mi


@gluon.jit
def _store(acc, li, mi, O, LSE, o_head, lse_head, stride_on, m0, N, STORE_LSE: gl.constexpr, EMPTY: gl.constexpr):
    """Normalize once and store rows ``m0 ..`` (below N) of the sequence that starts at ``O + o_head`` and
    ``LSE + lse_head`` (through a row-major layout: 8 contiguous values per thread). EMPTY: a row may have kept no
    key (a key-padding mask); it stores 0 and the log-sum-exp +inf, as the Triton masked kernels do
    (``masked._finish``), which the masked backward reads."""
    BLOCK_M: gl.constexpr = acc.shape[0]
    D: gl.constexpr = acc.shape[1]
    if EMPTY:
        seen = (li > 0) | (li != li)  # (a NaN sum, from a NaN input, stays NaN)
        li = gl.where(seen, li, 1.0)
    out = (acc / gl.convert_layout(li, gl.SliceLayout(1, acc.type.layout))[:, None]).to(O.dtype.element_ty)
    out_layout: gl.constexpr = gl.BlockedLayout([1, 8], [256 // D, D // 8], [gl.num_warps(), 1], [1, 0])
    out = gl.convert_layout(out, out_layout)
    offs_mo = m0 + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, out_layout))
    offs_d = gl.arange(0, D, layout=gl.SliceLayout(0, out_layout))
    o_ptrs = O + o_head + offs_mo.to(gl.int64)[:, None] * stride_on + offs_d[None, :]
    gl.store(o_ptrs, out, mask=offs_mo[:, None] < N)
    if STORE_LSE:  # natural log: mi and log2(li) are in base 2
        offs_m = m0 + gl.arange(0, BLOCK_M, layout=mi.type.layout)
        lse = (mi + gl.log2(li)) * LN_2
        if EMPTY:
            lse = gl.where(seen, lse, float("inf"))
        gl.store(LSE + lse_head + offs_m, lse, mask=offs_m < N)


@gluon.jit
def _o_head(bh, H, stride_ob, stride_oh, stride_on, q0, DOCS: gl.constexpr):
    """The offset of head ``bh``'s first output row in O (any strides: O is a pointer); with DOCS, of its row q0."""
    head = (bh // H).to(gl.int64) * stride_ob + (bh % H).to(gl.int64) * stride_oh
    if DOCS:
        head += q0.to(gl.int64) * stride_on
    return head


@gluon.jit
def _one_warpgroup(Q, K, V, O, LSE, N, H, stride_ob, stride_oh, stride_on, qk_scale,
                   left, KMASK, KV_END, stride_kmb, stride_kmn, D: gl.constexpr, BLOCK_M: gl.constexpr,
                   BLOCK_N: gl.constexpr, STAGES: gl.constexpr, CAUSAL: gl.constexpr, WINDOW: gl.constexpr,
                   KEY_MASK: gl.constexpr, STORE_LSE: gl.constexpr, OVERLAP: gl.constexpr,
                   HEADS_IN_COLUMNS: gl.constexpr):
    """The loop in one warpgroup per program (num_warps = 4), or 2 with 8 warps: each issues its own loads."""
    dtype: gl.constexpr = Q.dtype
    pid_m = gl.program_id(0)
    pid_bh = gl.program_id(1)
    if CAUSAL:  # the heaviest Q blocks (the last rows) first
        pid_m = gl.num_programs(0) - 1 - pid_m
    m0 = pid_m * BLOCK_M
    row0, col = _head(pid_bh, N, H, D, HEADS_IN_COLUMNS)

    qi = gl.allocate_shared_memory(dtype, [BLOCK_M, D], Q.layout)
    k_ring = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, D], K.layout)
    v_ring = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, D], V.layout)
    q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    k_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    mbarrier.init(q_bar, count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(k_ready.index(i), count=1)
        mbarrier.init(v_ready.index(i), count=1)

    kmask, kv_end = _key_mask(KMASK, KV_END, stride_kmb, stride_kmn, pid_bh, H, N, BLOCK_N, KEY_MASK)
    n0, n_blocks = _key_blocks(m0, N, left, kv_end, BLOCK_M, BLOCK_N, CAUSAL, WINDOW, KEY_MASK)

    mbarrier.expect(q_bar, Q.block_type.nbytes)
    tma_load(Q, [row0 + m0, col], q_bar, qi)
    for i in gl.static_range(STAGES):  # fill the rings; each slot is refilled as soon as it has been read
        _load_tile(K, k_ready, k_ring, i, row0 + n0 + i * BLOCK_N, col, i < n_blocks)
        _load_tile(V, v_ready, v_ring, i, row0 + n0 + i * BLOCK_N, col, i < n_blocks)

    mbarrier.wait(q_bar, 0)
    acc, li, mi = _attend_tile(qi, (k_ring, v_ring, k_ready, v_ready), (K, V, row0 + n0, col), None, 0, n_blocks, m0,
                               N, qk_scale, n0, left, kmask, CAUSAL, WINDOW, KEY_MASK, OVERLAP)

    mbarrier.invalidate(q_bar)
    for i in gl.static_range(STAGES):
        mbarrier.invalidate(k_ready.index(i))
        mbarrier.invalidate(v_ready.index(i))

    _store(acc, li, mi, O, LSE, _o_head(pid_bh, H, stride_ob, stride_oh, stride_on, 0, False),
           pid_bh.to(gl.int64) * N, stride_on, m0, N, STORE_LSE, KEY_MASK)


@gluon.jit
def _tile(t, n_m, CAUSAL: gl.constexpr):
    """Tile ``t`` -> (Q block, batch·head). Consecutive tiles share a head (its K/V stay in L2); causal
    tiles of a head go heaviest (last rows) first."""
    if CAUSAL:
        return n_m - 1 - t % n_m, t // n_m
    else:
        return t % n_m, t // n_m


@gluon.jit
def _producer(io, smem, bars, CAUSAL: gl.constexpr, WINDOW: gl.constexpr, KEY_MASK: gl.constexpr,
              DOCS: gl.constexpr, HEADS_IN_COLUMNS: gl.constexpr):
    """One warp: every TMA copy. It refills a slot as soon as every consumer has released it.

    ``io``: the descriptors Q, K, V, the outputs O and LSE, N, B·H, H, O's strides and the scale; ``smem``: the
    consumers' Q tiles and the K/V rings; ``bars``: their ready/empty barriers (see ``attn_kernel_gluon``)."""
    (Q, K, V, O, LSE, N, BH, H, stride_ob, stride_oh, stride_on, qk_scale, left, KMASK, KV_END, stride_kmb, stride_kmn,
     CU, TABLE, n_docs) = io
    q_tiles, k_ring, v_ring = smem
    q_ready, q_empty, k_ready, v_ready, k_empty, v_empty = bars
    CONSUMERS: gl.constexpr = q_tiles.shape[0]
    BLOCK_M: gl.constexpr = q_tiles.shape[1]
    D: gl.constexpr = q_tiles.shape[2]
    STAGES: gl.constexpr = k_ring.shape[0]
    BLOCK_N: gl.constexpr = k_ring.shape[1]
    n_m = _m_tiles(N, n_docs, CONSUMERS * BLOCK_M, DOCS)
    it = 0  # tiles done by this program
    cnt = 0  # K/V blocks loaded by this program: the ring slot and its lap
    for t in range(gl.program_id(0), n_m * BH, gl.num_programs(0)):
        tm, bh = _tile(t, n_m, CAUSAL)
        q0, n, _, tm = _document(CU, TABLE, tm, N, DOCS)
        row0, col = _head(bh, N, H, D, HEADS_IN_COLUMNS)
        row0 = row0 + q0
        m0 = tm * CONSUMERS * BLOCK_M
        for c in gl.static_range(CONSUMERS):  # each consumer's Q tile, once it has let go of the last one
            mbarrier.wait(q_empty.index(c), (it & 1) ^ 1)  # (a fresh barrier passes a wait on parity 1)
            mbarrier.expect(q_ready.index(c), Q.block_type.nbytes)
            tma_load(Q, [row0 + m0 + c * BLOCK_M, col], q_ready.index(c), q_tiles.index(c))
        _, kv_end = _key_mask(KMASK, KV_END, stride_kmb, stride_kmn, bh, H, N, BLOCK_N, KEY_MASK)
        n0, n_blocks = _key_blocks(m0, n, left, kv_end, CONSUMERS * BLOCK_M, BLOCK_N, CAUSAL, WINDOW, KEY_MASK)
        for j in range(n_blocks):
            slot = cnt % STAGES
            lap = (cnt // STAGES) & 1
            mbarrier.wait(k_empty.index(slot), lap ^ 1)
            mbarrier.expect(k_ready.index(slot), K.block_type.nbytes)
            tma_load(K, [row0 + n0 + j * BLOCK_N, col], k_ready.index(slot), k_ring.index(slot))
            mbarrier.wait(v_empty.index(slot), lap ^ 1)
            mbarrier.expect(v_ready.index(slot), V.block_type.nbytes)
            tma_load(V, [row0 + n0 + j * BLOCK_N, col], v_ready.index(slot), v_ring.index(slot))
            cnt += 1
        it += 1


@gluon.jit
def _consumer(io, smem, bars, WG: gl.constexpr, CAUSAL: gl.constexpr, WINDOW: gl.constexpr, KEY_MASK: gl.constexpr,
              DOCS: gl.constexpr, STORE_LSE: gl.constexpr, OVERLAP: gl.constexpr):
    """Warpgroup ``WG``: rows ``WG·BLOCK_M ..`` of each tile, the loop of ``_attend_tile`` on the producer's
    rings (``io``, ``smem``, ``bars`` as for ``_producer``)."""
    (Q, K, V, O, LSE, N, BH, H, stride_ob, stride_oh, stride_on, qk_scale, left, KMASK, KV_END, stride_kmb, stride_kmn,
     CU, TABLE, n_docs) = io
    q_tiles, k_ring, v_ring = smem
    q_ready, q_empty, k_ready, v_ready, k_empty, v_empty = bars
    CONSUMERS: gl.constexpr = q_tiles.shape[0]
    BLOCK_M: gl.constexpr = q_tiles.shape[1]
    BLOCK_N: gl.constexpr = k_ring.shape[1]
    qi = q_tiles.index(WG)
    n_m = _m_tiles(N, n_docs, CONSUMERS * BLOCK_M, DOCS)
    it = 0
    cnt = 0
    for t in range(gl.program_id(0), n_m * BH, gl.num_programs(0)):
        tm, bh = _tile(t, n_m, CAUSAL)
        q0, n, n_store, tm = _document(CU, TABLE, tm, N, DOCS)
        m0 = (tm * CONSUMERS + WG) * BLOCK_M
        # the producer's blocks (every consumer reads each of them)
        kmask, kv_end = _key_mask(KMASK, KV_END, stride_kmb, stride_kmn, bh, H, N, BLOCK_N, KEY_MASK)
        n0, n_blocks = _key_blocks(tm * CONSUMERS * BLOCK_M, n, left, kv_end, CONSUMERS * BLOCK_M, BLOCK_N, CAUSAL,
                                   WINDOW, KEY_MASK)
        mbarrier.wait(q_ready.index(WG), it & 1)
        acc, li, mi = _attend_tile(qi, (k_ring, v_ring, k_ready, v_ready), None,
                                   (k_empty, v_empty, q_empty.index(WG)), cnt, n_blocks, m0, n, qk_scale, n0, left,
                                   kmask, CAUSAL, WINDOW, KEY_MASK, OVERLAP)
        _store(acc, li, mi, O, LSE, _o_head(bh, H, stride_ob, stride_oh, stride_on, q0, DOCS),
               bh.to(gl.int64) * N + q0, stride_on, m0, n_store, STORE_LSE, KEY_MASK)
        cnt += n_blocks
        it += 1


@gluon.jit
def attn_kernel_gluon(Q, K, V, O, LSE, N, BH, H, stride_ob, stride_oh, stride_on, qk_scale, left,
                      KMASK, KV_END, stride_kmb, stride_kmn, CU, TABLE, n_docs,
                      D: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
                      CAUSAL: gl.constexpr, WINDOW: gl.constexpr, KEY_MASK: gl.constexpr, DOCS: gl.constexpr,
                      STORE_LSE: gl.constexpr,
                      OVERLAP: gl.constexpr, WARP_SPECIALIZE: gl.constexpr, PERSISTENT: gl.constexpr,
                      CONSUMERS: gl.constexpr, HEADS_IN_COLUMNS: gl.constexpr):
    """Without WARP_SPECIALIZE: a (Q block, batch·head) grid, one warpgroup per program (``_one_warpgroup``).
    With it: a producer warp and CONSUMERS (2 or 3) consumer warpgroups per program, over a 1-D grid of tiles
    of CONSUMERS·BLOCK_M rows; PERSISTENT only changes that grid (one program per SM instead of one per tile:
    see :func:`grid`). HEADS_IN_COLUMNS: how the descriptors lay out the heads (:func:`_head`); O is written through
    its strides (the last one 1). WINDOW (with CAUSAL): query i sees keys i - left .. i only, and the key blocks
    before its window are not loaded (masked attention's sliding window, ``masking.py``). KEY_MASK: batch b's keys
    take part where the key-padding mask ``KMASK`` (bytes; batch b's row at ``b·stride_kmb``, key n at
    ``n·stride_kmn``) is nonzero, and the blocks past its last kept key + 1 (``KV_END``: :func:`_key_mask`) are not
    loaded; KEY_MASK 1 reads every block's mask bytes, 2 only those of the blocks KV_END flags partial. A row that
    keeps no key stores 0 and the log-sum-exp +inf (``masking.py``'s padding masks). DOCS (warp-specialized only):
    B = 1 and the N rows are packed documents, document d at rows CU[d] .. CU[d + 1] (``n_docs`` of them), each
    attended as a sequence of its own; TABLE lists each tile's (document, Q block) (``fast_gluon_keys._document``)."""
    if not WARP_SPECIALIZE:
        _one_warpgroup(Q, K, V, O, LSE, N, H, stride_ob, stride_oh, stride_on, qk_scale, left, KMASK, KV_END,
                       stride_kmb, stride_kmn, D, BLOCK_M, BLOCK_N, STAGES, CAUSAL, WINDOW, KEY_MASK, STORE_LSE,
                       OVERLAP, HEADS_IN_COLUMNS)
    else:
        dtype: gl.constexpr = Q.dtype
        q_tiles = gl.allocate_shared_memory(dtype, [CONSUMERS, BLOCK_M, D], Q.layout)
        k_ring = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, D], K.layout)
        v_ring = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, D], V.layout)
        q_ready = gl.allocate_shared_memory(gl.int64, [CONSUMERS, 1], mbarrier.MBarrierLayout())
        q_empty = gl.allocate_shared_memory(gl.int64, [CONSUMERS, 1], mbarrier.MBarrierLayout())
        k_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        v_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        k_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        v_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        for c in gl.static_range(CONSUMERS):
            mbarrier.init(q_ready.index(c), count=1)
            mbarrier.init(q_empty.index(c), count=1)
        for i in gl.static_range(STAGES):
            mbarrier.init(k_ready.index(i), count=1)
            mbarrier.init(v_ready.index(i), count=1)
            mbarrier.init(k_empty.index(i), count=CONSUMERS)  # every consumer releases a slot
            mbarrier.init(v_empty.index(i), count=CONSUMERS)
        # The partitions' arguments, grouped (runtime values only: a tuple assigned to a name would turn
        # constexprs into tensors, so those are passed one by one below).
        io = (Q, K, V, O, LSE, N, BH, H, stride_ob, stride_oh, stride_on, qk_scale, left, KMASK, KV_END, stride_kmb,
              stride_kmn, CU, TABLE, n_docs)
        smem = (q_tiles, k_ring, v_ring)
        bars = (q_ready, q_empty, k_ready, v_ready, k_empty, v_empty)
        # The partitions: consumer 0 (the default partition: this program's own 4 warps), the other consumers
        # (4 warps each) and the producer (1 warp). The registers of a thread, within the launch's cap
        # (fast_options.WS_MAXNREG), go to the consumers: 240 each for two (3 warpgroups x 128 threads x 168 =
        # the SM's 65536 at launch), 160 each for three (4 warpgroups x 128 x 128); the producer keeps 24.
        CONSUMER_REGS: gl.constexpr = 240 if CONSUMERS == 2 else 160
        gl.warp_specialize(
            [(_consumer, (io, smem, bars, role, CAUSAL, WINDOW, KEY_MASK, DOCS, STORE_LSE, OVERLAP))
             if role < CONSUMERS else (_producer, (io, smem, bars, CAUSAL, WINDOW, KEY_MASK, DOCS, HEADS_IN_COLUMNS))
             for role in (0, 1, 2, 3)[:CONSUMERS + 1]],  # roles 0 .. CONSUMERS - 1 consume, the last produces
            [4] * (CONSUMERS - 1) + [1],  # warps of each partition after the default one
            [CONSUMER_REGS] * (CONSUMERS - 1) + [24])


def grid(N: int, BH: int, opts, docs: int | None = None) -> tuple:
    """Single warpgroups: a (Q block, batch·head) grid. Specialized: one program per tile of consumers·block_m
    rows (1-D; ``docs`` packed documents: per head, the block table's entries). Persistent: at most one program per
    SM, each looping over tiles."""
    if opts.schedule == "single":
        return (triton.cdiv(N, opts.block_m), BH)
    rows = opts.consumers * opts.block_m
    tiles = (triton.cdiv(N, rows) if docs is None else document_blocks(N, rows, docs)) * BH
    if opts.schedule == "specialized":
        return (tiles,)
    return (min(tiles, device.sm_count()),)


def bind(q, k, v, o, lse, causal: bool, scale: float, return_lse: bool, opts, left: int = -1, key_mask=None,
         docs: int | None = None):
    """:func:`launch`'s work done once for a problem: a function ``run(q, k, v, o, lse)`` for tensors with these
    shapes, strides, dtypes, devices and alignment (``fast.py`` keys its prepared problems so), which makes the
    descriptors from templates and calls the compiled kernel directly (``launch_cache.bind``). ``left`` >= 0 (with
    ``causal``): a sliding window, query i seeing keys i - left .. i. ``key_mask``: a key-padding mask, as
    ``(kmask, kv_end)``: a (B, S) uint8 view (nonzero: the key takes part) and each batch's last kept key + 1, int32
    (B,), or (B, 1 + S / block_n) with each block's flag after it (:func:`_key_mask`); then ``run(q, k, v, o, lse,
    kmask, kv_end)`` takes the call's own, with the strides of these. ``docs``: the N rows (B = 1) are that many
    packed documents; then ``run(q, k, v, o, lse, cu, table)`` takes their int32 offsets (docs + 1,) and block table
    (``masked.block_table`` with the program's rows, not reversed), on a warp-specialized schedule only."""
    B, H, N, D = q.shape
    window = left >= 0
    if window and not causal:
        raise ValueError("fast_gluon: a window (left >= 0) is causal here (query i sees keys i - left .. i)")
    if docs is not None and (B != 1 or window or key_mask is not None or opts.schedule == "single" or docs < 1):
        raise ValueError("fast_gluon: packed documents take B = 1, no window and no key mask, on a warp-specialized "
                         f"schedule (got B = {B}, left = {left}, schedule {opts.schedule!r}, {docs} documents)")
    if key_mask is not None:
        kmask, kv_end = key_mask
        mode = 2 if kv_end.dim() == 2 else 1
        ends = (B,) if mode == 1 else (B, 1 + triton.cdiv(N, opts.block_n))
        if window or kmask.shape != (B, N) or kmask.dtype != torch.uint8 or kv_end.shape != ends \
                or kv_end.dtype != torch.int32 or not kv_end.is_contiguous():
            raise ValueError("fast_gluon: a key mask is a (B, S) uint8 view and contiguous int32 ends, (B,) or "
                             "(B, 1 + S / block_n) with the block flags, without a window")
        mask_strides = tuple(kmask.stride())
    if B * H * N >= 2**31:
        raise ValueError(f"fast: the Gluon kernel addresses rows with 32-bit coordinates; B·H·N = {B * H * N} is too large")
    in_columns = descriptors.heads_in_columns(q, k, v)
    if in_columns is None or o.stride(3) != 1:
        raise ValueError("fast_gluon.launch: q, k and v must be contiguous or (B, N, H, D) views alike, 16-byte "
                         "aligned (fast.launch copies them), and o's last stride 1")
    ws = opts.schedule != "single"
    templates = (descriptors.gluon_heads(q, opts.block_m, in_columns),
                 descriptors.gluon_heads(k, opts.block_n, in_columns),
                 descriptors.gluon_heads(v, opts.block_n, in_columns))
    kernel = launch_cache.bind(
        attn_kernel_gluon, grid(N, B * H, opts, docs),
        dict(D=D, BLOCK_M=opts.block_m, BLOCK_N=opts.block_n, STAGES=opts.num_stages, CAUSAL=causal, WINDOW=window,
             KEY_MASK=0 if key_mask is None else mode, DOCS=docs is not None, STORE_LSE=return_lse,
             OVERLAP=opts.overlap, WARP_SPECIALIZE=ws, PERSISTENT=opts.schedule == "persistent",
             CONSUMERS=opts.consumers if ws else 2, HEADS_IN_COLUMNS=in_columns),
        num_warps=opts.num_warps, **({"maxnreg": WS_MAXNREG[opts.consumers]} if ws else {}))
    tail = (N, B * H, H, o.stride(0), o.stride(1), o.stride(2), scale * LOG2_E.value, max(left, 0))
    tq, tk, tv = (descriptors.rebase(t, None) for t in templates)  # kept without the first call's tensors
    rebase = descriptors.rebase
    if docs is not None:
        def run(q, k, v, o, lse, cu, table):
            kernel(rebase(tq, q), rebase(tk, k), rebase(tv, v), o, lse, *tail, lse, lse, 0, 0, cu, table, docs)
    elif key_mask is None:
        def run(q, k, v, o, lse):  # (no mask, no documents: those arguments unused)
            kernel(rebase(tq, q), rebase(tk, k), rebase(tv, v), o, lse, *tail, lse, lse, 0, 0, lse, lse, 0)
    else:
        def run(q, k, v, o, lse, kmask, kv_end):
            kernel(rebase(tq, q), rebase(tk, k), rebase(tv, v), o, lse, *tail, kmask, kv_end, *mask_strides, lse, lse,
                   0)

    return run


def launch(q, k, v, o, lse, causal: bool, scale: float, return_lse: bool, opts, left: int = -1) -> None:
    """Run :func:`attn_kernel_gluon` with ``opts`` (``fast_options.FastOptions``) on (B, H, N, D) inputs that
    ``descriptors.heads_in_columns`` reads in place (``fast.launch`` copies the others); ``o`` any (B, H, N, D) with
    its last stride 1; ``left`` as for :func:`bind`."""
    bind(q, k, v, o, lse, causal, scale, return_lse, opts, left)(q, k, v, o, lse)
