"""The Hopper path of ``fast``: the same loop written in Gluon, so that the overlap is ours to schedule.

Triton decides by itself when a ``tl.dot`` waits for the tensor cores. Gluon, Triton's lower-level
language, lets the kernel say it: ``warpgroup_mma(..., is_async=True)`` issues a Hopper ``wgmma`` and
returns at once, ``warpgroup_mma_wait(n)`` waits until at most ``n`` of them are still running. That
is what FlashAttention-3's *intra-warpgroup overlap* needs. For key block j the loop

1. issues ``sij = qi · kjᵀ``                       (tensor cores)
2. issues ``acc += p(j-1) · v(j-1)`` for the block before   (tensor cores, queued behind 1)
3. waits for 1 only, and runs block j's softmax     (exp2 units, while 2 runs)
4. waits for 2, and rescales ``acc`` by block j's ``alpha``.

(``OVERLAP=False`` waits for each product as soon as it is issued: the same kernel without the overlap,
for notebook 09's ablation.)

So the exponentials of one block overlap the second matrix product of the previous one. K and V tiles
arrive by TMA into a ring of ``STAGES`` shared-memory slots, each with an mbarrier that says "landed";
a slot is refilled as soon as the product that reads it has finished.

Same names and results as ``attn_kernel_fast``: the running max ``mi`` in scaled base-2 units, ``li``,
``acc`` normalized once at the end, the log-sum-exp on request. Hopper only (``wgmma`` is sm_90's
instruction), 16-bit inputs, D = 64 or 128; other cases use the Triton kernel.
"""

from __future__ import annotations

import functools

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma, warpgroup_mma, warpgroup_mma_wait
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

DTYPES = {torch.float16: gl.float16, torch.bfloat16: gl.bfloat16}
# the TMA load's name: async_copy_global_to_shared up to Triton 3.6, async_load after
tma_load = tma.async_load if hasattr(tma, "async_load") else tma.async_copy_global_to_shared


@gluon.jit
def _load_tile(desc, bars, smem, slot, row, pred):
    """TMA: rows ``row .. row + block`` of ``desc`` into ring slot ``slot``; its barrier counts the bytes."""
    bar = bars.index(slot)
    mbarrier.expect(bar, desc.block_type.nbytes, pred=pred)
    tma_load(desc, [row, 0], bar, smem.index(slot), pred=pred)


@gluon.jit
def _softmax(sij, mi, li, start_n, m0, offs_m, N, qk_scale,
             BLOCK_N: gl.constexpr, CAUSAL: gl.constexpr, s_layout: gl.constexpr):
    """Block j's online-softmax step: returns ``pij``, the new ``mi`` and ``li``, and ``alpha``."""
    # only the causal diagonal and the ragged tail (N not a multiple of BLOCK_N) need a mask
    if (start_n + BLOCK_N > N) or (CAUSAL and start_n + BLOCK_N > m0 + 1):
        offs_n = start_n + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
        keep = offs_n[None, :] < N
        if CAUSAL:
            keep = keep & (offs_n[None, :] <= offs_m[:, None])
        sij = gl.where(keep, sij, float("-inf"))
    mi_new = gl.maximum(mi, gl.max(sij, 1) * qk_scale)
    pij = gl.exp2(sij * qk_scale - mi_new[:, None])
    alpha = gl.exp2(mi - mi_new)
    li = li * alpha + gl.sum(pij, 1)
    return pij, mi_new, li, alpha


@gluon.jit
def attn_kernel_gluon(Q, K, V, O, LSE, N, qk_scale,
                      D: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
                      CAUSAL: gl.constexpr, STORE_LSE: gl.constexpr, OVERLAP: gl.constexpr, num_warps: gl.constexpr):
    dtype: gl.constexpr = Q.dtype
    pid_m = gl.program_id(0)
    pid_bh = gl.program_id(1)
    if CAUSAL:  # the heaviest Q blocks (the last rows) first
        pid_m = gl.num_programs(0) - 1 - pid_m
    m0 = pid_m * BLOCK_M
    row0 = pid_bh * N  # the head's first row: the descriptors see all heads as one (B·H·N, D) matrix

    # Register layouts of the two products' results (wgmma's accumulator layout, warps stacked along
    # rows), and pij's layout as wgmma's left operand straight from registers.
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                       instr_shape=[16, BLOCK_N, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                       instr_shape=[16, D, 16])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    row_s: gl.constexpr = gl.SliceLayout(1, s_layout)
    row_o: gl.constexpr = gl.SliceLayout(1, o_layout)

    qi = gl.allocate_shared_memory(dtype, [BLOCK_M, D], Q.layout)
    kj = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, D], K.layout)
    vj = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, D], V.layout)
    q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    k_bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    mbarrier.init(q_bar, count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(k_bars.index(i), count=1)
        mbarrier.init(v_bars.index(i), count=1)

    if CAUSAL:
        n_blocks = gl.cdiv(gl.minimum(m0 + BLOCK_M, N), BLOCK_N)
    else:
        n_blocks = gl.cdiv(N, BLOCK_N)

    mbarrier.expect(q_bar, Q.block_type.nbytes)
    tma_load(Q, [row0 + m0, 0], q_bar, qi)
    for i in gl.static_range(STAGES):
        _load_tile(K, k_bars, kj, i, row0 + i * BLOCK_N, i < n_blocks)
        _load_tile(V, v_bars, vj, i, row0 + i * BLOCK_N, i < n_blocks)

    offs_m = m0 + gl.arange(0, BLOCK_M, layout=row_s)
    mi = gl.full([BLOCK_M], float("-inf"), gl.float32, layout=row_s)
    li = gl.full([BLOCK_M], 0.0, gl.float32, layout=row_s)
    acc = gl.zeros([BLOCK_M, D], gl.float32, layout=o_layout)
    s_init = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, layout=s_layout)  # ignored: use_acc=False

    # block 0: scores and softmax, nothing to overlap with yet
    mbarrier.wait(q_bar, 0)
    mbarrier.wait(k_bars.index(0), 0)
    sij = warpgroup_mma(qi, kj.index(0).permute((1, 0)), s_init, use_acc=False, is_async=True)
    sij = warpgroup_mma_wait(0, deps=[sij])
    _load_tile(K, k_bars, kj, 0, row0 + STAGES * BLOCK_N, STAGES < n_blocks)
    pij, mi, li, alpha = _softmax(sij, mi, li, 0, m0, offs_m, N, qk_scale, BLOCK_N, CAUSAL, s_layout)
    pij = gl.convert_layout(pij.to(dtype), p_layout)

    for j in range(1, n_blocks):
        slot = j % STAGES
        prev = (j - 1) % STAGES
        mbarrier.wait(k_bars.index(slot), (j // STAGES) & 1)  # kj landed (the phase flips each lap)
        sij = warpgroup_mma(qi, kj.index(slot).permute((1, 0)), s_init, use_acc=False, is_async=True)
        if not OVERLAP:  # for comparison: each product waited for at once, nothing runs beside the softmax
            sij = warpgroup_mma_wait(0, deps=[sij])
        mbarrier.wait(v_bars.index(prev), ((j - 1) // STAGES) & 1)
        pv = warpgroup_mma(pij, vj.index(prev), acc, is_async=True)  # the previous block's p · v
        if not OVERLAP:
            pv, pij = warpgroup_mma_wait(0, deps=[pv, pij])
        sij = warpgroup_mma_wait(1, deps=[sij])  # scores done; p · v may still run
        _load_tile(K, k_bars, kj, slot, row0 + (j + STAGES) * BLOCK_N, j + STAGES < n_blocks)
        p_next, mi, li, alpha = _softmax(sij, mi, li, j * BLOCK_N, m0, offs_m, N, qk_scale, BLOCK_N, CAUSAL,
                                         s_layout)
        acc, pij = warpgroup_mma_wait(0, deps=[pv, pij])  # pij's registers stay live until p · v is done
        acc = acc * gl.convert_layout(alpha, row_o)[:, None]
        _load_tile(V, v_bars, vj, prev, row0 + (j - 1 + STAGES) * BLOCK_N, j - 1 + STAGES < n_blocks)
        pij = gl.convert_layout(p_next.to(dtype), p_layout)

    last = (n_blocks - 1) % STAGES
    mbarrier.wait(v_bars.index(last), ((n_blocks - 1) // STAGES) & 1)
    acc = warpgroup_mma(pij, vj.index(last), acc, is_async=True)
    acc = warpgroup_mma_wait(0, deps=[acc])

    mbarrier.invalidate(q_bar)
    for i in gl.static_range(STAGES):
        mbarrier.invalidate(k_bars.index(i))
        mbarrier.invalidate(v_bars.index(i))

    # normalize once; store through a row-major layout (8 contiguous values per thread) for wide stores
    out = (acc / gl.convert_layout(li, row_o)[:, None]).to(dtype)
    out_layout: gl.constexpr = gl.BlockedLayout([1, 8], [256 // D, D // 8], [num_warps, 1], [1, 0])
    out = gl.convert_layout(out, out_layout)
    offs_mo = m0 + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, out_layout))
    offs_d = gl.arange(0, D, layout=gl.SliceLayout(0, out_layout))
    o_ptrs = O + (row0 + offs_mo).to(gl.int64)[:, None] * D + offs_d[None, :]
    gl.store(o_ptrs, out, mask=offs_mo[:, None] < N)
    if STORE_LSE:  # natural log: mi and log2(li) are in base 2
        gl.store(LSE + pid_bh.to(gl.int64) * N + offs_m, (mi + gl.log2(li)) * 0.6931471805599453, mask=offs_m < N)


@functools.lru_cache(maxsize=64)
def _tile_layout(rows: int, D: int, dtype: torch.dtype):
    """The swizzled shared-memory layout of a (rows, D) tile (remembered: working it out costs ~20 µs)."""
    return gl.NVMMASharedLayout.get_default_for([rows, D], DTYPES[dtype])


def descriptor(x: torch.Tensor, block_rows: int) -> TensorDescriptor:
    """A Gluon TMA descriptor over contiguous ``x`` (B, H, N, D) seen as one (B·H·N, D) matrix."""
    B, H, N, D = x.shape
    return TensorDescriptor(x, [B * H * N, D], [D, 1], [block_rows, D], _tile_layout(block_rows, D, x.dtype))
