"""The fast kernel: v2, plus what Hopper and Triton offer, one switch per idea.

Same loop as ``v2`` (one program per (Q block, batch·head), ``acc``/``mi``/``li`` in registers,
deferred normalization), with these changes, each a constexpr switch so that notebook 10 can
measure them one at a time:

* ``exp2`` with ``log2(e)`` folded into the scale, applied with one multiply-add per score
  (``sij * qk_scale - mi_new``); the running max is kept in the same scaled base-2 units.
* The key loop split into stages: blocks that need no mask run without one; only the causal
  diagonal and the ragged tail (N not a multiple of BLOCK_N) pay for ``tl.where``. Causal programs
  start with the longest rows (heaviest Q blocks first) so that the last wave is short.
* ``tl.dot(pij, vj, acc)``: the tensor cores accumulate in place.
* ``USE_TMA``: K and V tiles arrive through tensor descriptors (Hopper's TMA engine copies a whole
  tile into shared memory, with its swizzle, without the threads computing addresses).
* ``FAST_EXP``: ``exp2`` computed on packed 16-bit pairs (``ex2.approx.f16x2`` / ``.bf16x2``): the
  special-function unit does two per instruction. P is rounded to 16 bits for the second product
  anyway, so only the exponent's argument loses precision (about 2^-11 relative for fp16).
* ``WARP_SPECIALIZE``: Triton splits the loop between producer warps (loads) and consumer warps
  (on Hopper only with descriptors made in the kernel, so this switch makes them there).
* ``LAZY_RESCALE``: rescale ``acc`` only when a row's max has grown a lot (FlashAttention-4).
* ``PREFETCH_SCORES``: issue the next block's ``qi · kjᵀ`` before this block's softmax.

Launch side: ``maxnreg`` caps the registers per thread, so that two programs fit on one SM.

``gluon`` (the default on Hopper for 16-bit inputs and D = 64 or 128): the same loop written in Gluon
(``fast_gluon.py``), which issues the tensor-core products asynchronously and overlaps one block's
softmax with the previous block's ``p · v`` (FlashAttention-3's intra-warpgroup overlap). Its
``schedule``: "single" (one warpgroup per program), "specialized" (a producer warp and ``consumers`` = 2 or 3
consumer warpgroups per program sharing each K/V tile, registers moved to the consumers with ``setmaxnreg``)
or "persistent" (the same, one program per SM looping over the tiles); by default ("auto") autotuning picks
one per problem. The switches above belong to the Triton kernel (``gluon=False``).

It also returns the log-sum-exp of every row (natural log), which a backward pass needs.

The interpreter (CPU) runs the same kernel with plain pointer loads and ``tl.exp2``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from flashattn import runtime
from flashattn.validate import TILE_KEYS, check_kernel_inputs, resolve_options

try:  # Gluon, Triton's lower-level language, is in recent releases only; without it, fast uses the Triton kernel
    from . import fast_gluon
except ImportError:
    fast_gluon = None

LOG2_E = 1.4426950408889634


@triton.jit
def _load_rows(X, row0, start, N, stride_n, stride_d,
               BLOCK: tl.constexpr, D: tl.constexpr, USE_TMA: tl.constexpr):
    """Rows ``start .. start + BLOCK`` of one head's (N, D) matrix.

    With TMA, ``X`` is a descriptor over all heads as one (B·H·N, D) matrix and ``row0`` the head's
    first row: rows past N belong to the next head (or read as zeros at the very end); the caller
    masks them. Without TMA, ``X`` points at the head's first element and rows past N read as zeros.
    """
    if USE_TMA:
        return X.load([row0 + start, 0])
    else:
        offs = start + tl.arange(0, BLOCK)
        ptrs = X + offs[:, None] * stride_n + tl.arange(0, D)[None, :] * stride_d
        return tl.load(ptrs, mask=offs[:, None] < N, other=0.0)


@triton.jit
def _exp2(x, DTYPE: tl.constexpr, FAST_EXP: tl.constexpr):
    """2**x, as float32 (``tl.exp2``) or, with FAST_EXP, as DTYPE computed two at a time."""
    if FAST_EXP:
        if DTYPE == tl.float16:
            return tl.inline_asm_elementwise("ex2.approx.f16x2 $0, $1;", "=r,r", [x.to(tl.float16)],
                                             dtype=tl.float16, is_pure=True, pack=2)
        else:
            return tl.inline_asm_elementwise("ex2.approx.ftz.bf16x2 $0, $1;", "=r,r", [x.to(tl.bfloat16)],
                                             dtype=tl.bfloat16, is_pure=True, pack=2)
    else:
        return tl.exp2(x)


@triton.jit
def _update(acc, li, mi, sij, V, kv_row0, start_n, offs_m, N, stride_vn, stride_vd, qk_scale,
            BLOCK_N: tl.constexpr, D: tl.constexpr, MASK: tl.constexpr, CAUSAL: tl.constexpr,
            USE_TMA: tl.constexpr, FAST_EXP: tl.constexpr, LAZY_RESCALE: tl.constexpr,
            PRECISION: tl.constexpr):
    """One key block's online-softmax step, given its raw scores ``sij = qi · kjᵀ``."""
    if MASK:
        offs_n = start_n + tl.arange(0, BLOCK_N)
        keep = offs_n[None, :] < N
        if CAUSAL:
            keep = keep & (offs_n[None, :] <= offs_m[:, None])
        sij = tl.where(keep, sij * qk_scale, float("-inf"))
        mi_new = tl.maximum(mi, tl.max(sij, 1))
        sij = sij - mi_new[:, None]
        alpha = tl.exp2(mi - mi_new)
        acc, li, mi = acc * alpha[:, None], li * alpha, mi_new
    elif LAZY_RESCALE:
        # Rescale only when some row's max has grown by more than 8 (a factor 2**8) since the last
        # rescale; otherwise keep the old max, and pij may reach 2**8, which 16 bits hold as well
        # as 1. The final acc / li is the same either way (FlashAttention-4's trick).
        m_blk = tl.max(sij, 1) * qk_scale
        if tl.max(m_blk - mi, 0) > 8.0:
            mi_new = tl.maximum(mi, m_blk)
            alpha = tl.exp2(mi - mi_new)
            acc, li, mi = acc * alpha[:, None], li * alpha, mi_new
        sij = sij * qk_scale - mi[:, None]
    else:
        mi_new = tl.maximum(mi, tl.max(sij, 1) * qk_scale)
        sij = sij * qk_scale - mi_new[:, None]  # one multiply-add per score
        alpha = tl.exp2(mi - mi_new)
        acc, li, mi = acc * alpha[:, None], li * alpha, mi_new
    vj = _load_rows(V, kv_row0, start_n, N, stride_vn, stride_vd, BLOCK_N, D, USE_TMA)
    pij = _exp2(sij, vj.dtype, FAST_EXP)
    li = li + tl.sum(pij.to(tl.float32), 1)
    acc = tl.dot(pij.to(vj.dtype), vj, acc, input_precision=PRECISION)
    return acc, li, mi


@triton.jit
def _attend(acc, li, mi, qi, K, V, kv_row0, lo, hi, offs_m, N,
            stride_kn, stride_kd, stride_vn, stride_vd, qk_scale,
            BLOCK_N: tl.constexpr, D: tl.constexpr, MASK: tl.constexpr, CAUSAL: tl.constexpr,
            USE_TMA: tl.constexpr, FAST_EXP: tl.constexpr, LAZY_RESCALE: tl.constexpr, WARP_SPECIALIZE: tl.constexpr,
            PRECISION: tl.constexpr, PREFETCH_SCORES: tl.constexpr):
    """The v2 inner loop over key blocks ``lo .. hi``; ``MASK`` for the diagonal and the tail only.

    With PREFETCH_SCORES the next block's ``qi · kjᵀ`` is issued before this block's softmax, so
    the tensor cores can work on it while the other units exponentiate (FlashAttention-3's overlap).
    """
    if PREFETCH_SCORES:
        if lo < hi:
            kj = _load_rows(K, kv_row0, lo, N, stride_kn, stride_kd, BLOCK_N, D, USE_TMA)
            sij = tl.dot(qi, tl.trans(kj), input_precision=PRECISION)
            for start_n in tl.range(lo, hi - BLOCK_N, BLOCK_N, warp_specialize=WARP_SPECIALIZE):
                start_n = tl.multiple_of(start_n, BLOCK_N)
                k_next = _load_rows(K, kv_row0, start_n + BLOCK_N, N, stride_kn, stride_kd, BLOCK_N, D, USE_TMA)
                s_next = tl.dot(qi, tl.trans(k_next), input_precision=PRECISION)
                acc, li, mi = _update(acc, li, mi, sij, V, kv_row0, start_n, offs_m, N, stride_vn, stride_vd,
                                      qk_scale, BLOCK_N, D, MASK, CAUSAL, USE_TMA, FAST_EXP, LAZY_RESCALE, PRECISION)
                sij = s_next
            last = lo + ((hi - lo - 1) // BLOCK_N) * BLOCK_N
            acc, li, mi = _update(acc, li, mi, sij, V, kv_row0, last, offs_m, N, stride_vn, stride_vd,
                                  qk_scale, BLOCK_N, D, MASK, CAUSAL, USE_TMA, FAST_EXP, LAZY_RESCALE, PRECISION)
    else:
        for start_n in tl.range(lo, hi, BLOCK_N, warp_specialize=WARP_SPECIALIZE):
            start_n = tl.multiple_of(start_n, BLOCK_N)
            kj = _load_rows(K, kv_row0, start_n, N, stride_kn, stride_kd, BLOCK_N, D, USE_TMA)
            sij = tl.dot(qi, tl.trans(kj), input_precision=PRECISION)
            acc, li, mi = _update(acc, li, mi, sij, V, kv_row0, start_n, offs_m, N, stride_vn, stride_vd,
                                  qk_scale, BLOCK_N, D, MASK, CAUSAL, USE_TMA, FAST_EXP, LAZY_RESCALE, PRECISION)
    return acc, li, mi


@triton.jit
def attn_kernel_fast(
    Q, K, V, O, LSE,
    stride_qb, stride_qh, stride_qn, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_ob, stride_oh, stride_on, stride_od,
    H, N, ROWS, qk_scale,
    D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr,
    USE_TMA: tl.constexpr, FAST_EXP: tl.constexpr, LAZY_RESCALE: tl.constexpr, WARP_SPECIALIZE: tl.constexpr,
    PRECISION: tl.constexpr, PREFETCH_SCORES: tl.constexpr, STORE_LSE: tl.constexpr,
):
    pid_m, pid_bh = tl.program_id(0), tl.program_id(1)
    if CAUSAL:  # the heaviest Q blocks (the last rows) first
        pid_m = tl.num_programs(0) - 1 - pid_m
    off_b, off_h = (pid_bh // H).to(tl.int64), (pid_bh % H).to(tl.int64)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, D)
    row0 = pid_bh * N  # the head's first row, with TMA (inputs viewed as (B·H·N, D); int32 coordinates)

    if USE_TMA:
        if WARP_SPECIALIZE:
            # Triton splits loads from compute on Hopper only with descriptors made in the kernel
            q_desc = tl.make_tensor_descriptor(Q, shape=[ROWS, D], strides=[D, 1], block_shape=[BLOCK_M, D])
            k_head = tl.make_tensor_descriptor(K, shape=[ROWS, D], strides=[D, 1], block_shape=[BLOCK_N, D])
            v_head = tl.make_tensor_descriptor(V, shape=[ROWS, D], strides=[D, 1], block_shape=[BLOCK_N, D])
        else:
            q_desc, k_head, v_head = Q, K, V
        qi = q_desc.load([row0 + pid_m * BLOCK_M, 0])
    else:
        qi = _load_rows(Q + off_b * stride_qb + off_h * stride_qh, 0, pid_m * BLOCK_M, N,
                        stride_qn, stride_qd, BLOCK_M, D, False)
        k_head = K + off_b * stride_kb + off_h * stride_kh
        v_head = V + off_b * stride_vb + off_h * stride_vh

    mi = tl.full([BLOCK_M], float("-inf"), tl.float32)  # running max of the scaled, base-2 scores
    li = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D], tl.float32)

    if CAUSAL:
        # stage 1: key blocks left of the diagonal: every key is visible to every row, no mask
        acc, li, mi = _attend(acc, li, mi, qi, k_head, v_head, row0, 0, pid_m * BLOCK_M, offs_m, N,
                              stride_kn, stride_kd, stride_vn, stride_vd, qk_scale,
                              BLOCK_N, D, False, True, USE_TMA, FAST_EXP, LAZY_RESCALE, WARP_SPECIALIZE, PRECISION,
                              PREFETCH_SCORES)
        # stage 2: the diagonal blocks, masked
        acc, li, mi = _attend(acc, li, mi, qi, k_head, v_head, row0, pid_m * BLOCK_M,
                              tl.minimum((pid_m + 1) * BLOCK_M, N), offs_m, N,
                              stride_kn, stride_kd, stride_vn, stride_vd, qk_scale,
                              BLOCK_N, D, True, True, USE_TMA, FAST_EXP, LAZY_RESCALE, WARP_SPECIALIZE, PRECISION,
                              PREFETCH_SCORES)
    else:
        n_full = (N // BLOCK_N) * BLOCK_N
        acc, li, mi = _attend(acc, li, mi, qi, k_head, v_head, row0, 0, n_full, offs_m, N,
                              stride_kn, stride_kd, stride_vn, stride_vd, qk_scale,
                              BLOCK_N, D, False, False, USE_TMA, FAST_EXP, LAZY_RESCALE, WARP_SPECIALIZE, PRECISION,
                              PREFETCH_SCORES)
        # the ragged tail (empty when BLOCK_N divides N): keys past N masked
        acc, li, mi = _attend(acc, li, mi, qi, k_head, v_head, row0, n_full, N, offs_m, N,
                              stride_kn, stride_kd, stride_vn, stride_vd, qk_scale,
                              BLOCK_N, D, True, False, USE_TMA, FAST_EXP, LAZY_RESCALE, WARP_SPECIALIZE, PRECISION,
                              PREFETCH_SCORES)

    acc = acc / li[:, None]
    row_ok = offs_m < N
    o_ptrs = O + off_b * stride_ob + off_h * stride_oh + offs_m[:, None] * stride_on + offs_d[None, :] * stride_od
    tl.store(o_ptrs, acc.to(O.dtype.element_ty), mask=row_ok[:, None])
    if STORE_LSE:  # log-sum-exp in natural units: mi and log2(li) are in base 2
        tl.store(LSE + pid_bh.to(tl.int64) * N + offs_m, (mi + tl.log2(li)) * 0.6931471805599453, mask=row_ok)


# --- launch options and autotuning -------------------------------------------------------------

HEAD_DIMS = (16, 32, 64, 128, 256)

# The pruned search space of triton.autotune, per head dimension: (BLOCK_M, BLOCK_N, warps, stages,
# register cap or None). Measured on the H200 (notebook 10): what pays is two programs per SM, so that
# one program's softmax runs while the other's matrix products keep the tensor cores busy. Small
# 64-row, 4-warp programs get there with room to spare; 128-row, 8-warp programs need their
# registers capped at 128 per thread (2 x 256 threads x 128 = the SM's 65536). D = 256 needs smaller
# tiles to fit registers and shared memory.
TUNING_SPACE = {
    16: [(128, 64, 4, 3), (128, 128, 4, 3), (64, 64, 4, 3)],
    32: [(128, 64, 4, 3), (128, 128, 8, 3), (64, 64, 4, 3)],
    64: [(64, 128, 4, 2), (64, 64, 4, 3), (64, 64, 4, 2), (128, 128, 8, 3, 128), (128, 64, 8, 3)],
    128: [(128, 64, 8, 2, 128), (128, 64, 4, 2), (64, 64, 4, 3), (128, 128, 8, 3)],
    256: [(64, 32, 4, 2), (64, 64, 4, 2), (128, 32, 8, 2), (128, 64, 8, 2)],
}
FLOAT32_SPACE = [(64, 32, 4, 2), (64, 64, 4, 2), (128, 32, 8, 2), (128, 64, 8, 2)]

# The Gluon kernel's space: (BLOCK_M, BLOCK_N, warps, K/V ring slots, schedule[, consumers]). Schedules:
#   "single":      one warpgroup (4 warps) per program, two or three programs per SM, each loading its own K/V;
#   "specialized": a producer warp and `consumers` (2, or 3 with D = 64) consumer warpgroups of BLOCK_M rows
#                  each per program, sharing K/V;
#   "persistent":  the same, one program per SM looping over the tiles.
# Kept from what was measured on the H200 (every candidate timed in interleaved rounds next to SDPA):
# 64 rows per warpgroup and 128 keys almost everywhere; single programs for short or causal problems
# (D = 128: a one-slot ring, so that two programs fit in shared memory); at D = 64 non-causal, three
# consumers (FlashAttention-3's 192-row tiles); at D = 128, two. Three consumers lose on causal problems
# (autotuning does not try them there: see _prune_gluon).
GLUON_SPACE = {
    64: [(64, 128, 4, 2, "single"), (64, 64, 4, 2, "single"),
         (64, 128, 4, 2, "specialized"), (64, 128, 4, 2, "persistent", 3)],
    128: [(64, 128, 4, 1, "single"), (64, 64, 4, 1, "single"),
          (64, 128, 4, 2, "specialized"), (64, 128, 4, 2, "persistent")],
}
SCHEDULES = ("auto", "single", "specialized", "persistent")
# Registers per thread at launch for the specialized schedules, by number of consumers: the program's warpgroups
# (the producer's warp counts as one) x 128 threads x this fit the SM's 65536; the kernel then moves them with
# setmaxnreg (2 consumers: 240 each, 3: 160 each; the producer keeps 24).
WS_MAXNREG = {2: 168, 3: 128}


def gluon_available(dtype: torch.dtype, D: int, mode: str | None = None) -> bool:
    """Whether the Gluon kernel can run this problem here: a Hopper GPU (sm_90), 16-bit, D = 64 or 128."""
    return ((mode or runtime.MODE) == "gpu" and fast_gluon is not None and runtime.HAS_GPU
            and torch.cuda.get_device_capability()[0] == 9
            and dtype in fast_gluon.DTYPES and D in GLUON_SPACE)


def tuning_configs(D: int, dtype: torch.dtype, gluon: bool = False, schedule: str = "auto",
                   consumers: int | None = None) -> list[dict]:
    """The configurations autotuning tries for head dimension ``D`` (as option dicts, with ``maxnreg``),
    for the Gluon kernel if ``gluon``: those of ``schedule`` only, unless it is "auto", and with
    ``consumers`` consumer warpgroups, if given (the schedule's tiles with that many, if none has it)."""
    if gluon:
        if D not in GLUON_SPACE or dtype == torch.float32:
            raise ValueError(f"fast: the Gluon kernel takes 16-bit inputs and D in {sorted(GLUON_SPACE)}")
        configs = [dict(zip(TILE_KEYS, c[:4], strict=True), maxnreg=None, schedule=c[4],
                        consumers=None if c[4] == "single" else (c[5] if len(c) > 5 else 2))
                   for c in GLUON_SPACE[D] if schedule in ("auto", c[4])]
        if consumers is not None:
            configs = ([c for c in configs if c["consumers"] == consumers]
                       or [{**c, "consumers": consumers} for c in configs if c["consumers"] is not None])
        return configs
    space = FLOAT32_SPACE if dtype == torch.float32 else TUNING_SPACE[D]
    if dtype == torch.float32 and D == 256:
        space = [c for c in space if c[0] == 64]
    return [dict(zip(TILE_KEYS, c[:4], strict=True), maxnreg=c[4] if len(c) > 4 else None) for c in space]


def _set_block_shapes(nargs):
    """Autotuning pre-hook: the TMA descriptors' tile shapes follow the configuration being tried."""
    for name, rows in (("Q", nargs["BLOCK_M"]), ("K", nargs["BLOCK_N"]), ("V", nargs["BLOCK_N"])):
        if hasattr(nargs[name], "block_shape"):  # a TMA descriptor: (rows, D) tiles
            nargs[name].block_shape = [rows, nargs[name].block_shape[1]]


def _prune(configs, named_args, **kwargs):
    """Drop configurations that cannot run: BLOCK_N > BLOCK_M when causal (the diagonal stage)."""
    kept = [c for c in configs if not (kwargs["CAUSAL"] and c.kwargs["BLOCK_N"] > c.kwargs["BLOCK_M"])]
    return kept or configs[:1]


def _prune_gluon(configs, named_args, **kwargs):
    """Causal problems: no three-consumer programs (measured on the H200: they lose there, by far)."""
    kept = [c for c in configs if not (kwargs["CAUSAL"] and c.kwargs["CONSUMERS"] == 3)]
    return kept or configs[:1]


_tuned_kernels: dict = {}
_picked: dict = {}  # (D, dtype, N, B, H, causal, use_tma, gluon, overlap, schedule, consumers) -> tiles autotuning chose


def _gluon_meta(schedule: str, consumers: int | None = None) -> dict:
    """The Gluon kernel's constexprs and register cap for a schedule (and number of consumer warpgroups)."""
    ws = schedule in ("specialized", "persistent")
    consumers = (consumers or 2) if ws else 2  # (CONSUMERS is unused by single programs)
    return {"WARP_SPECIALIZE": ws, "PERSISTENT": schedule == "persistent", "CONSUMERS": consumers,
            "maxnreg": WS_MAXNREG[consumers] if ws else None}


def _tuned_kernel(D: int, dtype: torch.dtype, gluon: bool = False, schedule: str = "auto",
                  consumers: int | None = None):
    """``attn_kernel_fast`` (or the Gluon kernel, over the configurations of ``schedule`` and ``consumers``)
    under ``triton.autotune`` over :func:`tuning_configs`."""
    key = (D, dtype, gluon, schedule, consumers)
    if key not in _tuned_kernels:
        if gluon:  # the ring depth is the kernel's STAGES
            configs = []
            for c in tuning_configs(D, dtype, gluon=True, schedule=schedule, consumers=consumers):
                meta = _gluon_meta(c["schedule"], c["consumers"])
                configs.append(triton.Config({"BLOCK_M": c["block_m"], "BLOCK_N": c["block_n"], "STAGES": c["num_stages"],
                                              "WARP_SPECIALIZE": meta["WARP_SPECIALIZE"], "PERSISTENT": meta["PERSISTENT"],
                                              "CONSUMERS": meta["CONSUMERS"]},
                                             num_warps=c["num_warps"], maxnreg=meta["maxnreg"], pre_hook=_set_block_shapes))
            _tuned_kernels[key] = triton.autotune(configs, key=["N", "BH", "CAUSAL", "OVERLAP"],
                                                  prune_configs_by={"early_config_prune": _prune_gluon}
                                                  )(fast_gluon.attn_kernel_gluon)
        else:
            configs = [triton.Config({"BLOCK_M": c["block_m"], "BLOCK_N": c["block_n"]}, num_warps=c["num_warps"],
                                     num_stages=c["num_stages"], maxnreg=c["maxnreg"], pre_hook=_set_block_shapes)
                       for c in tuning_configs(D, dtype)]
            _tuned_kernels[key] = triton.autotune(configs, key=["N", "H", "CAUSAL", "USE_TMA"],
                                                  prune_configs_by={"early_config_prune": _prune})(attn_kernel_fast)
    return _tuned_kernels[key]


def tuned_config(D: int, dtype: torch.dtype, N: int, H: int, causal: bool, use_tma: bool = True,
                 gluon: bool | None = None, overlap: bool = True, schedule: str = "auto",
                 consumers: int | None = None, B: int | None = None) -> dict | None:
    """The configuration autotuning picked for this problem in this process, or None if not tuned yet.
    ``gluon``: which kernel's (None: the one ``fast`` uses by default here); ``schedule`` and ``consumers``:
    the Gluon configurations autotuning chose from; ``B``: the batch (the Gluon kernel is tuned per B·H;
    None: any)."""
    if gluon is None:
        gluon = gluon_available(dtype, D)
    tuner = _tuned_kernels.get((D, dtype, gluon, schedule, consumers) if gluon else (D, dtype, False, "auto", None))
    if tuner is None:
        return None
    for key, config in tuner.cache.items():
        if gluon and key[0] == N and (B is None or key[1] == B * H) and tuple(key[2:4]) == (causal, overlap):
            kw = config.kwargs
            picked = "single" if not kw["WARP_SPECIALIZE"] else "persistent" if kw["PERSISTENT"] else "specialized"
            return {"block_m": kw["BLOCK_M"], "block_n": kw["BLOCK_N"], "num_warps": config.num_warps,
                    "num_stages": kw["STAGES"], "maxnreg": None, "gluon": True, "schedule": picked,
                    "consumers": kw["CONSUMERS"] if kw["WARP_SPECIALIZE"] else None}
        if not gluon and tuple(key[:4]) == (N, H, causal, use_tma):
            return {"block_m": config.kwargs["BLOCK_M"], "block_n": config.kwargs["BLOCK_N"],
                    "num_warps": config.num_warps, "num_stages": config.num_stages, "maxnreg": config.maxnreg,
                    "gluon": False}
    return None


JIT_KERNELS = (attn_kernel_fast,) if fast_gluon is None else (attn_kernel_fast, fast_gluon.attn_kernel_gluon)


def default_options(dtype: torch.dtype, D: int, mode: str | None = None) -> dict:
    """Launch options of ``fast``. On a GPU: autotuned tiles, TMA where the GPU has it (Hopper), and on
    Hopper for 16-bit inputs with D = 64 or 128 the Gluon kernel (``gluon=True``).

    ``fast_exp``, ``lazy_rescale``, ``prefetch_scores`` and ``warp_specialize`` (switches of the Triton
    kernel) are off: each was measured on an H200 and did not pay (notebook 10 shows the numbers).
    ``maxnreg`` (a register cap) is None unless autotuning picks a configuration with one.
    """
    switches = dict(fast_exp=False, lazy_rescale=False, warp_specialize=False, prefetch_scores=False, maxnreg=None,
                    overlap=True, schedule="auto", consumers=None)
    if (mode or runtime.MODE) == "interpreter":
        return dict(block_m=64, block_n=64, num_warps=4, num_stages=1, input_precision="ieee", autotune=False,
                    use_tma=False, gluon=False, **switches)
    hopper = runtime.HAS_GPU and torch.cuda.get_device_capability()[0] >= 9
    gluon = gluon_available(dtype, D, mode)
    tiles = {k: v for k, v in tuning_configs(D, dtype, gluon)[0].items() if k not in ("schedule", "consumers")}
    return {**tiles, "input_precision": "ieee", "autotune": True, "use_tma": hopper, "gluon": gluon, **switches}


def _descriptor(x: torch.Tensor, block_rows: int):
    """A TMA descriptor over contiguous ``x`` (B, H, N, D) seen as one (B·H·N, D) matrix, in (block_rows, D) tiles."""
    B, H, N, D = x.shape
    return TensorDescriptor(x, shape=[B * H * N, D], strides=[D, 1], block_shape=[block_rows, D])


def _descriptor_scratch(size: int, alignment: int, stream):
    return torch.empty(size, dtype=torch.int8, device="cuda")


def _gluon_conflicts(opts: dict) -> list[str]:
    """The options in ``opts`` that the Gluon kernel cannot honour (empty: it can run them)."""
    found = [k for k in ("fast_exp", "lazy_rescale", "prefetch_scores", "warp_specialize") if opts[k]]
    found += ["use_tma=False"] if not opts["use_tma"] else []
    found += ["maxnreg"] if opts["maxnreg"] is not None else []
    bm, bn, warps = opts["block_m"], opts["block_n"], opts["num_warps"]
    if warps % 4 or bm % (16 * warps) or bm > 256 or bn > 256:
        found.append(f"block_m={bm}, block_n={bn}, num_warps={warps} (it needs whole warpgroups: num_warps a multiple "
                     "of 4, block_m a multiple of 16·num_warps, tiles of at most 256 rows)")
    if opts["schedule"] in ("specialized", "persistent") and warps != 4:
        found.append(f"schedule={opts['schedule']!r} with num_warps={warps} (each consumer is one warpgroup: 4 warps)")
    if opts["consumers"] is not None and opts["schedule"] not in ("specialized", "persistent"):
        found.append(f"consumers={opts['consumers']} with schedule={opts['schedule']!r} (consumer warpgroups belong to "
                     "the schedules 'specialized' and 'persistent': pass one of them)")
    return found


def _check_options(dtype: torch.dtype, D: int, causal: bool, options: dict) -> tuple[dict, bool]:
    """The launch options after defaults, and whether to autotune; bad options raise."""
    opts = resolve_options("fast", options, default_options(dtype, D), dtype)
    # explicit tiles switch autotuning off (unless it is asked for explicitly)
    autotune = options.get("autotune", opts["autotune"] and not any(t in options for t in (*TILE_KEYS, "maxnreg")))
    cap = opts["maxnreg"]
    if cap is not None and (isinstance(cap, bool) or not isinstance(cap, int) or not 24 <= cap <= 255):
        raise ValueError(f"fast: maxnreg must be None or an integer from 24 to 255 (registers per thread), got {cap!r}")
    if opts["schedule"] not in SCHEDULES:
        raise ValueError(f"fast: schedule must be one of {', '.join(map(repr, SCHEDULES))}, got {opts['schedule']!r}")
    if opts["consumers"] not in (None, 2, 3) or isinstance(opts["consumers"], bool):
        raise ValueError(f"fast: consumers must be None, 2 or 3 (consumer warpgroups per program), got {opts['consumers']!r}")
    if opts["consumers"] == 3 and D != 64:
        raise ValueError(f"fast: consumers=3 needs D=64, got D={D} (three consumers get 160 registers per thread "
                         "each, too few for a larger accumulator)")
    if autotune and runtime.MODE != "gpu":
        raise ValueError("fast: autotune needs a GPU (triton.autotune times the candidates)")
    if opts["fast_exp"] and dtype == torch.float32:
        raise ValueError("fast: fast_exp computes exp2 on 16-bit pairs; it applies to float16/bfloat16 only")
    if (opts["use_tma"] or opts["fast_exp"] or opts["warp_specialize"] or opts["maxnreg"]) and runtime.MODE != "gpu":
        raise ValueError("fast: use_tma, fast_exp, warp_specialize and maxnreg need a GPU (the interpreter has no "
                         "TMA, no inline PTX and no registers to cap)")
    if opts["gluon"] and "gluon" not in options and _gluon_conflicts(opts):
        # the default gives way to options only the Triton kernel has, with the Triton kernel's default tiles
        opts = resolve_options("fast", options, {**default_options(dtype, D), **tuning_configs(D, dtype)[0],
                                                  "gluon": False}, dtype)
    if opts["gluon"]:
        if not gluon_available(dtype, D):
            raise ValueError(f"fast: gluon=True needs a Hopper GPU (sm_90) with Triton's Gluon, float16 or bfloat16 "
                             f"inputs and D in {sorted(GLUON_SPACE)}; got {dtype}, D={D} "
                             f"in {runtime.MODE} mode (pass gluon=False for the Triton kernel)")
        conflicts = _gluon_conflicts(opts)
        if conflicts:
            raise ValueError(f"fast: gluon=True cannot run {'; '.join(conflicts)}: those are the Triton kernel's "
                             "(the Gluon kernel always loads through TMA); pass gluon=False with them")
        return opts, autotune
    if not opts["overlap"]:
        raise ValueError("fast: overlap=False (no softmax/p·v overlap) is an option of the Gluon kernel (gluon=True)")
    if opts["schedule"] != "auto" or opts["consumers"] is not None:
        raise ValueError(f"fast: schedule={opts['schedule']!r}, consumers={opts['consumers']!r}: the schedules and their "
                         "consumer warpgroups are options of the Gluon kernel (gluon=True, with schedule='specialized' or "
                         "'persistent'); the Triton kernel has one schedule")
    if not autotune and opts["block_n"] > opts["block_m"] and causal:
        raise ValueError(f"fast: causal needs block_n <= block_m, got {opts['block_n']} > {opts['block_m']}")
    return opts, autotune


_resolved_cache: dict = {}


def _resolved(dtype: torch.dtype, D: int, causal: bool, options: dict) -> tuple[dict, bool]:
    """:func:`_check_options`, remembered per distinct call: checking costs as much as a short kernel."""
    try:
        key = (runtime.MODE, dtype, D, causal, tuple(sorted((k, type(v), v) for k, v in options.items())))
        hash(key)
    except TypeError:  # an unhashable option value: check it the slow way (and let it raise)
        return _check_options(dtype, D, causal, options)
    if key not in _resolved_cache:
        _resolved_cache[key] = _check_options(dtype, D, causal, options)
    opts, autotune = _resolved_cache[key]
    return dict(opts), autotune


_sm_counts: dict = {}


def _gluon_grid(N: int, BH: int, block_m: int, warp_specialize: bool, persistent: bool, consumers: int,
                device) -> tuple:
    """Single warpgroups: a (Q block, batch·head) grid. Specialized: one program per tile of consumers·block_m
    rows (1-D). Persistent: at most one program per SM, each looping over tiles."""
    if not warp_specialize:
        return (triton.cdiv(N, block_m), BH)
    tiles = triton.cdiv(N, consumers * block_m) * BH
    if not persistent:
        return (tiles,)
    if device not in _sm_counts:
        _sm_counts[device] = torch.cuda.get_device_properties(device).multi_processor_count
    return (min(tiles, _sm_counts[device]),)


def _launch_gluon(q, k, v, o, lse, causal, scale, return_lse, tiles, pick_key, overlap, schedule, consumers):
    """Run the Gluon kernel: autotune on the first call for a problem, then launch the pick directly."""
    B, H, N, D = q.shape
    block_m, block_n = (tiles["block_m"], tiles["block_n"]) if tiles else (64, 64)  # placeholders: the hook sets them
    descs = [fast_gluon.descriptor(q, block_m), fast_gluon.descriptor(k, block_n), fast_gluon.descriptor(v, block_n)]
    args = (*descs, o, lse, N, B * H, scale * LOG2_E)
    if tiles is None:
        kernel = _tuned_kernel(D, q.dtype, gluon=True, schedule=schedule, consumers=consumers)
        grid = lambda meta: _gluon_grid(N, B * H, meta["BLOCK_M"], meta["WARP_SPECIALIZE"], meta["PERSISTENT"],  # noqa: E731
                                        meta["CONSUMERS"], q.device)
        kernel[grid](*args, D=D, CAUSAL=causal, STORE_LSE=return_lse, OVERLAP=overlap)
        _picked[pick_key] = tuned_config(D, q.dtype, N, H, causal, gluon=True, overlap=overlap, schedule=schedule,
                                         consumers=consumers, B=B)
    else:
        meta = _gluon_meta(tiles["schedule"], tiles["consumers"])
        grid = _gluon_grid(N, B * H, block_m, meta["WARP_SPECIALIZE"], meta["PERSISTENT"], meta["CONSUMERS"], q.device)
        fast_gluon.attn_kernel_gluon[grid](
            *args, D=D, BLOCK_M=block_m, BLOCK_N=block_n, STAGES=tiles["num_stages"], CAUSAL=causal,
            STORE_LSE=return_lse, OVERLAP=overlap, WARP_SPECIALIZE=meta["WARP_SPECIALIZE"],
            PERSISTENT=meta["PERSISTENT"], CONSUMERS=meta["CONSUMERS"], num_warps=tiles["num_warps"],
            **({"maxnreg": meta["maxnreg"]} if meta["maxnreg"] else {}))


def attention_fast(q, k, v, *, causal=False, scale=None, return_lse=False, **options):
    """Forward attention, the course's fastest. ``return_lse=True`` also returns the (B, H, N)
    float32 log-sum-exp of the scaled scores (natural log).

    Options: ``gluon`` (default on Hopper for 16-bit inputs and D = 64/128: the Gluon kernel of
    ``fast_gluon.py``, unless other options need the Triton kernel; False: the Triton kernel;
    True: the Gluon kernel or a ValueError saying why not), ``autotune`` (GPU default: triton.autotune over
    :data:`GLUON_SPACE` or :data:`TUNING_SPACE`; giving any tile option turns it off), block_m,
    block_n, num_warps, num_stages (with Gluon: the K/V ring's slots), input_precision (float32 only:
    "ieee" by default as for every variant, or "tf32" for the tensor cores); for the Triton kernel only:
    use_tma, fast_exp (16-bit only), lazy_rescale, prefetch_scores, warp_specialize, maxnreg (a cap on
    registers per thread, like the tiles an explicit choice that turns autotuning off); for the Gluon
    kernel only: overlap (default True; False waits for each product at once, for comparison), schedule
    ("auto": autotuning picks; "single", "specialized", "persistent": see the module docstring; with the
    last two, block_m is the rows of each consumer warpgroup and num_warps must be 4) and consumers (with
    those two: 2, or 3 at D = 64, consumer warpgroups per program; like the schedule, it narrows autotuning;
    None: autotuning's pick, or 2 with explicit tiles).
    """
    B, H, N, D, scale = check_kernel_inputs(q, k, v, variant="fast", causal=causal, scale=scale,
                                            head_dims=HEAD_DIMS)
    if not isinstance(return_lse, bool):
        raise TypeError(f"fast: return_lse must be True or False, got {return_lse!r}")
    opts, autotune = _resolved(q.dtype, D, causal, options)
    o = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    lse = torch.empty((B, H, N), dtype=torch.float32, device=q.device) if return_lse else o  # o: unused then
    if opts["use_tma"] and B * H * N >= 2**31:
        raise ValueError(f"fast: use_tma addresses rows with 32-bit coordinates; B·H·N = {B * H * N} is too large")
    # Once autotuning has picked tiles for a problem, later calls launch the kernel with them directly:
    # the autotuner's own bookkeeping costs tens of microseconds per call, as much as a short kernel.
    pick_key = (D, q.dtype, N, B, H, causal, opts["use_tma"], opts["gluon"], opts["overlap"], opts["schedule"],
                opts["consumers"])
    tiles = _picked.get(pick_key) if autotune else {t: opts[t] for t in (*TILE_KEYS, "maxnreg")}
    if opts["gluon"] and tiles is not None and "schedule" not in tiles:  # explicit tiles: the schedule asked for
        tiles = {**tiles, "schedule": "single" if opts["schedule"] == "auto" else opts["schedule"],
                 "consumers": opts["consumers"]}
    block_m, block_n = (tiles["block_m"], tiles["block_n"]) if tiles else (opts["block_m"], opts["block_n"])
    if opts["use_tma"]:  # the descriptors view each input as one (B·H·N, D) matrix
        # TMA wants 16-byte aligned rows and base addresses: copy inputs that are not
        q, k, v = (x if x.is_contiguous() and x.data_ptr() % 16 == 0 else x.clone(memory_format=torch.contiguous_format)
                   for x in (q, k, v))
        if opts["gluon"]:
            _launch_gluon(q, k, v, o, lse, causal, scale, return_lse, tiles, pick_key, opts["overlap"], opts["schedule"],
                          opts["consumers"])
            return (o, lse) if return_lse else o
        if opts["warp_specialize"]:  # the kernel makes its descriptors: they need a little global scratch
            triton.set_allocator(_descriptor_scratch)
            q_arg, k_arg, v_arg = q, k, v
        else:
            q_arg, k_arg, v_arg = _descriptor(q, block_m), _descriptor(k, block_n), _descriptor(v, block_n)
    else:
        q_arg, k_arg, v_arg = q, k, v
    constexprs = dict(D=D, CAUSAL=causal, USE_TMA=opts["use_tma"], FAST_EXP=opts["fast_exp"],
                      LAZY_RESCALE=opts["lazy_rescale"],
                      WARP_SPECIALIZE=opts["warp_specialize"], PREFETCH_SCORES=opts["prefetch_scores"], STORE_LSE=return_lse,
                      PRECISION=opts["input_precision"] if q.dtype == torch.float32 else "tf32")
    args = (q_arg, k_arg, v_arg, o, lse, *q.stride(), *k.stride(), *v.stride(), *o.stride(), H, N, B * H * N, scale * LOG2_E)
    if tiles is None:  # first call for this problem: autotune (the pre-hook sets the descriptors' tiles)
        kernel = _tuned_kernel(D, q.dtype)
        kernel[lambda meta: (triton.cdiv(N, meta["BLOCK_M"]), B * H)](*args, **constexprs)
        _picked[pick_key] = tuned_config(D, q.dtype, N, H, causal, opts["use_tma"], gluon=False)
    else:
        grid = (triton.cdiv(N, block_m), B * H)
        attn_kernel_fast[grid](*args, BLOCK_M=block_m, BLOCK_N=block_n, **constexprs,
                               num_warps=tiles["num_warps"], num_stages=tiles["num_stages"],
                               **({"maxnreg": tiles["maxnreg"]} if tiles["maxnreg"] else {}))
    return (o, lse) if return_lse else o
