"""The fast backward pass (notebook 12): FlashAttention-2's backward, tuned for Hopper.

The algorithm is the teaching kernel's (``backward.py``); what changes, as in ``fast.py``'s forward:

* ``exp2`` with ``log2(e)`` folded into the scale: ``pij = exp2(sij · qk_scale − lse_i · log2 e)``;
* the loops split into stages: blocks that need no mask run without ``tl.where``; only the causal
  diagonal and the ragged tails pay for it;
* ``tl.dot(a, b, acc)`` accumulating in place; the dK/dV kernel computes the transposed tiles
  ``sijᵀ = kj · qiᵀ`` so that ``pijᵀ`` and ``dsijᵀ`` are the left operands of ``dV += pijᵀ · doi`` and
  ``dK += dsijᵀ · qi`` straight from registers (no transpose through shared memory);
* ``USE_TMA``: Q, K, V and dO tiles arrive through tensor descriptors (Hopper's TMA engine);
* autotuned tiles per head dimension (:data:`DKDV_SPACE`, :data:`DQ_SPACE`, pruned to what fits);
* what the issue asks beyond ``backward.py``: L ≠ S (causal aligned top-left, as torch's ``is_causal``),
  grouped-query attention (a K/V head's dK and dV summed over its group of query heads inside one
  program: no atomics, no copies of K and V), and any head dimension up to 256 (tiles padded to a power
  of two, loads and stores masked).

dQ, two ways (``dq_mode``):

* ``"kernel"``: a second kernel, one program per Q block, recomputing ``sij`` and ``dpij``: seven matrix
  products instead of five, deterministic;
* ``"atomic"``: the dK/dV kernel also computes ``dsij · kj`` and adds it into a float32 buffer with
  atomic adds (through the TMA engine's bulk reductions where there are descriptors): five products,
  the sum's order varies from run to run. FlashAttention-2 and -3 do this.

On a Hopper GPU the default (``gluon``) is neither: ``fast_backward_gluon.py`` computes dK, dV and dQ in one
warp-specialized Gluon kernel (atomic dQ, five products), where the problem allows it (16-bit, D = 64 or
128, L = S, no grouped heads, N a multiple of 128); everything else runs the Triton kernels.

The interpreter (CPU) runs the same Triton kernels with plain pointer loads.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from flashattn import runtime
from flashattn.validate import check_attention_inputs, check_o_lse_do

from . import descriptors, device, launch_cache, tuner
from .constants import LOG2_E
from .fast_options import (  # noqa: F401  (the backward's options, re-exported for its callers)
    ATOMIC_DKDV_SPACE,
    DEFAULT_DQ_MODE,
    DKDV_SPACE,
    DQ_MODES,
    DQ_SPACE,
    FastOptions,
    padded_head_dim,
    resolve_backward,
    tuning_space,
)
from .fast_options import backward_default_options as default_options  # noqa: F401

try:  # Gluon, complete per triton_compat: the Hopper kernel
    from . import fast_backward_gluon
except ImportError:  # pragma: no cover
    fast_backward_gluon = None


@triton.jit
def _rows(X, row0, start, n_rows, D: tl.constexpr, D_PAD: tl.constexpr, BLOCK: tl.constexpr,
          USE_TMA: tl.constexpr):
    """Rows ``start .. start + BLOCK`` of one head's (n_rows, D) matrix, D_PAD columns wide.

    With TMA, ``X`` is a descriptor over every head as one (heads·n_rows, D) matrix and ``row0`` the
    head's first row: rows past ``n_rows`` belong to the next head (the caller masks what they touch).
    Without, rows past ``n_rows`` and columns past D read as zeros.
    """
    if USE_TMA:
        return X.load([row0 + start, 0])
    else:  # 64-bit row numbers: the interpreter checks 32-bit index arithmetic for overflow, at a cost
        offs = (start + tl.arange(0, BLOCK)).to(tl.int64)
        offs_d = tl.arange(0, D_PAD)
        ptrs = X + (row0 + offs)[:, None] * D + offs_d[None, :]
        return tl.load(ptrs, mask=(offs[:, None] < n_rows) & (offs_d[None, :] < D), other=0.0)


@triton.jit
def bwd_preprocess_fast(O, DO, DELTA, DQ_ACC, H, L, stride_ob, stride_oh, stride_on, stride_dob, stride_doh,
                        stride_don, stride_ab, stride_ah, stride_an,
                        D: tl.constexpr, D_PAD: tl.constexpr, BLOCK: tl.constexpr, ZERO_DQ: tl.constexpr):
    """``delta = rowsum(dO ∘ O)`` for BLOCK rows of one head, grid (row blocks, B·H): O and dO (B, H, L, D) through
    their strides (the last one 1, so that a model's (B, L, H, D) layout is read in place), delta (B, H, L). With
    ``ZERO_DQ``, the same rows of DQ_ACC (B, H, L, D) float32 are zeroed too, through its strides: the sums that
    the backward kernel adds dQ into, cleared here rather than by a launch of their own."""
    pid_m, pid_bh = tl.program_id(0), tl.program_id(1)
    off_b, off_h = (pid_bh // H).to(tl.int64), (pid_bh % H).to(tl.int64)
    offs = pid_m * BLOCK + tl.arange(0, BLOCK)
    offs_d = tl.arange(0, D_PAD)
    rows = offs.to(tl.int64)[:, None]
    ok = (offs[:, None] < L) & (offs_d[None, :] < D)
    oi = tl.load(O + off_b * stride_ob + off_h * stride_oh + rows * stride_on + offs_d[None, :], mask=ok, other=0.0)
    doi = tl.load(DO + off_b * stride_dob + off_h * stride_doh + rows * stride_don + offs_d[None, :], mask=ok,
                  other=0.0)
    tl.store(DELTA + pid_bh.to(tl.int64) * L + offs, tl.sum(oi.to(tl.float32) * doi.to(tl.float32), axis=1),
             mask=offs < L)
    if ZERO_DQ:
        tl.store(DQ_ACC + off_b * stride_ab + off_h * stride_ah + rows * stride_an + offs_d[None, :],
                 tl.zeros([BLOCK, D_PAD], tl.float32), mask=ok)


@triton.jit
def bwd_dq_finish(DQ_ACC, DQ, numel, scale, BLOCK: tl.constexpr):
    """dQ = scale · the float32 sums of atomic dQ, in the inputs' dtype: one pass (cuDNN's convert_dq_to_16bits)."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < numel
    tl.store(DQ + offs, (tl.load(DQ_ACC + offs, mask=ok) * scale).to(DQ.dtype.element_ty), mask=ok)


@triton.jit
def _dkdv_blocks(dkj, dvj, kj, vj, Q, DO, LSE, DELTA, DQ_ACC, DQ_DESC, q_row0, lo, hi, offs_n, L, S, qk_scale,
                 D: tl.constexpr, D_PAD: tl.constexpr, BLOCK_M: tl.constexpr, MASK: tl.constexpr,
                 CAUSAL: tl.constexpr, USE_TMA: tl.constexpr, DQ_ATOMIC: tl.constexpr, PRECISION: tl.constexpr):
    """Q blocks ``lo .. hi`` of one query head against this program's K/V block, in transposed tiles
    (keys along the rows): ``dvj += pijᵀ·doi``, ``dkj += dsijᵀ·qi`` (and, with DQ_ATOMIC, ``dqi += dsij·kj``)."""
    for start_m in tl.range(lo, hi, BLOCK_M):
        start_m = tl.multiple_of(start_m, BLOCK_M)
        offs_m = start_m + tl.arange(0, BLOCK_M)
        qi = _rows(Q, q_row0, start_m, L, D, D_PAD, BLOCK_M, USE_TMA)
        doi = _rows(DO, q_row0, start_m, L, D, D_PAD, BLOCK_M, USE_TMA)
        row_ok = offs_m < L
        lse_i = tl.load(LSE + q_row0 + offs_m, mask=row_ok, other=0.0) * LOG2_E
        delta_i = tl.load(DELTA + q_row0 + offs_m, mask=row_ok, other=0.0)
        sijT = tl.dot(kj, tl.trans(qi), input_precision=PRECISION)
        pijT = tl.exp2(sijT * qk_scale - lse_i[None, :])
        if MASK:
            keep = row_ok[None, :] & (offs_n[:, None] < S)
            if CAUSAL:
                keep = keep & (offs_n[:, None] <= offs_m[None, :])
            pijT = tl.where(keep, pijT, 0.0)
        dvj = tl.dot(pijT.to(doi.dtype), doi, dvj, input_precision=PRECISION)
        dpijT = tl.dot(vj, tl.trans(doi), input_precision=PRECISION)
        dsijT = (pijT * (dpijT - delta_i[None, :])).to(qi.dtype)
        dkj = tl.dot(dsijT, qi, dkj, input_precision=PRECISION)
        if DQ_ATOMIC:
            dqi = tl.dot(tl.trans(dsijT), kj, input_precision=PRECISION)
            if USE_TMA:  # a bulk reduction by the TMA engine; rows past L add zeros to the next head
                DQ_DESC.atomic_add([q_row0 + start_m, 0], dqi)
            else:
                offs_d = tl.arange(0, D_PAD)
                ptrs = DQ_ACC + (q_row0 + offs_m).to(tl.int64)[:, None] * D + offs_d[None, :]
                tl.atomic_add(ptrs, dqi, mask=row_ok[:, None] & (offs_d[None, :] < D), sem="relaxed")
    return dkj, dvj


@triton.jit
def bwd_dkdv_fast(
    Q, K, V, DO, DK, DV, LSE, DELTA, DQ_ACC, DQ_DESC,
    L, S, HQ, HKV, qk_scale, scale,
    D: tl.constexpr, D_PAD: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP: tl.constexpr,
    CAUSAL: tl.constexpr, USE_TMA: tl.constexpr, DQ_ATOMIC: tl.constexpr, PRECISION: tl.constexpr,
):
    """dK and dV of one K/V block of one K/V head, summed over the GROUP query heads that share it."""
    pid_n, pid_bh = tl.program_id(0), tl.program_id(1)  # K/V block, batch·(K/V head)
    off_b, off_hk = pid_bh // HKV, pid_bh % HKV
    start_n = pid_n * BLOCK_N
    offs_n = start_n + tl.arange(0, BLOCK_N)
    kv_row0 = pid_bh * S
    kj = _rows(K, kv_row0, start_n, S, D, D_PAD, BLOCK_N, USE_TMA)
    vj = _rows(V, kv_row0, start_n, S, D, D_PAD, BLOCK_N, USE_TMA)
    dkj = tl.zeros([BLOCK_N, D_PAD], tl.float32)
    dvj = tl.zeros([BLOCK_N, D_PAD], tl.float32)

    L_full = (L // BLOCK_M) * BLOCK_M
    if CAUSAL:  # query m sees key n iff n <= m: Q blocks before this K/V block see none of it
        lo = (start_n // BLOCK_M) * BLOCK_M
        diag_end = tl.cdiv(start_n + BLOCK_N, BLOCK_M) * BLOCK_M  # from here on, every row sees every key
    else:
        lo = 0
        diag_end = 0
    if DQ_ATOMIC:  # keys past S must not add into dQ: the ragged last K/V block is masked throughout
        diag_end = tl.where(start_n + BLOCK_N > S, tl.cdiv(L, BLOCK_M) * BLOCK_M, diag_end)
    for g in range(GROUP):
        q_row0 = (off_b * HQ + off_hk * GROUP + g) * L
        # the causal diagonal, masked
        dkj, dvj = _dkdv_blocks(dkj, dvj, kj, vj, Q, DO, LSE, DELTA, DQ_ACC, DQ_DESC, q_row0, lo,
                                tl.minimum(diag_end, L), offs_n, L, S, qk_scale, D=D, D_PAD=D_PAD,
                                BLOCK_M=BLOCK_M, MASK=True, CAUSAL=CAUSAL, USE_TMA=USE_TMA,
                                DQ_ATOMIC=DQ_ATOMIC, PRECISION=PRECISION)
        # full Q blocks whose every row sees every key of this block: no mask
        dkj, dvj = _dkdv_blocks(dkj, dvj, kj, vj, Q, DO, LSE, DELTA, DQ_ACC, DQ_DESC, q_row0, diag_end,
                                L_full, offs_n, L, S, qk_scale, D=D, D_PAD=D_PAD, BLOCK_M=BLOCK_M,
                                MASK=False, CAUSAL=CAUSAL, USE_TMA=USE_TMA, DQ_ATOMIC=DQ_ATOMIC,
                                PRECISION=PRECISION)
        # the ragged last Q block (where the diagonal did not cover it), masked
        dkj, dvj = _dkdv_blocks(dkj, dvj, kj, vj, Q, DO, LSE, DELTA, DQ_ACC, DQ_DESC, q_row0,
                                tl.maximum(diag_end, L_full), L, offs_n, L, S, qk_scale, D=D, D_PAD=D_PAD,
                                BLOCK_M=BLOCK_M, MASK=True, CAUSAL=CAUSAL, USE_TMA=USE_TMA,
                                DQ_ATOMIC=DQ_ATOMIC, PRECISION=PRECISION)

    offs_d = tl.arange(0, D_PAD)
    ptrs = (kv_row0 + offs_n).to(tl.int64)[:, None] * D + offs_d[None, :]
    ok = (offs_n[:, None] < S) & (offs_d[None, :] < D)
    tl.store(DK + ptrs, (dkj * scale).to(DK.dtype.element_ty), mask=ok)
    tl.store(DV + ptrs, dvj.to(DV.dtype.element_ty), mask=ok)


@triton.jit
def _dq_blocks(dqi, qi, doi, lse_i, delta_i, K, V, kv_row0, lo, hi, offs_m, S, qk_scale,
               D: tl.constexpr, D_PAD: tl.constexpr, BLOCK_N: tl.constexpr, MASK: tl.constexpr,
               CAUSAL: tl.constexpr, USE_TMA: tl.constexpr, PRECISION: tl.constexpr):
    """K/V blocks ``lo .. hi`` against this program's Q block: ``dqi += dsij · kj``."""
    for start_n in tl.range(lo, hi, BLOCK_N):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        kj = _rows(K, kv_row0, start_n, S, D, D_PAD, BLOCK_N, USE_TMA)
        vj = _rows(V, kv_row0, start_n, S, D, D_PAD, BLOCK_N, USE_TMA)
        sij = tl.dot(qi, tl.trans(kj), input_precision=PRECISION)
        pij = tl.exp2(sij * qk_scale - lse_i[:, None])
        if MASK:
            offs_n = start_n + tl.arange(0, BLOCK_N)
            keep = offs_n[None, :] < S
            if CAUSAL:
                keep = keep & (offs_n[None, :] <= offs_m[:, None])
            pij = tl.where(keep, pij, 0.0)
        dpij = tl.dot(doi, tl.trans(vj), input_precision=PRECISION)
        dsij = pij * (dpij - delta_i[:, None])
        dqi = tl.dot(dsij.to(kj.dtype), kj, dqi, input_precision=PRECISION)
    return dqi


@triton.jit
def bwd_dq_fast(
    Q, K, V, DO, DQ, LSE, DELTA,
    L, S, HQ, HKV, qk_scale, scale,
    D: tl.constexpr, D_PAD: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP: tl.constexpr,
    CAUSAL: tl.constexpr, USE_TMA: tl.constexpr, PRECISION: tl.constexpr,
):
    """dQ of one Q block of one query head (rows are independent: rows past L are computed, not stored)."""
    pid_m, pid_bh = tl.program_id(0), tl.program_id(1)  # Q block, batch·(query head)
    if CAUSAL:  # the heaviest Q blocks (the last rows) first
        pid_m = tl.num_programs(0) - 1 - pid_m
    start_m = pid_m * BLOCK_M
    offs_m = start_m + tl.arange(0, BLOCK_M)
    q_row0 = pid_bh * L
    kv_row0 = (pid_bh // HQ * HKV + pid_bh % HQ // GROUP) * S
    qi = _rows(Q, q_row0, start_m, L, D, D_PAD, BLOCK_M, USE_TMA)
    doi = _rows(DO, q_row0, start_m, L, D, D_PAD, BLOCK_M, USE_TMA)
    row_ok = offs_m < L
    lse_i = tl.load(LSE + q_row0 + offs_m, mask=row_ok, other=0.0) * LOG2_E
    delta_i = tl.load(DELTA + q_row0 + offs_m, mask=row_ok, other=0.0)
    dqi = tl.zeros([BLOCK_M, D_PAD], tl.float32)

    S_full = (S // BLOCK_N) * BLOCK_N
    if CAUSAL:  # keys before this block's first query are seen by all its rows; the diagonal is masked
        mid = tl.minimum((start_m // BLOCK_N) * BLOCK_N, S_full)
        hi = tl.minimum(start_m + BLOCK_M, S)
    else:
        mid = S_full
        hi = S
    dqi = _dq_blocks(dqi, qi, doi, lse_i, delta_i, K, V, kv_row0, 0, mid, offs_m, S, qk_scale, D=D, D_PAD=D_PAD,
                     BLOCK_N=BLOCK_N, MASK=False, CAUSAL=CAUSAL, USE_TMA=USE_TMA, PRECISION=PRECISION)
    dqi = _dq_blocks(dqi, qi, doi, lse_i, delta_i, K, V, kv_row0, mid, hi, offs_m, S, qk_scale, D=D, D_PAD=D_PAD,
                     BLOCK_N=BLOCK_N, MASK=True, CAUSAL=CAUSAL, USE_TMA=USE_TMA, PRECISION=PRECISION)

    offs_d = tl.arange(0, D_PAD)
    ptrs = (q_row0 + offs_m).to(tl.int64)[:, None] * D + offs_d[None, :]
    tl.store(DQ + ptrs, (dqi * scale).to(DQ.dtype.element_ty), mask=row_ok[:, None] & (offs_d[None, :] < D))


JIT_KERNELS = (bwd_preprocess_fast, bwd_dkdv_fast, bwd_dq_fast, bwd_dq_finish)


# --- the launches ---------------------------------------------------------------------------------------

MAX_HEAD_DIM = 256


def gluon_refusal(q, k, v, do, causal: bool, options: dict) -> str | None:
    """None if the Gluon kernel runs this problem (contiguous inputs) with these options, else why it does not."""
    if fast_backward_gluon is None or not device.hopper():
        return "a Hopper GPU (sm_90) with Gluon"
    given = [key for key in options if key != "gluon"]  # every other option is the Triton kernels'
    if given:
        return f"none of the Triton kernels' options (got {', '.join(given)})"
    why = fast_backward_gluon.applies(q, k, causal)
    if why is not None:
        return f"a problem it takes, not {why}"
    if not all(t.data_ptr() % 16 == 0 for t in (q, k, v, do)):
        return "16-byte-aligned tensors (TMA)"
    return None


def check_inputs(q, k, v, o, lse, do, *, causal, scale, shapes_only=False):
    """q (B, Hq, L, D); k, v (B, Hkv, S, D) with Hq a multiple of Hkv, as the forward checks them; o and do
    like q; lse (B, Hq, L) float32 (``shapes_only``: the operator's fake implementation, meta tensors accepted).
    Returns (B, Hq, Hkv, L, S, D, scale)."""
    if isinstance(q, torch.Tensor) and q.dim() == 4 and q.shape[-1] > MAX_HEAD_DIM:
        raise ValueError(f"fast backward: head dimension D={q.shape[-1]} is not supported; accepted: 1 to {MAX_HEAD_DIM}")
    B, HQ, HKV, L, S, D, scale = check_attention_inputs(q, k, v, variant="fast backward", causal=causal, scale=scale,
                                                        head_dims=range(1, MAX_HEAD_DIM + 1), shapes_only=shapes_only)
    check_o_lse_do(q, o, lse, do, variant="fast backward")
    return B, HQ, HKV, L, S, D, scale


def _launch(kernel: str, fn, grid, tensors: dict, scalars: tuple, constexprs: dict, tiles, tune: bool, problem: tuple,
            use_tma: bool, zero=None) -> None:
    """Launch ``fn`` with fixed ``tiles`` (block_m, block_n, warps, stages), or, with ``tune``, the tuner's pick for
    ``problem`` over ``tuning_space`` (tuned on the first call). ``zero``: a buffer the kernel adds into, zeroed
    before every run (the tuner runs each candidate several times)."""
    rows = {"Q": 0, "DO": 0, "DQ_DESC": 0, "K": 1, "V": 1}  # which block size each descriptor's tiles follow

    def run(tiles):
        bm, bn, warps, stages = tiles
        args = dict(tensors)
        if use_tma:
            for name, which in rows.items():
                if args.get(name) is not None:
                    args[name] = descriptors.rows(args[name], (bm, bn)[which])
        if zero is not None:
            zero.zero_()
        launch_cache.launch(fn, grid(bm, bn), (*args.values(), *scalars), dict(constexprs, BLOCK_M=bm, BLOCK_N=bn),
                            num_warps=warps, num_stages=stages)

    if tune:
        D, dtype, atomic = constexprs["D"], tensors["Q"].dtype, constexprs.get("DQ_ATOMIC", False)
        tiles = tuner.pick((kernel, *problem), tuning_space(kernel, D, dtype, atomic), run)
    run(tiles)


def picked_tiles(kernel: str, **problem) -> tuple | None:
    """The tiles autotuning picked for ``kernel`` ("dkdv"/"dq") on a problem in this process (None: not tuned)."""
    for key, (tiles, _) in tuner.picks(kernel).items():
        if all(dict(key[1:]).get(k) == v for k, v in problem.items()):
            return tiles
    return None


def bind_delta(o: torch.Tensor, do: torch.Tensor, sums: torch.Tensor | None = None):
    """:func:`delta_rows` for tensors with the shapes, strides, dtypes and alignment of ``o`` and ``do``: a function
    ``run(o, do) -> delta`` that launches the compiled kernel directly after its first call. With ``sums`` (the
    backward's float32 sums of dQ, (B, H, L, D) like o): ``run(o, do, sums)``, which also zeroes ``sums``, a tensor
    with the strides of the one given."""
    D = o.shape[-1]
    D_PAD = padded_head_dim(D)
    shape, device = o.shape[:-1], o.device
    in_place = o.dim() == 4 and o.stride(-1) == 1 and do.stride(-1) == 1
    if not in_place:
        o, do = o.contiguous().view(1, 1, -1, D), do.contiguous().view(1, 1, -1, D)
    B, H, L = o.shape[:3]
    block = max(16, min(128, 8192 // D_PAD))
    zero_here = sums is not None and in_place and sums.stride(-1) == 1
    kernel = launch_cache.bind(bwd_preprocess_fast, (triton.cdiv(L, block), B * H),
                               dict(D=D, D_PAD=D_PAD, BLOCK=block, ZERO_DQ=zero_here))
    tail = (H, L, *o.stride()[:3], *do.stride()[:3], *(sums.stride()[:3] if zero_here else (0, 0, 0)))

    def run(o, do, sums=None):
        delta = torch.empty(shape, dtype=torch.float32, device=device)
        if not in_place:
            o, do = o.contiguous().view(1, 1, -1, D), do.contiguous().view(1, 1, -1, D)
        elif sums is not None and not zero_here:
            sums.zero_()
        kernel(o, do, delta, sums if zero_here else delta, *tail)
        return delta

    return run


def delta_rows(o: torch.Tensor, do: torch.Tensor) -> torch.Tensor:
    """``delta = rowsum(dO ∘ O)``, (…, L) float32 and contiguous, for ``o`` and ``do`` (B, H, L, D) with any strides
    whose last is 1 (read in place), or of any other shape (…, L, D) (read as one (rows, D) matrix)."""
    return bind_delta(o, do)(o, do)


FINISH_BLOCK = 4096


def bind_finish(numel: int, dtype: torch.dtype, scale: float):
    """:func:`finish_dq` for ``numel`` sums (dense, 16-byte aligned): ``run(dq_acc) -> dq``."""
    kernel = launch_cache.bind(bwd_dq_finish, (triton.cdiv(numel, FINISH_BLOCK),), dict(BLOCK=FINISH_BLOCK))

    def run(dq_acc):
        dq = torch.empty_like(dq_acc, dtype=dtype)  # dq_acc's strides (dense: one flat pass over both)
        kernel(dq_acc, dq, numel, scale)
        return dq

    return run


def finish_dq(dq_acc: torch.Tensor, dtype: torch.dtype, scale: float) -> torch.Tensor:
    """``scale · dq_acc`` (the float32 sums of atomic dQ) in ``dtype``, by :func:`bwd_dq_finish`."""
    return bind_finish(dq_acc.numel(), dtype, scale)(dq_acc)


_PREPARED: dict = {}  # problem_key -> run(q, k, v, o, lse, do) for the Gluon path
_MAX_PREPARED = 256


def problem_key(q, k, v, o, lse, do, causal, scale, options: dict):
    """As ``fast.problem_key``, over the backward's six tensors; None for the ordinary path."""
    return launch_cache.problem_key((q, k, v, o, lse, do), (causal, scale), options)


def _bind_gluon(q, k, v, o, lse, do, causal: bool, scale: float):
    """The Gluon path of :func:`attention_backward_fast` for one problem, bound: ``run(q, k, v, o, lse, do)``."""
    copy = descriptors.heads_in_columns(q, k, v, do) is None
    if copy:
        q, k, v, do = (descriptors.tma_ready(t) for t in (q, k, v, do))
    lse_copy = not lse.is_contiguous() or lse.data_ptr() % 16
    if lse_copy:
        lse = lse.clone(memory_format=torch.contiguous_format)
    B, H, N, D = q.shape
    sums_shape, in_columns = ((B, N, H, D), True) if descriptors.heads_in_columns(q, k, v, do) else ((B, H, N, D), False)
    device = q.device  # (run keeps no tensor of the first call: a prepared problem outlives it)

    def new_sums():  # dQ's float32 sums, laid out as the inputs (fast_backward_gluon.bind); bwd_preprocess zeroes them
        t = torch.empty(sums_shape, dtype=torch.float32, device=device)
        return t.transpose(1, 2) if in_columns else t

    delta_run = bind_delta(o, do, new_sums())
    delta = torch.empty(o.shape[:-1], dtype=torch.float32, device=o.device)  # (a template: delta_run makes each)
    kernel = fast_backward_gluon.bind(q, k, v, lse, do, delta, causal=causal, scale=scale)
    finish = bind_finish(q.numel(), q.dtype, scale)

    def run(q, k, v, o, lse, do):
        inputs = q, k, v
        if copy:
            q, k, v, do = (descriptors.tma_ready(t) for t in (q, k, v, do))
        if lse_copy:
            lse = lse.clone(memory_format=torch.contiguous_format)
        sums = new_sums()
        delta = delta_run(o, do, sums)
        dq_acc, dk, dv = kernel(q, k, v, lse, do, delta, sums)
        grads = finish(dq_acc), dk, dv
        if copy:  # read in place, the gradients are laid out as the inputs already (descriptors.model_layout)
            grads = tuple(descriptors.in_layout_of(g, x) for g, x in zip(grads, inputs, strict=True))
        return grads

    return run


def _keyed() -> bool:
    return runtime.MODE == "gpu" and launch_cache._captured is None


def _gluon_run(q, k, v, o, lse, do, causal, scale, options: dict):
    """The checks, then the Gluon path bound for these tensors (:func:`_bind_gluon`), or None where the Triton
    kernels run the problem (:func:`gluon_refusal`; ``gluon=True`` there is a ValueError saying why)."""
    scale = check_inputs(q, k, v, o, lse, do, causal=causal, scale=scale)[-1]
    opts = resolve_backward(q.dtype, q.shape[-1], options)
    if opts.gluon is False:
        return None
    why_not = gluon_refusal(q, k, v, do, causal, options)
    if why_not is not None and opts.gluon:
        raise ValueError(f"fast backward: gluon=True needs {why_not}")
    return _bind_gluon(q, k, v, o, lse, do, causal, scale) if why_not is None else None


_TRITON_PATH = object()  # a prepared problem that the Triton kernels run (its checks passed)


def prepared(q, k, v, o, lse, do, causal, scale, options: dict):
    """This problem's bound Gluon backward, ``run(q, k, v, o, lse, do) -> (dq, dk, dv)``: checked and bound on first
    use, then kept under its :func:`problem_key`; None where the ordinary path runs it (the Triton kernels, the
    interpreter, a launch capture, tensor subclasses)."""
    key = problem_key(q, k, v, o, lse, do, causal, scale, options) if _keyed() else None
    if key is None:
        return None
    run = _PREPARED.get(key)
    if run is None:
        run = _gluon_run(q, k, v, o, lse, do, causal, scale, options) or _TRITON_PATH
        if len(_PREPARED) >= _MAX_PREPARED:
            _PREPARED.clear()
        _PREPARED[key] = run
    return None if run is _TRITON_PATH else run


def attention_backward_fast(q, k, v, o, lse, do, *, causal=False, scale=None, **options):
    """dQ, dK, dV of ``o = attention(q, k, v)`` given ``do``, from the forward's output ``o`` and its
    (B, Hq, L) float32 log-sum-exp ``lse`` (``attention_fast(..., return_lse=True)``).

    q (B, Hq, L, D); k, v (B, Hkv, S, D), Hq a multiple of Hkv (grouped-query attention: dK and dV of a K/V
    head sum over its query heads); causal aligned top-left (query i sees keys j <= i); D from 1 to 256.
    Options: ``dq_mode`` ("kernel" or "atomic", see the module docstring), ``autotune`` (GPU default),
    ``dkdv_tiles`` and ``dq_tiles`` ((block_m, block_n, num_warps, num_stages): fixed tiles for that kernel,
    instead of autotuning), ``use_tma`` (Hopper default, used where D is a power of two >= 16),
    ``input_precision`` (float32 only), ``gluon`` (None: ``fast_backward_gluon.py``'s kernel where it applies,
    see :func:`gluon_refusal`; True: that kernel or a ValueError saying why not; False: the Triton kernels).
    """
    run = prepared(q, k, v, o, lse, do, causal, scale, options)
    if run is None and not _keyed():  # no key (the interpreter, a launch capture): the Gluon path unkept
        run = _gluon_run(q, k, v, o, lse, do, causal, scale, options)
    if run is not None:
        return run(q, k, v, o, lse, do)
    B, HQ, HKV, L, S, D, scale = check_inputs(q, k, v, o, lse, do, causal=causal, scale=scale)
    opts = resolve_backward(q.dtype, D, options)
    D_PAD = padded_head_dim(D)
    lse = lse.contiguous()
    inputs = q, k, v  # each gradient is laid out as its input (descriptors.model_layout)

    q, k, v, o, do = (t if t.is_contiguous() else t.contiguous() for t in (q, k, v, o, do))
    delta = delta_rows(o, do)

    atomic = opts.dq_mode == "atomic"
    use_tma = opts.use_tma and D == D_PAD and all(t.data_ptr() % 16 == 0 for t in (q, k, v, do))
    if use_tma and max(B * HQ * L, B * HKV * S) >= 2**31:
        use_tma = False  # descriptors address rows with 32-bit coordinates
    dq = torch.empty_like(q)
    dk, dv = torch.empty_like(k), torch.empty_like(v)
    dq_acc = torch.empty((B, HQ, L, D), dtype=torch.float32, device=q.device) if atomic else None
    precision = opts.input_precision if q.dtype == torch.float32 else "tf32"
    common = dict(D=D, D_PAD=D_PAD, GROUP=HQ // HKV, CAUSAL=causal, USE_TMA=use_tma, PRECISION=precision)
    scalars = (L, S, HQ, HKV, scale * LOG2_E.value, scale)
    problem = (("D", D), ("dtype", q.dtype), ("L", L), ("S", S), ("B", B), ("HQ", HQ), ("HKV", HKV),
               ("causal", causal), ("use_tma", use_tma), ("atomic", atomic))
    dkdv_tiles = opts.dkdv_tiles or tuning_space("dkdv", D, q.dtype, atomic)[0]
    _launch("dkdv", bwd_dkdv_fast, lambda bm, bn: (triton.cdiv(S, bn), B * HKV),
            dict(Q=q, K=k, V=v, DO=do, DK=dk, DV=dv, LSE=lse, DELTA=delta, DQ_ACC=dq_acc,
                 DQ_DESC=dq_acc if use_tma and atomic else None),
            scalars, dict(common, DQ_ATOMIC=atomic), dkdv_tiles, opts.autotune and opts.dkdv_tiles is None, problem,
            use_tma, zero=dq_acc)
    if atomic:
        dq = finish_dq(dq_acc, q.dtype, scale)
        return tuple(descriptors.in_layout_of(g, x) for g, x in zip((dq, dk, dv), inputs, strict=True))
    dq_tiles = opts.dq_tiles or tuning_space("dq", D, q.dtype)[0]
    _launch("dq", bwd_dq_fast, lambda bm, bn: (triton.cdiv(L, bm), B * HQ),
            dict(Q=q, K=k, V=v, DO=do, DQ=dq, LSE=lse, DELTA=delta),
            scalars, common, dq_tiles, opts.autotune and opts.dq_tiles is None, problem, use_tma)
    return tuple(descriptors.in_layout_of(g, x) for g, x in zip((dq, dk, dv), inputs, strict=True))
