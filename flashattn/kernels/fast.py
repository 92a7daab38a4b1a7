"""The fast kernel (notebook 10): v2, plus what a modern GPU and Triton offer.

Same loop as ``v2`` (one program per (Q block, batch·head), ``acc``/``mi``/``li`` in registers,
deferred normalization), with these changes:

* ``exp2`` with ``log2(e)`` folded into the scale, applied with one multiply-add per score
  (``sij * qk_scale - mi_new``); the running max is kept in the same scaled base-2 units.
* The key loop split into stages: blocks that need no mask run without one; only the causal
  diagonal and the ragged tail (a key count not a multiple of BLOCK_N) pay for ``tl.where``. Causal
  programs start with the longest rows (heaviest Q blocks first) so that the last wave is short.
* ``tl.dot(pij, vj, acc)``: the tensor cores accumulate in place.
* ``USE_TMA``: K and V tiles arrive through tensor descriptors (Hopper's TMA engine copies a whole
  tile into shared memory, with its swizzle, without the threads computing addresses).

And what a decoder needs: L queries against S keys (causal aligned as in ``torch``'s ``is_causal``:
query i sees keys j <= i, so every row sees key 0), grouped-query attention (GROUP query heads share one
K/V head, read in place: query head h uses K/V head h // GROUP), any head dimension D up to 256 (computed
as D_PAD, the next power of two >= 16: the extra columns load as zeros and are never stored), and the
log-sum-exp of every row (natural log), which a backward pass needs.

On Hopper, for 16-bit inputs with D = 64 or 128 and L = S without grouped heads, ``fast`` runs the same
loop written in Gluon instead (``fast_gluon.py``, notebook 11, with its own launcher). The path of a call:
:func:`attention_fast` checks the inputs (``validate.py``) and the options (``fast_options.resolve``: defaults
and tuning spaces, pruned to the live GPU), tunes on the first call of a problem (``tuner.py``), and launches
(:func:`launch_triton` below, or ``fast_gluon.launch``) through ``launch_cache.py``. The interpreter (CPU) runs
this kernel with plain pointer loads.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from flashattn import runtime
from flashattn.validate import check_attention_inputs

from . import descriptors, launch_cache, tuner
from .constants import LN_2, LOG2_E
from .fast_options import (
    FLOAT32_SPACE,
    GLUON_SPACE,
    HEAD_DIMS,
    SCHEDULES,
    TUNING_SPACE,
    FastOptions,
    candidates,
    default_options,
    gluon_available,
    padded_head_dim,
    resolve,
    tuning_configs,
)

try:  # Gluon (Triton >= 3.6, complete per triton_compat): the Hopper path; without it, the Triton kernel runs
    from . import fast_gluon
except ImportError:  # pragma: no cover
    fast_gluon = None

__all__ = ["attention_fast", "attn_kernel_fast", "default_options", "tuned_config", "tuning_configs",
           "gluon_available", "FastOptions", "TUNING_SPACE", "FLOAT32_SPACE", "GLUON_SPACE", "SCHEDULES",
           "HEAD_DIMS", "JIT_KERNELS", "launch_triton"]


@triton.jit
def _load_rows(X, row0, start, n_rows, stride_n, stride_d,
               BLOCK: tl.constexpr, D: tl.constexpr, D_PAD: tl.constexpr, USE_TMA: tl.constexpr):
    """Rows ``start .. start + BLOCK`` of one head's (n_rows, D) matrix, as a (BLOCK, D_PAD) tile.

    With TMA, ``X`` is a descriptor over all heads as one (B·H·n_rows, D) matrix and ``row0`` the head's
    first row: rows past n_rows belong to the next head (or read as zeros at the very end); the caller
    masks them. Without TMA, ``X`` points at the head's first element; rows past n_rows and columns past
    D read as zeros.
    """
    if USE_TMA:
        return X.load([row0 + start, 0])
    else:
        offs = start + tl.arange(0, BLOCK)
        offs_d = tl.arange(0, D_PAD)
        ptrs = X + offs[:, None] * stride_n + offs_d[None, :] * stride_d
        if D == D_PAD:
            return tl.load(ptrs, mask=offs[:, None] < n_rows, other=0.0)
        else:
            return tl.load(ptrs, mask=(offs[:, None] < n_rows) & (offs_d[None, :] < D), other=0.0)


@triton.jit
def _update(acc, li, mi, sij, V, kv_row0, start_n, offs_m, S, stride_vn, stride_vd, qk_scale,
            BLOCK_N: tl.constexpr, D: tl.constexpr, D_PAD: tl.constexpr, MASK: tl.constexpr,
            CAUSAL: tl.constexpr, USE_TMA: tl.constexpr, PRECISION: tl.constexpr):
    """One key block's online-softmax step, given its raw scores ``sij = qi · kjᵀ``."""
    if MASK:  # keys past S, and (causal) keys right of a row's diagonal, get -inf
        offs_n = start_n + tl.arange(0, BLOCK_N)
        keep = offs_n[None, :] < S
        if CAUSAL:
            keep = keep & (offs_n[None, :] <= offs_m[:, None])
        sij = tl.where(keep, sij * qk_scale, float("-inf"))
        mi_new = tl.maximum(mi, tl.max(sij, 1))
        sij = sij - mi_new[:, None]
    else:
        mi_new = tl.maximum(mi, tl.max(sij, 1) * qk_scale)
        sij = sij * qk_scale - mi_new[:, None]  # one multiply-add per score
    alpha = tl.exp2(mi - mi_new)
    acc, li, mi = acc * alpha[:, None], li * alpha, mi_new
    vj = _load_rows(V, kv_row0, start_n, S, stride_vn, stride_vd, BLOCK_N, D, D_PAD, USE_TMA)
    pij = tl.exp2(sij)
    li = li + tl.sum(pij, 1)
    acc = tl.dot(pij.to(vj.dtype), vj, acc, input_precision=PRECISION)
    return acc, li, mi


@triton.jit
def _attend(acc, li, mi, qi, K, V, kv_row0, lo, hi, offs_m, S,
            stride_kn, stride_kd, stride_vn, stride_vd, qk_scale,
            BLOCK_N: tl.constexpr, D: tl.constexpr, D_PAD: tl.constexpr, MASK: tl.constexpr,
            CAUSAL: tl.constexpr, USE_TMA: tl.constexpr, PRECISION: tl.constexpr):
    """The v2 inner loop over key blocks ``lo .. hi``; ``MASK`` for the diagonal and the tail only."""
    for start_n in tl.range(lo, hi, BLOCK_N):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        kj = _load_rows(K, kv_row0, start_n, S, stride_kn, stride_kd, BLOCK_N, D, D_PAD, USE_TMA)
        sij = tl.dot(qi, tl.trans(kj), input_precision=PRECISION)
        acc, li, mi = _update(acc, li, mi, sij, V, kv_row0, start_n, offs_m, S, stride_vn, stride_vd, qk_scale,
                              BLOCK_N, D, D_PAD, MASK, CAUSAL, USE_TMA, PRECISION)
    return acc, li, mi


@triton.jit
def attn_kernel_fast(
    Q, K, V, O, LSE,
    stride_qb, stride_qh, stride_qn, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_ob, stride_oh, stride_on, stride_od,
    H, GROUP, L, S, qk_scale,
    D: tl.constexpr, D_PAD: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr,
    MORE_QUERIES: tl.constexpr, USE_TMA: tl.constexpr, PRECISION: tl.constexpr, STORE_LSE: tl.constexpr,
):
    pid_m, pid_bh = tl.program_id(0), tl.program_id(1)
    if CAUSAL:  # the heaviest Q blocks (the last rows) first
        pid_m = tl.num_programs(0) - 1 - pid_m
    off_b, off_h = (pid_bh // H).to(tl.int64), (pid_bh % H).to(tl.int64)
    off_hkv = off_h // GROUP  # grouped-query attention: GROUP query heads share one K/V head
    m0 = pid_m * BLOCK_M
    offs_m = m0 + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, D_PAD)

    if USE_TMA:  # descriptors over all heads as one matrix (int32 coordinates): rows of the head (b, h) start at
        kv_row0 = ((pid_bh // H) * (H // GROUP) + (pid_bh % H) // GROUP) * S  # (b·Hkv + h // GROUP)·S in K and V
        qi = Q.load([pid_bh * L + m0, 0])  # and (b·H + h)·L in Q
        k_head, v_head = K, V
    else:
        kv_row0 = 0
        qi = _load_rows(Q + off_b * stride_qb + off_h * stride_qh, 0, m0, L, stride_qn, stride_qd,
                        BLOCK_M, D, D_PAD, False)
        k_head = K + off_b * stride_kb + off_hkv * stride_kh
        v_head = V + off_b * stride_vb + off_hkv * stride_vh

    mi = tl.full([BLOCK_M], float("-inf"), tl.float32)  # running max of the scaled, base-2 scores
    li = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D_PAD], tl.float32)

    s_full = (S // BLOCK_N) * BLOCK_N  # keys in whole blocks
    if CAUSAL:
        # stage 1: key blocks left of the diagonal: every row sees every key, no mask (with more queries than
        # keys, L > S, the diagonal can pass the last key: stop at the last whole block; a compile-time
        # switch, because the clamp costs the common case registers)
        mid = tl.minimum(m0, s_full) if MORE_QUERIES else m0
        acc, li, mi = _attend(acc, li, mi, qi, k_head, v_head, kv_row0, 0, mid, offs_m, S,
                              stride_kn, stride_kd, stride_vn, stride_vd, qk_scale,
                              BLOCK_N=BLOCK_N, D=D, D_PAD=D_PAD, MASK=False, CAUSAL=True, USE_TMA=USE_TMA,
                              PRECISION=PRECISION)
        # stage 2: the diagonal blocks (and, with L > S, the ragged tail of the keys), masked
        acc, li, mi = _attend(acc, li, mi, qi, k_head, v_head, kv_row0, mid, tl.minimum(m0 + BLOCK_M, S), offs_m, S,
                              stride_kn, stride_kd, stride_vn, stride_vd, qk_scale,
                              BLOCK_N=BLOCK_N, D=D, D_PAD=D_PAD, MASK=True, CAUSAL=True, USE_TMA=USE_TMA,
                              PRECISION=PRECISION)
    else:
        acc, li, mi = _attend(acc, li, mi, qi, k_head, v_head, kv_row0, 0, s_full, offs_m, S,
                              stride_kn, stride_kd, stride_vn, stride_vd, qk_scale,
                              BLOCK_N=BLOCK_N, D=D, D_PAD=D_PAD, MASK=False, CAUSAL=False, USE_TMA=USE_TMA,
                              PRECISION=PRECISION)
        # the ragged tail (empty when BLOCK_N divides S): keys past S masked
        acc, li, mi = _attend(acc, li, mi, qi, k_head, v_head, kv_row0, s_full, S, offs_m, S,
                              stride_kn, stride_kd, stride_vn, stride_vd, qk_scale,
                              BLOCK_N=BLOCK_N, D=D, D_PAD=D_PAD, MASK=True, CAUSAL=False, USE_TMA=USE_TMA,
                              PRECISION=PRECISION)

    acc = acc / li[:, None]
    row_ok = offs_m < L
    o_ptrs = O + off_b * stride_ob + off_h * stride_oh + offs_m[:, None] * stride_on + offs_d[None, :] * stride_od
    if D == D_PAD:
        tl.store(o_ptrs, acc.to(O.dtype.element_ty), mask=row_ok[:, None])
    else:  # the padded columns are not stored
        tl.store(o_ptrs, acc.to(O.dtype.element_ty), mask=row_ok[:, None] & (offs_d[None, :] < D))
    if STORE_LSE:  # log-sum-exp in natural units: mi and log2(li) are in base 2
        tl.store(LSE + pid_bh.to(tl.int64) * L + offs_m, (mi + tl.log2(li)) * LN_2, mask=row_ok)


JIT_KERNELS = (attn_kernel_fast,) if fast_gluon is None else (attn_kernel_fast, fast_gluon.attn_kernel_gluon)


def launch_triton(q, k, v, o, lse, causal: bool, scale: float, return_lse: bool, opts: FastOptions) -> None:
    """Run :func:`attn_kernel_fast` with ``opts``' tiles: one program per (Q block, batch·head)."""
    (B, Hq, L, D), (Hkv, S) = q.shape, k.shape[1:3]
    if opts.use_tma:  # the descriptors view each input as one (B·H·rows, D) matrix
        if max(B * Hq * L, B * Hkv * S) >= 2**31:
            raise ValueError(f"fast: use_tma addresses rows with 32-bit coordinates; B·H·N = {B * Hq * L} is too large")
        q_arg, k_arg, v_arg = (descriptors.rows(q, opts.block_m), descriptors.rows(k, opts.block_n),
                               descriptors.rows(v, opts.block_n))
    else:
        q_arg, k_arg, v_arg = q, k, v
    launch_cache.launch(
        attn_kernel_fast, (triton.cdiv(L, opts.block_m), B * Hq),
        (q_arg, k_arg, v_arg, o, lse, *q.stride(), *k.stride(), *v.stride(), *o.stride(), Hq, Hq // Hkv, L, S,
         scale * LOG2_E.value),
        dict(D=D, D_PAD=padded_head_dim(D), BLOCK_M=opts.block_m, BLOCK_N=opts.block_n, CAUSAL=causal,
             MORE_QUERIES=causal and L > S, USE_TMA=opts.use_tma,
             PRECISION=opts.input_precision if q.dtype == torch.float32 else "tf32", STORE_LSE=return_lse),
        num_warps=opts.num_warps, num_stages=opts.num_stages, **({"maxnreg": opts.maxnreg} if opts.maxnreg else {}))


class Problem(NamedTuple):
    """What a pick is remembered for: the problem's shape and the options that narrow the candidates."""

    kind: str  # "forward" (the tuner's keys name their kernel first)
    gluon: bool
    dtype: torch.dtype
    D: int
    B: int
    Hq: int
    Hkv: int
    L: int
    S: int
    causal: bool
    use_tma: bool
    input_precision: str
    overlap: bool
    schedule: str
    consumers: int | None


def launch(q, k, v, o, lse, causal: bool, scale: float, return_lse: bool, opts: FastOptions) -> FastOptions:
    """Run the Triton or the Gluon kernel with ``opts``. With ``opts.autotune``, the first call for a problem tunes
    (``tuner.py``); later calls launch the pick directly. Returns the options that ran (the pick)."""
    if opts.gluon:  # the Gluon kernel reads contiguous inputs and (B, N, H, D) views in place; it copies the rest
        if descriptors.heads_in_columns(q, k, v) is None:
            q, k, v = (descriptors.tma_ready(x) for x in (q, k, v))
    elif opts.use_tma:  # TMA wants 16-byte aligned rows and base addresses: copy inputs that are not
        q, k, v = (descriptors.tma_ready(x) for x in (q, k, v))
    run = functools.partial(fast_gluon.launch if opts.gluon else launch_triton, q, k, v, o, lse, causal, scale,
                            return_lse)
    if opts.autotune:
        (B, Hq, L, D), (Hkv, S) = q.shape, k.shape[1:3]
        problem = Problem("forward", opts.gluon, q.dtype, D, B, Hq, Hkv, L, S, causal, opts.use_tma,
                          opts.input_precision, opts.overlap, opts.schedule, opts.consumers)
        opts = tuner.pick(problem, functools.partial(candidates, opts, D, q.dtype, causal), run)
    run(opts)
    return opts


class Prepared(NamedTuple):
    """What a problem's first call worked out, for its next calls (:func:`problem_key`): its checks passed."""

    bnhd_output: bool  # o laid out as (B, L, H, D) memory, like q
    copy: bool  # inputs the kernel cannot read in place: copied (descriptors.tma_ready)
    run: object  # run(q, k, v, o, lse): the launch with the tuner's pick
    backward: dict  # for ops._Eager: the backward's bound launches by dO's layout (fast_backward.prepared)


_PREPARED: dict = {}
_MAX_PREPARED = 256


def problem_key(q, k, v, causal, scale, return_lse, options: dict):
    """Everything the checks, the options, the tuner's pick and the launch read of a call
    (``launch_cache.problem_key``), or None (the ordinary path)."""
    return launch_cache.problem_key((q, k, v), (causal, scale, return_lse), options)


def _prepare(q, k, v, o, causal: bool, scale: float, return_lse: bool, opts: FastOptions) -> Prepared:
    if opts.gluon:
        copy = descriptors.heads_in_columns(q, k, v) is None
        if copy:
            q, k, v = (descriptors.tma_ready(x) for x in (q, k, v))
        run = fast_gluon.bind(q, k, v, o, o, causal, scale, return_lse, opts)
    else:
        copy = opts.use_tma

        def run(q, k, v, o, lse):
            launch_triton(q, k, v, o, lse, causal, scale, return_lse, opts)
    return Prepared(descriptors.model_layout(q), copy, run, {})


def tuned_config(D: int, dtype: torch.dtype, N: int, H: int, causal: bool, use_tma: bool = True,
                 gluon: bool | None = None, overlap: bool = True, schedule: str = "auto",
                 consumers: int | None = None, B: int | None = None) -> dict | None:
    """The configuration autotuning picked in this process for an (N × N, H heads) problem, or None if not tuned
    yet. ``gluon``: which kernel's (None: the one ``fast`` uses by default here); ``use_tma``: the Triton
    kernel's; ``overlap``, ``schedule``, ``consumers``: the Gluon options that narrowed the candidates; ``B``:
    the batch (None: any)."""
    if gluon is None:
        gluon = gluon_available(dtype, D)
    for p, (picked, _) in tuner.picks("forward").items():
        if ((p.gluon, p.dtype, p.D, p.L, p.S, p.Hq, p.Hkv, p.causal) == (gluon, dtype, D, N, N, H, H, causal)
                and (B is None or p.B == B)
                and ((p.overlap, p.schedule, p.consumers) == (overlap, schedule, consumers) if gluon
                     else p.use_tma == use_tma)):
            return picked.tiles()
    return None


def attention_fast(q, k, v, *, causal=False, scale=None, return_lse=False, **options):
    """Forward attention, the course's fastest: q (B, Hq, L, D), k and v (B, Hkv, S, D) with Hq a multiple of
    Hkv, any D up to 256; ``causal`` as ``torch``'s ``is_causal`` (query i sees keys j <= i). Returns the
    (B, Hq, L, D) output and, with ``return_lse=True``, also the (B, Hq, L) float32 log-sum-exp of the scaled
    scores (natural log).

    Options: ``gluon`` (default on Hopper for 16-bit inputs, D = 64/128, L = S and Hq = Hkv: the Gluon kernel
    of ``fast_gluon.py``, unless other options need the Triton kernel; False: the Triton kernel; True: the Gluon
    kernel or a ValueError saying why not), ``autotune`` (GPU default: tune over :data:`GLUON_SPACE` or
    :data:`TUNING_SPACE`; giving any tile option turns it off), block_m, block_n, num_warps, num_stages (with
    Gluon: the K/V ring's slots), input_precision (float32 only: "ieee" by default as for every variant, or
    "tf32" for the tensor cores); for the Triton kernel only: use_tma (TMA descriptors; D a power of two >= 16),
    maxnreg (a cap on registers per thread, like the tiles an explicit choice that turns autotuning off); for
    the Gluon kernel only: overlap (default True; False waits for each product at once, for comparison),
    schedule ("auto": autotuning picks; "single", "specialized", "persistent": see ``fast_gluon.py``; with the
    last two, block_m is the rows of each consumer warpgroup and num_warps must be 4) and consumers (with those
    two: 2, or 3 at D = 64, consumer warpgroups per program; like the schedule, it narrows autotuning; None:
    autotuning's pick, or 2 with explicit tiles).
    """
    o, lse, _ = _forward(q, k, v, causal, scale, return_lse, options)
    return (o, lse) if return_lse else o


def forward_prepared(q, k, v, causal: bool, scale, options: dict):
    """``attention_fast(..., return_lse=True)``, and this problem's :class:`Prepared` (None on the ordinary path:
    the interpreter, a launch capture, tensor subclasses): (o, lse, prepared)."""
    return _forward(q, k, v, causal, scale, True, options)


def _forward(q, k, v, causal, scale, return_lse, options):
    key = (problem_key(q, k, v, causal, scale, return_lse, options)
           if runtime.MODE == "gpu" and launch_cache._captured is None else None)
    prepared = _PREPARED.get(key) if key is not None else None
    if prepared is not None:  # this problem's checks passed and its launch is bound: only the outputs are new
        B, Hq, L, D = q.shape
        o = (torch.empty((B, L, Hq, D), dtype=q.dtype, device=q.device).transpose(1, 2) if prepared.bnhd_output
             else torch.empty((B, Hq, L, D), dtype=q.dtype, device=q.device))  # as descriptors.empty_in_layout_of
        lse = torch.empty((B, Hq, L), dtype=torch.float32, device=q.device) if return_lse else o
        if prepared.copy:
            q, k, v = (descriptors.tma_ready(x) for x in (q, k, v))
        prepared.run(q, k, v, o, lse)
        return o, lse, prepared
    B, Hq, Hkv, L, S, D, scale_value = check_attention_inputs(q, k, v, variant="fast", causal=causal, scale=scale,
                                                              head_dims=HEAD_DIMS)
    if not isinstance(return_lse, bool):
        raise TypeError(f"fast: return_lse must be True or False, got {return_lse!r}")
    opts = resolve(q.dtype, D, causal, options, gluon_shapes=L == S and Hq == Hkv)
    o = descriptors.empty_in_layout_of(q)  # q a (B, L, H, D) view: o too, so that a model's o.transpose(1, 2) is free
    lse = torch.empty((B, Hq, L), dtype=torch.float32, device=q.device) if return_lse else o  # o: unused then
    ran = launch(q, k, v, o, lse, causal, scale_value, return_lse, opts)
    if key is not None:
        if len(_PREPARED) >= _MAX_PREPARED:
            _PREPARED.clear()
        prepared = _PREPARED[key] = _prepare(q, k, v, o, causal, scale_value, return_lse, ran)
    return o, lse, prepared
