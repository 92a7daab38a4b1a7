"""The Hopper path of the fast backward (notebook 12): dK, dV and dQ in one warp-specialized Gluon kernel.

``fast_backward.py`` runs FlashAttention-2's backward as Triton kernels: one program per K/V block, its
loop over Q blocks scheduled by the compiler. This kernel is the same loop laid out the way
FlashAttention-3 lays out its backward on Hopper (``fast_gluon.py`` does it for the forward):

* one program per tile of BLOCK_N = 128 keys of one head; a **producer** warp issues every TMA copy: the
  tile's K and V once, then Q and dO blocks (BLOCK_M = 64 rows), with their rows of lse and delta, into a ring
  of STAGES slots (4 at D = 64, 2 at D = 128: what fits in shared memory);
* two **consumer** warpgroups, warpgroup w owning keys 64w .. 64w + 63 of the tile (their dK and dV
  accumulators, 64 × D float32 each), run for every Q block the transposed tiles of ``fast_backward.py``::

      sijT = kj · qiᵀ,  dpijT = vj · doiᵀ           (both issued at once, asynchronously)
      pijT = exp2(sijT · qk_scale − lse_i)          (while dpijT is still on the tensor cores)
      dsijT = pijT ∘ (dpijT − delta_i)
      dvj += pijT · doi,  dkj += dsijT · qi         (pijT and dsijT straight from registers)

* dQ without a second kernel: each warpgroup writes its half of dsijT into a shared (128 × 64) tile, and the
  warpgroups take turns, one Q block each, computing ``dqi = dsij · kj`` over all 128 keys. The warpgroup
  writes dqi into its own float32 tile in shared memory and the TMA engine adds the tile into a float32
  buffer in global memory (a bulk reduce-add, ``triton_compat.tma_reduce_add``), while the warpgroup goes on to the next
  block; ``fast_backward.finish_dq`` then scales the buffer and rounds it to 16 bits in one small kernel.
  Five matrix products per Q block and key tile, the convention's, where the Triton kernels' default does
  seven; the sum into dQ runs in whatever order the adds arrive, so dQ can differ from run to run in the
  last bits.

An earlier version added dQ with ``gl.atomic_add`` from registers (64 reductions per thread and Q block) and
loaded lse and delta with ``gl.load``: ncu's stall sampling found the warpgroups waiting on global memory
there, and handing both to the TMA engine is what brought this kernel to cuDNN's speed (notebook 12 reads
the recorded ratios).

mbarriers pass the shared tiles around: ``qdo_ready``/``qdo_empty`` for the ring slots (both warpgroups give
a slot back), ``ds_ready``/``ds_empty`` for two dsijT tiles (both halves written; read by the warpgroup
whose turn it is). ``setmaxnreg`` gives the consumers 240 registers per thread, the producer 24. Each warpgroup's
``tma.store_wait(0)`` before it writes its dQ tile again waits for its own add, issued two blocks earlier.

Hopper only (``wgmma``), 16-bit inputs, D = 64 or 128, as many keys as queries, one K/V head per query head,
N a multiple of 128; ``fast_backward.attention_backward_fast`` runs the Triton kernels everywhere else. With DOCS
(masked attention's packed documents, ``masking_gluon.documents_backward``) each document of any length is a
sequence of its own: a program per (document, key tile) from a block table, the document's ragged end masked.
"""

from __future__ import annotations

import torch

from . import launch_cache, triton_compat

if not triton_compat.HAS_GLUON_BACKWARD:  # the fast backward then runs its Triton kernels
    raise ImportError(f"Triton's Gluon lacks what this kernel needs: {triton_compat.MISSING}")

from . import descriptors  # noqa: E402
from .constants import LOG2_E  # noqa: E402
from .fast_gluon import DTYPES, _head, _mma_layout  # noqa: E402
from .fast_gluon_keys import _document  # noqa: E402
from .fast_options import document_blocks  # noqa: E402
from .triton_compat import (  # noqa: E402
    fence_async_shared,
    gl,
    gluon,
    mbarrier,
    tma,
    tma_load,
    tma_reduce_add,
    warpgroup_mma,
    warpgroup_mma_wait,
)

BLOCK_M: gl.constexpr = gl.constexpr(64)  # Q rows per step
BLOCK_N: gl.constexpr = gl.constexpr(128)  # keys per program: 64 per consumer warpgroup
# Q/dO ring slots per head dimension: the deepest ring that fits in 227 KB of shared memory beside K, V, two dSᵀ
# tiles and the two float32 dQ tiles (at D = 128 that is 2; at D = 64, 4 beat 3 on the H200:
# tools/gpu/backward/gluon_probe.py)
STAGES = {64: 4, 128: 2}
HEAD_DIMS = tuple(STAGES)
MAXNREG = 168  # at launch: 3 warpgroups' worth of the register file; setmaxnreg moves them to the consumers


@gluon.jit
def _q_blocks(n, lo, DOCS: gl.constexpr):
    """How many Q blocks of BLOCK_M rows the loop goes through, from row ``lo`` to the sequence's end ``n``: a
    multiple of BLOCK_N rows (:func:`applies`), or with DOCS a document of any length, its last block ragged."""
    if DOCS:
        return gl.cdiv(n - lo, BLOCK_M)
    else:
        return (n - lo) // BLOCK_M


@gluon.jit
def _producer(Q, K, V, DO, LSE, DELTA, N, H, CU, TABLE, k_tile, v_tile, q_ring, do_ring, lse_ring, delta_ring,
              kv_ready, qdo_ready, qdo_empty, CAUSAL: gl.constexpr, DOCS: gl.constexpr, HEADS_IN_COLUMNS: gl.constexpr):
    q0, _, n, blk = _document(CU, TABLE, gl.program_id(0), N, DOCS)  # DOCS: a document's key block (n = 0: none)
    start_n = blk * BLOCK_N
    bh = gl.program_id(1)
    D: gl.constexpr = k_tile.shape[1]
    row0, col = _head(bh, N, H, D, HEADS_IN_COLUMNS)  # the head in the descriptors' matrices (fast_gluon._head)
    row0 = row0 + q0
    lo = start_n if CAUSAL else 0  # query m sees key n iff n <= m: earlier Q blocks see none of this tile
    STAGES: gl.constexpr = q_ring.shape[0]
    mbarrier.expect(kv_ready, K.block_type.nbytes + V.block_type.nbytes)
    tma_load(K, [row0 + start_n, col], kv_ready, k_tile)
    tma_load(V, [row0 + start_n, col], kv_ready, v_tile)
    for i in range(_q_blocks(n, lo, DOCS)):
        s = i % STAGES
        start_m = lo + i * BLOCK_M
        mbarrier.wait(qdo_empty.index(s), ((i // STAGES) & 1) ^ 1)  # a fresh barrier passes a wait on parity 1
        bar = qdo_ready.index(s)
        if DOCS:  # the consumers load lse and delta: a document's rows need not start on a 16-byte boundary
            mbarrier.expect(bar, Q.block_type.nbytes + DO.block_type.nbytes)
        else:
            mbarrier.expect(bar, Q.block_type.nbytes + DO.block_type.nbytes + 2 * LSE.block_type.nbytes)
        tma_load(Q, [row0 + start_m, col], bar, q_ring.index(s))
        tma_load(DO, [row0 + start_m, col], bar, do_ring.index(s))
        if not DOCS:  # the block's rows of lse and delta ride along (a 1-D TMA load needs a 16-byte-aligned start)
            tma_load(LSE, [bh * N + start_m], bar, lse_ring.index(s))
            tma_load(DELTA, [bh * N + start_m], bar, delta_ring.index(s))


@gluon.jit
def _consumer(io, tiles, bars, WG: gl.constexpr, CAUSAL: gl.constexpr, DOCS: gl.constexpr,
              HEADS_IN_COLUMNS: gl.constexpr):
    DQ_ACC, DK, DV, N, H, stride_kb, stride_kh, stride_kn, qk_scale, scale, CU, TABLE, LSE_ROWS, DELTA_ROWS = io
    k_tile, v_tile, q_ring, do_ring, lse_ring, delta_ring, ds_tiles, dq_tiles = tiles
    kv_ready, qdo_ready, qdo_empty, ds_ready, ds_empty = bars
    D: gl.constexpr = k_tile.shape[1]
    STAGES: gl.constexpr = q_ring.shape[0]
    HALF: gl.constexpr = BLOCK_N // 2
    dtype: gl.constexpr = k_tile.dtype
    s_layout: gl.constexpr = _mma_layout(4, BLOCK_M)  # sijT, dpijT: (HALF keys, BLOCK_M queries)
    acc_layout: gl.constexpr = _mma_layout(4, D)  # dkj, dvj (HALF, D); dqi (BLOCK_M, D)
    a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc_layout, k_width=2)
    row_layout: gl.constexpr = gl.SliceLayout(0, s_layout)  # one value per query of the block: lse_i, delta_i

    q0, _, n, blk = _document(CU, TABLE, gl.program_id(0), N, DOCS)
    start_n = blk * BLOCK_N
    bh = gl.program_id(1)
    row0, col = _head(bh, N, H, D, HEADS_IN_COLUMNS)  # dQ's float32 sums are laid out as Q
    row0 = row0 + q0
    lo = start_n if CAUSAL else 0
    kj = k_tile.slice(WG * HALF, HALF)
    vj = v_tile.slice(WG * HALF, HALF)
    dq_tile = dq_tiles.index(WG)
    offs_n = start_n + WG * HALF + gl.arange(0, HALF, layout=gl.SliceLayout(1, s_layout))
    s_zero = gl.zeros([HALF, BLOCK_M], gl.float32, layout=s_layout)  # not read: use_acc=False
    dq_zero = gl.zeros([BLOCK_M, D], gl.float32, layout=acc_layout)
    dkj = gl.zeros([HALF, D], gl.float32, layout=acc_layout)
    dvj = gl.zeros([HALF, D], gl.float32, layout=acc_layout)
    mbarrier.wait(kv_ready, 0)
    for i in range(_q_blocks(n, lo, DOCS)):
        s = i % STAGES
        start_m = lo + i * BLOCK_M
        mbarrier.wait(qdo_ready.index(s), (i // STAGES) & 1)
        qi = q_ring.index(s)
        doi = do_ring.index(s)
        sijT = warpgroup_mma(kj, qi.permute((1, 0)), s_zero, use_acc=False, is_async=True)
        dpijT = warpgroup_mma(vj, doi.permute((1, 0)), s_zero, use_acc=False, is_async=True)
        if DOCS:
            offs_m = start_m + gl.arange(0, BLOCK_M, layout=row_layout)
            rows = bh * N + q0 + offs_m
            lse_i = gl.load(LSE_ROWS + rows, mask=offs_m < n, other=0.0) * LOG2_E
            delta_i = gl.load(DELTA_ROWS + rows, mask=offs_m < n, other=0.0)
        else:
            lse_i = lse_ring.index(s).load(row_layout) * LOG2_E
        sijT = warpgroup_mma_wait(1, deps=[sijT])  # the scores are in; dpijT may still be running
        pijT = gl.exp2(sijT * qk_scale - lse_i[None, :])
        if DOCS:  # and where the document ends: the next one's keys and queries (in the tiles) take no part
            if (start_m + BLOCK_M > n) or (start_n + BLOCK_N > n) or (CAUSAL and start_m < start_n + BLOCK_N):
                offs_m = start_m + gl.arange(0, BLOCK_M, layout=row_layout)
                keep = (offs_n[:, None] < n) & (offs_m[None, :] < n)
                if CAUSAL:
                    keep = keep & (offs_n[:, None] <= offs_m[None, :])
                pijT = gl.where(keep, pijT, 0.0)
        elif CAUSAL:
            if start_m < start_n + BLOCK_N:  # the blocks on the diagonal
                offs_m = start_m + gl.arange(0, BLOCK_M, layout=row_layout)
                pijT = gl.where(offs_n[:, None] <= offs_m[None, :], pijT, 0.0)
        if not DOCS:
            delta_i = delta_ring.index(s).load(row_layout)
        dpijT = warpgroup_mma_wait(0, deps=[dpijT])
        dsijT = (pijT * (dpijT - delta_i[None, :])).to(dtype)
        dvj = warpgroup_mma(gl.convert_layout(pijT.to(dtype), a_layout), doi, dvj, is_async=True)
        b = i % 2
        mbarrier.wait(ds_empty.index(b), ((i // 2) & 1) ^ 1)  # the dQ product two blocks ago has read it
        ds_tiles.index(b).slice(WG * HALF, HALF).store(dsijT)
        fence_async_shared()  # the other warpgroup's wgmma reads it through the async proxy
        mbarrier.arrive(ds_ready.index(b), count=1)
        dkj = warpgroup_mma(gl.convert_layout(dsijT, a_layout), qi, dkj, is_async=True)
        dvj, dkj = warpgroup_mma_wait(0, deps=[dvj, dkj])
        mbarrier.arrive(qdo_empty.index(s), count=1)
        if i % 2 == WG:  # this warpgroup's turn: dqi = dsij · kj over all 128 keys, added into dQ
            mbarrier.wait(ds_ready.index(b), (i // 2) & 1)
            dqi = warpgroup_mma(ds_tiles.index(b).permute((1, 0)), k_tile, dq_zero, use_acc=False, is_async=True)
            dqi = warpgroup_mma_wait(0, deps=[dqi])
            mbarrier.arrive(ds_empty.index(b), count=1)
            tma.store_wait(0)  # the add this warpgroup issued two blocks ago has read its dQ tile
            dq_tile.store(dqi)
            fence_async_shared()
            tma_reduce_add(DQ_ACC, [row0 + start_m, col], dq_tile)
    tma.store_wait(0)

    offs_o = start_n + WG * HALF + gl.arange(0, HALF, layout=gl.SliceLayout(1, acc_layout))
    offs_d = gl.arange(0, D, layout=gl.SliceLayout(0, acc_layout))
    head = (bh // H).to(gl.int64) * stride_kb + (bh % H).to(gl.int64) * stride_kh  # dK, dV: any strides, the last 1
    if DOCS:
        head += q0.to(gl.int64) * stride_kn
    o_ptrs = head + offs_o.to(gl.int64)[:, None] * stride_kn + offs_d[None, :]
    if DOCS:  # not the next document's rows
        gl.store(DK + o_ptrs, (dkj * scale).to(dtype), mask=offs_o[:, None] < n)
        gl.store(DV + o_ptrs, dvj.to(dtype), mask=offs_o[:, None] < n)
    else:
        gl.store(DK + o_ptrs, (dkj * scale).to(dtype))  # from the accumulators' layout: no shared memory for a change
        gl.store(DV + o_ptrs, dvj.to(dtype))


@gluon.jit
def bwd_kernel_gluon(Q, K, V, DO, LSE, DELTA, DQ_ACC, DK, DV, N, H, stride_kb, stride_kh, stride_kn, qk_scale, scale,
                     CU, TABLE, LSE_ROWS, DELTA_ROWS, D: gl.constexpr, CAUSAL: gl.constexpr, DOCS: gl.constexpr,
                     STAGES: gl.constexpr, HEADS_IN_COLUMNS: gl.constexpr):
    """Grid (N // BLOCK_N, B·H): one program per 128 keys of one head. The descriptors of Q, K, V, dO and dQ's sums lay
    the heads out as HEADS_IN_COLUMNS says (``fast_gluon._head``); dK and dV share the strides ``stride_k*``.
    DOCS: B = 1 and the N rows are packed documents (rows CU[d] .. CU[d + 1]), each a sequence of its own; the grid
    is (the block table's entries, H), TABLE listing each program's (document, key block) (``fast_gluon_keys``), and
    the consumers read lse and delta through the pointers LSE_ROWS and DELTA_ROWS (not TMA: a document's first row can
    lie at any float of its head's row, and a 1-D TMA load from a start that is not 16-byte aligned stops the kernel
    with "illegal instruction", as the H200 showed)."""
    dtype: gl.constexpr = Q.dtype
    k_tile = gl.allocate_shared_memory(dtype, [BLOCK_N, D], K.layout)
    v_tile = gl.allocate_shared_memory(dtype, [BLOCK_N, D], V.layout)
    q_ring = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_M, D], Q.layout)
    do_ring = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_M, D], DO.layout)
    lse_ring = gl.allocate_shared_memory(gl.float32, [STAGES, BLOCK_M], LSE.layout)
    delta_ring = gl.allocate_shared_memory(gl.float32, [STAGES, BLOCK_M], DELTA.layout)
    ds_layout: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
    ds_tiles = gl.allocate_shared_memory(dtype, [2, BLOCK_N, BLOCK_M], ds_layout)
    dq_tiles = gl.allocate_shared_memory(gl.float32, [2, BLOCK_M, D], DQ_ACC.layout)  # one per warpgroup
    kv_ready = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    qdo_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    qdo_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    ds_ready = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    ds_empty = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    mbarrier.init(kv_ready, count=1)
    for s in gl.static_range(STAGES):
        mbarrier.init(qdo_ready.index(s), count=1)
        mbarrier.init(qdo_empty.index(s), count=2)  # both warpgroups give the slot back
    for b in gl.static_range(2):
        mbarrier.init(ds_ready.index(b), count=2)  # both halves written
        mbarrier.init(ds_empty.index(b), count=1)  # read by the warpgroup whose turn it was
    io = (DQ_ACC, DK, DV, N, H, stride_kb, stride_kh, stride_kn, qk_scale, scale, CU, TABLE, LSE_ROWS, DELTA_ROWS)
    tiles = (k_tile, v_tile, q_ring, do_ring, lse_ring, delta_ring, ds_tiles, dq_tiles)
    bars = (kv_ready, qdo_ready, qdo_empty, ds_ready, ds_empty)
    gl.warp_specialize([(_consumer, (io, tiles, bars, 0, CAUSAL, DOCS, HEADS_IN_COLUMNS)),
                        (_consumer, (io, tiles, bars, 1, CAUSAL, DOCS, HEADS_IN_COLUMNS)),
                        (_producer, (Q, K, V, DO, LSE, DELTA, N, H, CU, TABLE, k_tile, v_tile, q_ring, do_ring,
                                     lse_ring, delta_ring, kv_ready, qdo_ready, qdo_empty, CAUSAL, DOCS,
                                     HEADS_IN_COLUMNS))],
                       [4, 1], [240, 24])


def applies(q, k, causal: bool) -> str | None:
    """None if this kernel can run the problem (on a Hopper GPU), else why not."""
    B, HQ, L, D = q.shape
    HKV, S = k.shape[1], k.shape[2]
    if q.dtype not in DTYPES:
        return f"{q.dtype} (it takes float16 and bfloat16)"
    if D not in HEAD_DIMS:
        return f"head dimension {D} (it takes {' and '.join(map(str, HEAD_DIMS))})"
    if HQ != HKV or L != S:
        return "grouped-query heads or L != S (it takes one K/V head per query head and as many keys as queries)"
    if L % BLOCK_N.value:
        return f"N = {L} (it takes multiples of {BLOCK_N.value})"
    if B * HQ * L >= 2**31:
        return f"B·H·N = {B * HQ * L} (TMA coordinates are 32-bit)"
    return None


def bind(q, k, v, lse, do, delta, *, causal: bool, scale: float, stages: int | None = None, docs: int | None = None):
    """:func:`attention_backward_gluon` for one problem (shapes, strides, dtypes, alignment), bound: a function
    ``run(q, k, v, lse, do, delta, dq_acc=None) -> (dq_acc, dk, dv)`` that makes the descriptors from templates and
    calls the compiled kernel directly after its first call (``launch_cache.bind``). ``dq_acc``: dQ's float32 sums,
    zeroed, laid out as the inputs (``fast_backward`` has ``bwd_preprocess_fast`` zero them); None: made here.
    ``docs``: the N rows (B = 1) are that many packed documents, of any lengths; ``run`` then also takes their int32
    offsets ``cu`` (docs + 1,) and block table ``table`` (``masked.block_table`` of BLOCK_N keys, not reversed)."""
    B, H, N, D = q.shape
    if docs is not None and (B != 1 or docs < 1):
        raise ValueError(f"fast backward (Gluon): packed documents take B = 1 (got {B}) and at least one document")
    in_columns = descriptors.heads_in_columns(q, k, v, do)
    if in_columns is None:
        raise ValueError("fast backward (Gluon): q, k, v and do must be contiguous or (B, N, H, D) views alike, "
                         "16-byte aligned (attention_backward_fast copies them)")
    if lse.data_ptr() % 16 or not lse.is_contiguous():
        raise ValueError("fast backward (Gluon): lse must be contiguous and 16-byte aligned (TMA)")
    # dQ's float32 sums, dK and dV: laid out as the inputs (so that a model's .transpose(1, 2) of each is free)
    shape, device = ((B, N, H, D) if in_columns else (B, H, N, D)), q.device

    def new(dtype, zero=False):
        t = (torch.zeros if zero else torch.empty)(shape, dtype=dtype, device=device)
        return t.transpose(1, 2) if in_columns else t

    dq_acc, dk = new(torch.float32), new(k.dtype)
    bm, bn = BLOCK_M.value, BLOCK_N.value
    templates = (descriptors.gluon_heads(q, bm, in_columns), descriptors.gluon_heads(k, bn, in_columns),
                 descriptors.gluon_heads(v, bn, in_columns), descriptors.gluon_heads(do, bm, in_columns),
                 descriptors.gluon_vector(lse, bm), descriptors.gluon_vector(delta, bm),
                 descriptors.gluon_heads(dq_acc, bm, in_columns))
    templates = tuple(descriptors.rebase(t, None) for t in templates)  # kept without the first call's tensors
    programs = N // BLOCK_N.value if docs is None else document_blocks(N, BLOCK_N.value, docs)
    kernel = launch_cache.bind(bwd_kernel_gluon, (programs, B * H),
                               dict(D=D, CAUSAL=causal, DOCS=docs is not None, STAGES=stages or STAGES[D],
                                    HEADS_IN_COLUMNS=in_columns),
                               num_warps=4, maxnreg=MAXNREG)
    tail = (N, H, dk.stride(0), dk.stride(1), dk.stride(2), scale * LOG2_E.value, scale)
    rebase = descriptors.rebase

    def run(q, k, v, lse, do, delta, dq_acc=None, cu=None, table=None):
        if dq_acc is None:
            dq_acc = new(torch.float32, zero=True)
        dk, dv = new(k.dtype), new(v.dtype)
        tensors = (q, k, v, do, lse, delta, dq_acc)
        kernel(*(rebase(t, x) for t, x in zip(templates, tensors, strict=True)), dk, dv, *tail,
               *((dk, dk, lse, delta) if docs is None else (cu, table, lse, delta)))  # (without documents: unused)
        return dq_acc, dk, dv

    return run


def attention_backward_gluon(q, k, v, lse, do, delta, *, causal: bool, scale: float, stages: int | None = None):
    """(the float32 sums of dQ, not yet scaled), dk, dv for (B, H, N, D) inputs that :func:`applies` accepts and
    ``descriptors.heads_in_columns`` reads in place (contiguous, or (B, N, H, D) views alike: then dQ's sums, dK and
    dV are laid out so too, and ``.transpose(1, 2)`` of each is contiguous); ``lse`` and ``delta`` (B, H, N) float32,
    contiguous, ``delta`` = rowsum(o ∘ do) (``fast_backward.delta_rows``); ``fast_backward.finish_dq`` turns the sums
    into dQ. ``stages``: the Q/dO ring's slots (default :data:`STAGES` for D)."""
    if lse.data_ptr() % 16 or not lse.is_contiguous():  # a view into a larger tensor: TMA needs 16-byte-aligned rows
        lse = lse.clone(memory_format=torch.contiguous_format)
    return bind(q, k, v, lse, do, delta, causal=causal, scale=scale, stages=stages)(q, k, v, lse, do, delta)
