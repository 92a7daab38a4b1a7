"""Decoding (notebook 15): attention of a few new queries over a long key/value cache, split along the keys.

At decoding time each sequence brings Lq new queries (often one) and attends to its whole cache. v2's grid, one
program per (Q block, batch·head), then has B·Hq programs, each walking the whole cache: too few to keep the GPU's
memory busy, while the work is all reading the cache. Here (Flash-Decoding):

* ``decode_split_kernel``: one program per (sequence and K/V head, block of query rows, split of the keys). Its
  rows are all the Hq/Hkv query heads that share the K/V head, times the Lq queries (row r = query r // GROUP of
  query head hkv·GROUP + r % GROUP), so every K/V byte is read once. It runs v2's loop (``qi``, ``kj``, ``vj``,
  ``mi``, ``li``, ``acc``; exp2 with log2 e folded into the scale, as in ``fast``) over its slice of the keys, and
  writes its partial output ``acc / li`` (float32) and the log-sum-exp ``lse = m + log l`` of every row. Each
  program reads its sequence's length from ``cache_seqlens`` and derives its own slice; a split with no keys (or a
  row that sees none of them, causal) writes lse = -inf and no output.
* the merge of notebook 03: with M = max_s lse_s, the output is Σ_s e^(lse_s − M)·o_s / Σ_s e^(lse_s − M). Empty
  splits weigh e^(-inf) = 0 and their outputs are not read. By default (``decode_plan.MERGE = "last program"``) the split
  program that finishes last among its row block's splits does it (:func:`_merge_row_block`): each program, its
  partials stored, takes a ticket from a counter per row block (an atomic add that releases its stores and acquires
  the others'); the one holding the last ticket reads every split's partials back from L2, writes the output and
  puts the counter back to 0. So a split call is one launch, as an unsplit one. ``merge="kernel"`` (and a merge
  tile too large for one program) runs ``decode_merge_kernel`` instead, one program per output row, a second
  launch.

With one split the first kernel writes the final output and nothing merges. The cache is contiguous
(B, S_max, Hkv, D) or paged: (num_pages, page_size, Hkv, D) with a block table (B, max_pages) that maps each
sequence's i-th page to a physical page, looked up per key block (``_kv_offsets``).
"""

from __future__ import annotations

import contextlib
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from flashattn.validate import check_int_seqlen, check_kvcache_inputs, check_kvcache_values

from . import decode_plan, launch_cache
from .constants import LN_2, LOG2_E
from .decode_plan import (  # noqa: F401  (the plan's rules, read as decode.X by notebook 15, the tests and tools)
    FLOAT32_TILES,
    INTERPRETER_SM_COUNT,
    INTERPRETER_TILES,
    MAX_BLOCK_M,
    MAX_SPLITS,
    MERGE_TILE_FLOATS,
    MIN_BLOCKS_PER_SPLIT,
    ONE_SPLIT_MIN_KEYS,
    ONE_SPLIT_TILES,
    PROGRAMS_PER_SM,
    SHORT_TILES,
    SPLIT_WIDE_MIN_KEYS,
    TILES,
    Plan,
    choose_num_splits,
    make_plan,
    merge_step_rows,
    one_split_tiles,
    paged_stages,
    programs_per_sm,
    shared_bytes,
    short_cache_tiles,
    tile_configs,
)
from .fast_options import padded_head_dim


@triton.jit
def _kv_offsets(BLOCK_TABLE, start_n, seqlen, num_pages, stride_bt_p, stride_page, stride_n,
                BLOCK_N: tl.constexpr, PAGE_SIZE: tl.constexpr, pages_row=0, TABLE_ROW: tl.constexpr = 0):
    """Element offsets (int64) of the keys ``start_n .. start_n + BLOCK_N`` of one sequence in one K/V head.

    Contiguous cache (PAGE_SIZE = 0): key j is row j. Paged: key j is row j % PAGE_SIZE of the physical page
    ``BLOCK_TABLE[j // PAGE_SIZE]`` (``BLOCK_TABLE`` points at the sequence's row of the table). When pages hold
    whole key blocks, one entry serves the block; otherwise each key looks up its own. Page numbers are clamped to
    the cache (a CUDA graph replays without the host's checks, and must not read outside it). With TABLE_ROW, the
    sequence's row of the table is already in registers (``pages_row``, loaded beside its length) and the page is
    picked from it.
    """
    offs_n = start_n + tl.arange(0, BLOCK_N)
    if PAGE_SIZE == 0:
        return offs_n.to(tl.int64) * stride_n
    elif PAGE_SIZE % BLOCK_N == 0:
        if TABLE_ROW:
            page = tl.sum(tl.where(tl.arange(0, TABLE_ROW) == start_n // PAGE_SIZE, pages_row, 0), 0)
        else:
            page = tl.load(BLOCK_TABLE + (start_n // PAGE_SIZE) * stride_bt_p)
        page = tl.minimum(tl.maximum(page, 0), num_pages - 1).to(tl.int64)
        return page * stride_page + (start_n % PAGE_SIZE + tl.arange(0, BLOCK_N)).to(tl.int64) * stride_n
    else:
        pages = tl.load(BLOCK_TABLE + (offs_n // PAGE_SIZE) * stride_bt_p, mask=offs_n < seqlen, other=0)
        pages = tl.minimum(tl.maximum(pages, 0), num_pages - 1).to(tl.int64)
        return pages * stride_page + (offs_n % PAGE_SIZE).to(tl.int64) * stride_n


@triton.jit
def _load_tile(X, rows, keys, seqlen, stride_d, D: tl.constexpr, D_PAD: tl.constexpr, MASK: tl.constexpr):
    """The (BLOCK_N, D_PAD) tile of keys ``keys`` at element offsets ``rows``; keys past seqlen (with MASK) and
    columns past D read as zeros."""
    offs_d = tl.arange(0, D_PAD)
    ptrs = X + rows[:, None] + offs_d[None, :] * stride_d
    if MASK:
        return tl.load(ptrs, mask=(keys[:, None] < seqlen) & (offs_d[None, :] < D), other=0.0)
    elif D == D_PAD:
        return tl.load(ptrs)
    else:
        return tl.load(ptrs, mask=offs_d[None, :] < D, other=0.0)


@triton.jit
def _attend(acc, li, mi, qi, K, V, BLOCK_TABLE, lo, hi, seqlen, limit, num_pages, qk_scale,
            stride_bt_p, stride_kp, stride_kn, stride_kd, stride_vp, stride_vn, stride_vd,
            BLOCK_N: tl.constexpr, D: tl.constexpr, D_PAD: tl.constexpr, PAGE_SIZE: tl.constexpr,
            MASK: tl.constexpr, PRECISION: tl.constexpr, pages_row, TABLE_ROW: tl.constexpr):
    """v2's loop over the key blocks ``lo .. hi``. ``MASK``: key j counts for row r only when j < limit[r] (the
    blocks at the end of the keys), and a row may have seen no key yet (mi = -inf): the exponent is then taken
    against 0, as notebook 03's merge does, instead of computing -inf − (-inf)."""
    for start_n in tl.range(lo, hi, BLOCK_N):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        keys = start_n + tl.arange(0, BLOCK_N)
        k_rows = _kv_offsets(BLOCK_TABLE, start_n, seqlen, num_pages, stride_bt_p, stride_kp, stride_kn,
                             BLOCK_N, PAGE_SIZE, pages_row, TABLE_ROW)
        kj = _load_tile(K, k_rows, keys, seqlen, stride_kd, D, D_PAD, MASK)
        sij = tl.dot(qi, tl.trans(kj), input_precision=PRECISION) * qk_scale  # base-2 units
        if MASK:
            sij = tl.where(keys[None, :] < limit[:, None], sij, float("-inf"))
        mi_new = tl.maximum(mi, tl.max(sij, 1))
        m_safe = tl.where(mi_new == float("-inf"), 0.0, mi_new) if MASK else mi_new
        pij = tl.exp2(sij - m_safe[:, None])
        alpha = tl.exp2(mi - m_safe)
        li = li * alpha + tl.sum(pij, 1)
        v_rows = _kv_offsets(BLOCK_TABLE, start_n, seqlen, num_pages, stride_bt_p, stride_vp, stride_vn,
                             BLOCK_N, PAGE_SIZE, pages_row, TABLE_ROW)
        vj = _load_tile(V, v_rows, keys, seqlen, stride_vd, D, D_PAD, MASK)
        acc = tl.dot(pij.to(vj.dtype), vj, acc * alpha[:, None], input_precision=PRECISION)
        mi = mi_new
    return acc, li, mi


@triton.jit
def decode_split_kernel(
    Q, K, V, O, LSE, SEQLENS, BLOCK_TABLE, OUT, TICKETS,
    stride_qb, stride_qn, stride_qh, stride_qd,
    stride_kb, stride_kn, stride_kh, stride_kd,  # kb: the sequence, or with a block table the physical page
    stride_vb, stride_vn, stride_vh, stride_vd,
    stride_ob, stride_on, stride_oh, stride_os, stride_od,  # os: the split (0 when O is the final output)
    stride_bt_b, stride_bt_p,
    Hkv, GROUP, Lq, capacity, num_pages, qk_scale,
    D: tl.constexpr, D_PAD: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    PAGE_SIZE: tl.constexpr, CAUSAL: tl.constexpr, SPLIT: tl.constexpr, PRECISION: tl.constexpr,
    MERGE: tl.constexpr = False, BLOCK_S: tl.constexpr = 1, MERGE_ROWS: tl.constexpr = 1, TABLE_ROW: tl.constexpr = 0,
):
    pid_bh, pid_m, split = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    num_splits = tl.num_programs(2)
    off_b, off_hkv = (pid_bh // Hkv).to(tl.int64), (pid_bh % Hkv).to(tl.int64)
    table = BLOCK_TABLE + off_b * stride_bt_b
    pages_row = 0
    if TABLE_ROW:  # the sequence's whole row of the table (TABLE_ROW >= its pages), read beside its length: the first
        offs_p = tl.arange(0, TABLE_ROW)  # key block's address then waits for one load, not for two in a row
        pages_row = tl.load(table + offs_p * stride_bt_p, mask=offs_p < capacity // PAGE_SIZE, other=0)
    seqlen = tl.minimum(tl.load(SEQLENS + off_b), capacity)  # clamped: see _kv_offsets

    # this program's rows: query heads off_hkv·GROUP + g (g = r % GROUP) of the queries i = r // GROUP
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < GROUP * Lq
    qpos = tl.minimum(rows // GROUP, Lq - 1)  # padding rows behave like the last query (never stored)
    head = off_hkv * GROUP + rows % GROUP
    offs_d = tl.arange(0, D_PAD)
    q_ptrs = Q + off_b * stride_qb + qpos[:, None] * stride_qn + head[:, None] * stride_qh + offs_d[None, :] * stride_qd
    qi = tl.load(q_ptrs, mask=row_ok[:, None] & (offs_d[None, :] < D), other=0.0)

    # keys row r may see: j < limit[r] (causal, bottom right: the last query sees all seqlen keys)
    if CAUSAL:
        limit = seqlen - Lq + 1 + qpos
        kv_len = seqlen - Lq + 1 + tl.minimum((pid_m * BLOCK_M + BLOCK_M - 1) // GROUP, Lq - 1)
        seen_by_all = seqlen - Lq + 1 + (pid_m * BLOCK_M) // GROUP  # keys every row of this block sees
    else:
        limit = tl.zeros([BLOCK_M], tl.int32) + seqlen
        kv_len = seqlen
        seen_by_all = seqlen
    # this split's slice of the keys, in whole blocks: [lo, hi)
    blocks_per_split = ((kv_len + BLOCK_N - 1) // BLOCK_N + num_splits - 1) // num_splits
    lo = split * blocks_per_split * BLOCK_N
    hi = tl.minimum(lo + blocks_per_split * BLOCK_N, kv_len)
    mid = tl.maximum(lo, tl.minimum(hi, lo + (seen_by_all - lo) // BLOCK_N * BLOCK_N))  # blocks that need no mask

    k_head = K + off_hkv * stride_kh
    v_head = V + off_hkv * stride_vh
    if PAGE_SIZE == 0:
        k_head += off_b * stride_kb
        v_head += off_b * stride_vb
    mi = tl.full([BLOCK_M], float("-inf"), tl.float32)  # running max of the scaled, base-2 scores
    li = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D_PAD], tl.float32)
    acc, li, mi = _attend(acc, li, mi, qi, k_head, v_head, table, lo, mid, seqlen, limit, num_pages, qk_scale,
                          stride_bt_p, stride_kb, stride_kn, stride_kd, stride_vb, stride_vn, stride_vd,
                          BLOCK_N, D, D_PAD, PAGE_SIZE, False, PRECISION, pages_row, TABLE_ROW)
    acc, li, mi = _attend(acc, li, mi, qi, k_head, v_head, table, mid, hi, seqlen, limit, num_pages, qk_scale,
                          stride_bt_p, stride_kb, stride_kn, stride_kd, stride_vb, stride_vn, stride_vd,
                          BLOCK_N, D, D_PAD, PAGE_SIZE, True, PRECISION, pages_row, TABLE_ROW)

    seen = li > 0  # False: this row saw no key in this slice (an empty split, or causal rows left of it)
    o = acc / tl.where(seen, li, 1.0)[:, None]
    o_ptrs = (O + off_b * stride_ob + qpos[:, None] * stride_on + head[:, None] * stride_oh + split * stride_os
              + offs_d[None, :] * stride_od)
    if SPLIT:  # the partial output where the row saw keys, and its log-sum-exp (natural log) everywhere
        tl.store(o_ptrs, o, mask=(row_ok & seen)[:, None] & (offs_d[None, :] < D))
        lse = tl.where(seen, (mi + tl.log2(tl.where(seen, li, 1.0))) * LN_2, float("-inf"))
        lse_ptrs = LSE + ((off_b * Lq + qpos) * (Hkv * GROUP) + head) * num_splits + split
        tl.store(lse_ptrs, lse, mask=row_ok)
        if MERGE:  # the last of the row block's splits to finish merges them: no second launch
            tl.debug_barrier()  # every thread's stores are issued before the program takes its ticket
            ticket_ptr = TICKETS + pid_bh * tl.num_programs(1) + pid_m
            ticket = tl.atomic_add(ticket_ptr, 1, sem="acq_rel", scope="gpu")  # release the partials, acquire theirs
            if ticket == num_splits - 1:
                tl.store(ticket_ptr, 0)  # back to 0 for the next call (and the next replay of a CUDA graph)
                _merge_row_block(O, LSE, OUT, off_b, off_hkv, pid_m, Hkv, GROUP, Lq, num_splits,
                                 stride_ob, stride_on, stride_oh, stride_os, stride_od,
                                 D, D_PAD, BLOCK_M, BLOCK_S, MERGE_ROWS)
    else:
        tl.store(o_ptrs, o.to(O.dtype.element_ty), mask=row_ok[:, None] & (offs_d[None, :] < D))


@triton.jit
def _merge_row_block(O_PART, LSE_PART, OUT, off_b, off_hkv, pid_m, Hkv, GROUP, Lq, num_splits,
                     stride_ob, stride_on, stride_oh, stride_os, stride_od,
                     D: tl.constexpr, D_PAD: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_S: tl.constexpr,
                     MERGE_ROWS: tl.constexpr):
    """The merge of :func:`decode_merge_kernel` for the rows of one split program's row block, MERGE_ROWS rows at
    a time, every split of them in one (rows, splits, D) tile. The partials were written by other programs, on
    other SMs: they are read from L2 (``.cg``), past this SM's L1."""
    offs_s = tl.arange(0, BLOCK_S)
    offs_d = tl.arange(0, D_PAD)
    for r0 in tl.range(0, tl.minimum(BLOCK_M, GROUP * Lq - pid_m * BLOCK_M), MERGE_ROWS):
        rows = pid_m * BLOCK_M + r0 + tl.arange(0, MERGE_ROWS)
        row_ok = rows < GROUP * Lq
        qpos = tl.minimum(rows // GROUP, Lq - 1)
        head = off_hkv * GROUP + rows % GROUP
        lse_ptrs = LSE_PART + (((off_b * Lq + qpos) * (Hkv * GROUP) + head) * num_splits)[:, None] + offs_s[None, :]
        lse = tl.load(lse_ptrs, mask=row_ok[:, None] & (offs_s < num_splits)[None, :], other=float("-inf"),
                      cache_modifier=".cg")
        m = tl.where(row_ok, tl.max(lse, 1), 0.0)  # finite for real rows: each sees a key in some split
        w = tl.exp(lse - m[:, None])  # 0 for the empty splits (and the padding lanes)
        full = lse > float("-inf")
        row_off = off_b * stride_ob + qpos * stride_on + head * stride_oh
        o_ptrs = (O_PART + row_off[:, None, None] + (offs_s * stride_os)[None, :, None]
                  + (offs_d * stride_od)[None, None, :])
        o_part = tl.load(o_ptrs, mask=full[:, :, None] & (offs_d < D)[None, None, :], other=0.0,
                         cache_modifier=".cg")  # empty splits wrote nothing
        o = tl.sum(w[:, :, None] * o_part, 1) / tl.where(row_ok, tl.sum(w, 1), 1.0)[:, None]
        out_ptrs = OUT + ((off_b * Lq + qpos) * (Hkv * GROUP) + head)[:, None] * D + offs_d[None, :]
        tl.store(out_ptrs, o.to(OUT.dtype.element_ty), mask=row_ok[:, None] & (offs_d < D)[None, :])


@triton.jit
def decode_merge_kernel(O_PART, LSE_PART, O, num_splits, stride_pr, stride_ps, stride_or,
                        D: tl.constexpr, D_PAD: tl.constexpr, BLOCK_S: tl.constexpr):
    """Row ``program_id(0)``: O[row] = Σ_s w_s·O_PART[row, s] / Σ_s w_s with w_s = e^(lse_s − max_s lse_s).
    O_PART (rows, splits, D) float32, LSE_PART (rows, splits) contiguous float32, O (rows, D)."""
    row = tl.program_id(0).to(tl.int64)
    offs_s = tl.arange(0, BLOCK_S)
    offs_d = tl.arange(0, D_PAD)
    lse = tl.load(LSE_PART + row * num_splits + offs_s, mask=offs_s < num_splits, other=float("-inf"))
    m = tl.max(lse, 0)  # finite: every row sees at least one key in some split
    w = tl.exp(lse - m)  # 0 for the empty splits (and the padding lanes)
    full = lse > float("-inf")
    o_part = tl.load(O_PART + row * stride_pr + offs_s[:, None] * stride_ps + offs_d[None, :],
                     mask=full[:, None] & (offs_d[None, :] < D), other=0.0)  # empty splits wrote nothing
    o = tl.sum(w[:, None] * o_part, 0) / tl.sum(w, 0)
    tl.store(O + row * stride_or + offs_d, o.to(O.dtype.element_ty), mask=offs_d < D)


JIT_KERNELS = (decode_split_kernel, decode_merge_kernel)


# --- the host side ---------------------------------------------------------------------------------------------

def _seqlens_tensor(cache_seqlens, B: int, device) -> torch.Tensor:
    if isinstance(cache_seqlens, torch.Tensor):
        return cache_seqlens
    return torch.full((B,), cache_seqlens, dtype=torch.int32, device=device)  # a fill on the GPU: no host read


class Prepared(NamedTuple):
    """One problem's checks and launches, done once (:func:`_prepare`) and reused by every call with the same
    :func:`problem_key`: the checked sizes, the plan, the output's and the partials' shapes, the launches bound to
    their compiled kernels, the integer arguments (strides and sizes) the split kernel takes after its tensors, and
    the tickets of the last program's merge (one int32 per row block, 0 between calls)."""

    p: dict
    plan: Plan
    out_shape: tuple
    part_shapes: tuple | None  # (o_part, lse_part) with splits
    split: object
    merge: object | None
    split_ints: tuple
    tickets: torch.Tensor | None


# The tickets of each problem, by problem_key, kept for good (never emptied with _PREPARED): a CUDA graph that
# captured a launch keeps their address, and its replays must not write to freed memory; a problem prepared again
# gets its own tickets back (at 0 between calls), so this holds one small tensor per problem ever seen.
_TICKETS: dict = {}


_PREPARED: dict = {}
_MAX_PREPARED = 256


@contextlib.contextmanager
def table_rows(pages: int):
    """Inside: ``decode_plan.TABLE_ROW_MAX_PAGES = pages`` (the split kernel's table row for rows of up to that many
    pages; 0: off), with the plans and prepared problems made anew; on leaving, both as they were. What the compile
    checks, the tests and ``tools/gpu/decode/table_row.py`` set it with."""
    global _PREPARED
    switch, prepared = decode_plan.TABLE_ROW_MAX_PAGES, _PREPARED
    decode_plan.TABLE_ROW_MAX_PAGES, _PREPARED = pages, {}
    make_plan.cache_clear()
    try:
        yield
    finally:
        decode_plan.TABLE_ROW_MAX_PAGES, _PREPARED = switch, prepared
        make_plan.cache_clear()


def problem_key(q, k_cache, v_cache, cache_seqlens, block_table, causal, softmax_scale, num_splits, tiles,
                merge=None):
    """Everything of a call that its checks and its launches depend on, but not the data (``launch_cache.problem_key``:
    each tensor's shape, strides, dtype, device and 16-byte alignment), the type of an int cache_seqlens (not its
    value, which a generation loop changes every step: :func:`decode_attention` checks it on every call), and the
    options with their types. None when an argument is not a plain tensor (the full checks then say what is
    wrong)."""
    seqlens_tensor = isinstance(cache_seqlens, torch.Tensor)
    return launch_cache.problem_key((q, k_cache, v_cache, block_table, cache_seqlens if seqlens_tensor else None),
                                    (None if seqlens_tensor else type(cache_seqlens), causal, softmax_scale,
                                     num_splits, tiles, merge))


def _prepare(q, k_cache, v_cache, cache_seqlens, block_table, causal, softmax_scale, num_splits, tiles,
             merge=None, key=None) -> Prepared:
    """The checks of the arguments' shapes, dtypes and devices (:func:`check_kvcache_inputs`), the plan and the
    bound launches of one problem."""
    p = check_kvcache_inputs(q, k_cache, v_cache, cache_seqlens, block_table, causal, softmax_scale, num_splits,
                             MAX_SPLITS)
    B, Lq, Hq, Hkv, D = p["B"], p["Lq"], p["Hq"], p["Hkv"], p["D"]
    plan = make_plan(B, Lq, Hq, Hkv, D, p["capacity"], q.dtype, p["num_splits"], q.device, tiles,
                     block_table is not None, merge, p["page_size"])
    out_shape = (B, Lq, Hq, D)
    split = plan.num_splits > 1
    if split:
        part_shapes = ((B, Lq, Hq, plan.num_splits, D), (B, Lq, Hq, plan.num_splits))
        S, P = plan.num_splits, plan.num_splits * D
        o_strides = (Lq * Hq * P, Hq * P, P, D, 1)  # o_part, contiguous
    else:
        part_shapes = None
        o_strides = (Lq * Hq * D, Hq * D, D, 0, 1)  # the output itself, contiguous; no split stride
    bt_strides = block_table.stride() if block_table is not None else (0, 0)
    split_ints = (*q.stride(), *k_cache.stride(), *v_cache.stride(), *o_strides, *bt_strides, Hkv, Hq // Hkv, Lq,
                  p["capacity"], max(p["num_pages"], 1), p["scale"] * LOG2_E.value)
    split_launch = launch_cache.bind(
        decode_split_kernel, (B * Hkv, plan.row_blocks, plan.num_splits),
        dict(D=D, D_PAD=padded_head_dim(D), BLOCK_M=plan.block_m, BLOCK_N=plan.block_n, PAGE_SIZE=p["page_size"],
             CAUSAL=p["causal"], SPLIT=split, PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
             MERGE=plan.merge_rows > 0, BLOCK_S=triton.next_power_of_2(plan.num_splits),
             MERGE_ROWS=max(plan.merge_rows, 1), TABLE_ROW=plan.table_row),
        num_warps=plan.num_warps, num_stages=plan.num_stages)
    merge_launch = tickets = None
    if plan.merge_rows:
        tickets = _TICKETS.get(key) if key is not None else None
        if tickets is None:
            tickets = torch.zeros(B * Hkv * plan.row_blocks, dtype=torch.int32, device=q.device)
            if key is not None:  # (no key: tensor subclasses, a call of their own, never captured in a graph)
                _TICKETS[key] = tickets
    elif split:
        merge_launch = launch_cache.bind(
            decode_merge_kernel, (B * Lq * Hq,),
            dict(D=D, D_PAD=padded_head_dim(D), BLOCK_S=triton.next_power_of_2(S)), num_warps=plan.merge_warps)
    return Prepared(p, plan, out_shape, part_shapes, split_launch, merge_launch, split_ints, tickets)


def decode_attention(q, k_cache, v_cache, cache_seqlens, *, block_table=None, causal=True, softmax_scale=None,
                     num_splits=0, tiles: tuple | None = None, merge: str | None = None,
                     return_partials: bool = False):
    """:func:`attention_with_kvcache` with the tiles given (``tiles`` = (BLOCK_N, num_warps, num_stages), one of
    :func:`tile_configs`' or None for the default) and, with ``return_partials=True``, also the split kernel's
    float32 partial outputs (B, Lq, Hq, splits, D) and log-sum-exps (B, Lq, Hq, splits), for notebook 15 (only
    with more than one split). ``merge``: who merges the splits (:func:`make_plan`), by default ``decode_plan.MERGE``.

    The host's work per call is kept short, as a decoding step on a short cache takes the GPU only microseconds:
    the checks of shapes, dtypes and devices, the plan and the bound launches are done once per
    :func:`problem_key` and kept (:class:`Prepared`); every call checks the values of cache_seqlens and of the
    block table (once per version of those tensors), allocates the outputs and launches."""
    key = problem_key(q, k_cache, v_cache, cache_seqlens, block_table, causal, softmax_scale, num_splits, tiles,
                      merge)
    prepared = _PREPARED.get(key) if key is not None else None
    if prepared is None:
        prepared = _prepare(q, k_cache, v_cache, cache_seqlens, block_table, causal, softmax_scale, num_splits, tiles,
                            merge, key)
        if key is not None:
            if len(_PREPARED) >= _MAX_PREPARED:
                _PREPARED.clear()
            _PREPARED[key] = prepared
    p, plan = prepared.p, prepared.plan
    if not isinstance(cache_seqlens, torch.Tensor):  # an int: its value is not in the key
        check_int_seqlen(cache_seqlens, p["Lq"], p["capacity"])
    check_kvcache_values(cache_seqlens, block_table, Lq=p["Lq"], capacity=p["capacity"], page_size=p["page_size"],
                         num_pages=p["num_pages"])
    if return_partials and plan.num_splits == 1:
        raise ValueError("decode_attention: return_partials needs more than one split (num_splits > 1)")
    seqlens = _seqlens_tensor(cache_seqlens, p["B"], q.device)
    out = torch.empty(prepared.out_shape, dtype=q.dtype, device=q.device)
    if prepared.part_shapes is None:
        o_part = lse_part = out  # lse_part: unused without splits
    else:
        o_part = torch.empty(prepared.part_shapes[0], dtype=torch.float32, device=q.device)
        lse_part = torch.empty(prepared.part_shapes[1], dtype=torch.float32, device=q.device)
    table = block_table if block_table is not None else seqlens  # unused without pages
    tickets = prepared.tickets if prepared.tickets is not None else seqlens  # unused without the last program's merge
    prepared.split(q, k_cache, v_cache, o_part, lse_part, seqlens, table, out, tickets, *prepared.split_ints)
    if prepared.merge is not None:
        D = p["D"]
        prepared.merge(o_part, lse_part, out, plan.num_splits, plan.num_splits * D, D, D)
    return (out, o_part, lse_part) if return_partials else out


def attention_with_kvcache(q, k_cache, v_cache, cache_seqlens, *, block_table=None, causal=True, softmax_scale=None,
                           num_splits=0):
    """Attention of new queries over a key/value cache, with FlashAttention's ``flash_attn_with_kvcache`` layout.

    q (B, Lq, Hq, D): Lq >= 1 new queries per sequence. k_cache, v_cache (B, S_max, Hkv, D), or paged
    (num_pages, page_size, Hkv, D) with ``block_table`` (B, max_pages) int32 naming each sequence's pages in order
    (page_size a multiple of 16). ``cache_seqlens`` (B,) int32, or an int for all: the valid keys of each sequence,
    the new tokens' keys included (write them into the cache first). ``causal``: query i sees keys
    j < cache_seqlens − Lq + i + 1 (bottom right, as FlashAttention aligns it). Hq a multiple of Hkv (grouped-query
    attention: query head h reads K/V head h // (Hq / Hkv), without copying the cache); D up to 256;
    ``softmax_scale`` defaults to 1/sqrt(D). ``num_splits``: 1 = one program per (sequence, K/V head, block of
    query rows) walks all the keys; > 1 = the keys split in that many slices, merged by their log-sum-exp; 0 =
    chosen from the problem and the GPU's SM count (:func:`choose_num_splits`). Returns (B, Lq, Hq, D) in q's dtype.

    Nothing on the GPU path reads a tensor's values on the host, so the call can be captured in a CUDA graph. The
    values of cache_seqlens and of the block table's pages in use are checked on the host (a synchronization)
    when not capturing (``torch.cuda.is_current_stream_capturing()``), once per version of those tensors; inside a
    capture nothing is checked, and the kernel clamps lengths and page numbers to the cache.

    With splits, the programs of a call count on one ticket counter per row block, kept per problem (its shapes,
    strides, dtypes and options) and back at 0 when the call ends: two calls of the same problem must not run at the
    same time on two streams (calls on one stream, and replays of a graph, follow each other and are safe).
    """
    return decode_attention(q, k_cache, v_cache, cache_seqlens, block_table=block_table, causal=causal,
                            softmax_scale=softmax_scale, num_splits=num_splits)
