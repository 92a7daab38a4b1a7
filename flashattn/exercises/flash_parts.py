"""Notebook 05's kernel exercise in parts: the FA2 update inside a given loop, then the masks, then the whole kernel.

* ``check_v2_update(update)``: ``update(qi, kj, vj, mi, li, acc, keep, scale, PRECISION) -> (mi, li, acc)``, one
  step of the FlashAttention-2 loop: the scores of one K/V block, masked with ``keep``, and the running max,
  sum and accumulator after it. ``v2_loop_kernel`` (below) is the rest of the kernel (loads, masks, the loop,
  the state's start and the final division) and calls it once per K/V block.
* ``check_v2_keep(keep)``: ``keep(offs_m, offs_n, N, CAUSAL)``, the boolean mask of one (BLOCK_M, BLOCK_N)
  tile (or of a shape that broadcasts to it, e.g. (1, BLOCK_N)): keys past N hidden and, when causal, the keys
  after each query. ``keep_probe_kernel`` stores every tile it returns, so the check compares it element by
  element with the right mask and with the classic wrong ones.

The third part is ``flash_kernels.check_v2_kernel``: the whole kernel, strides and all.
"""

# ruff: noqa: E741  (Q, K, V, O: the papers' notation, as in flashattn/kernels)

from __future__ import annotations

import torch
import triton
import triton.language as tl

from flashattn import runtime

from ._check import ExerciseFailed, exercise
from .attention_cases import (
    FIRST_CASES,
    LARGE_SCORES,
    N_IS_ONE,
    NEGATIVE_ROWS,
    Case,
    fail,
    input_buffers,
    random_qkv,
    reference_of,
)
from .evidence import known, ranges
from .flash_kernels import V2_MESSAGES, _name_the_mistake
from .flash_models import V2_SWITCHES, v2_tile_model
from .triton_check import Buffer, close, launch, near_miss_hint, require_jit, tolerance


@triton.jit
def v2_keep(offs_m, offs_n, N, CAUSAL: tl.constexpr):
    """The mask of one tile: keys past N hidden, and when CAUSAL the keys after each query."""
    keep = offs_n[None, :] < N
    if CAUSAL:
        keep = keep & (offs_n[None, :] <= offs_m[:, None])
    return keep


@triton.jit
def v2_loop_kernel(Q, K, V, O,
                   stride_qb, stride_qh, stride_qn, stride_qd,
                   stride_kb, stride_kh, stride_kn, stride_kd,
                   stride_vb, stride_vh, stride_vn, stride_vd,
                   stride_ob, stride_oh, stride_on, stride_od,
                   H, N, scale,
                   D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                   CAUSAL: tl.constexpr, PRECISION: tl.constexpr, UPDATE: tl.constexpr, KEEP: tl.constexpr):
    """FlashAttention-2 forward around the learner's UPDATE (one K/V block's step) and KEEP (one tile's mask)."""
    pid_m, pid_bh = tl.program_id(0), tl.program_id(1)
    off_b, off_h = pid_bh // H, pid_bh % H
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, D)
    k_base = K + off_b * stride_kb + off_h * stride_kh
    v_base = V + off_b * stride_vb + off_h * stride_vh

    q_ptrs = Q + off_b * stride_qb + off_h * stride_qh + offs_m[:, None] * stride_qn + offs_d[None, :] * stride_qd
    qi = tl.load(q_ptrs, mask=offs_m[:, None] < N, other=0.0)
    mi = tl.full([BLOCK_M], float("-inf"), tl.float32)
    li = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D], tl.float32)

    hi = tl.minimum(N, (pid_m + 1) * BLOCK_M) if CAUSAL else N  # causal: no keys after the block's last query
    for start_n in range(0, hi, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        kj = tl.load(k_base + offs_n[:, None] * stride_kn + offs_d[None, :] * stride_kd,
                     mask=offs_n[:, None] < N, other=0.0)
        vj = tl.load(v_base + offs_n[:, None] * stride_vn + offs_d[None, :] * stride_vd,
                     mask=offs_n[:, None] < N, other=0.0)
        keep = KEEP(offs_m, offs_n, N, CAUSAL)
        mi, li, acc = UPDATE(qi, kj, vj, mi, li, acc, keep, scale, PRECISION)

    o_ptrs = O + off_b * stride_ob + off_h * stride_oh + offs_m[:, None] * stride_on + offs_d[None, :] * stride_od
    tl.store(o_ptrs, acc / li[:, None], mask=offs_m[:, None] < N)


# ---------------------------------------------------------------------------------------------
# Part 1: the update

BLOCK_M, BLOCK_N = 32, 16
UPDATE_CASES = (*FIRST_CASES, N_IS_ONE, LARGE_SCORES, NEGATIVE_ROWS,
                Case("float16", 1, 2, 100, 16, True, torch.float16))
UPDATE_MESSAGES = {  # the mistakes an update can make (the loop, the masks and the state's start are given)
    "keep_ignored": "the scores outside `keep` are used: the keys past N (loaded as 0.0, so scoring 0) and, when "
                    "causal, the future keys. Mask them first: sij = tl.where(keep, sij, float('-inf')).",
    **{name: V2_MESSAGES[name] for name in ("exp_old_max", "max_never_updated", "missing_alpha_acc",
                                            "missing_alpha_l", "missing_alpha_both", "divide_every_step",
                                            "fa1_exponent_unguarded", "no_max", "rounded_p", "rounded_pv",
                                            "rounded_qk")},
}
UPDATE_SWITCHES = {"keep_ignored": dict(tail="zero", causal_mask="none"), **V2_SWITCHES}


def _run_update(update, case: Case, qkv):
    Q, K, V = input_buffers(case, qkv)
    O = Buffer((case.B, case.H, case.N, case.D), case.dtype, pad=(0, 0, BLOCK_M, 0))
    grid = (triton.cdiv(case.N, BLOCK_M), case.B * case.H)
    launch(v2_loop_kernel, grid, Q.view, K.view, V.view, O.view, *Q.view.stride(), *K.view.stride(),
           *V.view.stride(), *O.view.stride(), case.H, case.N, case.scale, D=case.D, BLOCK_M=BLOCK_M,
           BLOCK_N=BLOCK_N, CAUSAL=case.causal, PRECISION="ieee", UPDATE=update, KEEP=v2_keep, where=case.text(),
           source=update)
    return O.view.double().cpu()


@exercise("v2 update")
def check_v2_update(update) -> str:
    """``update(qi, kj, vj, mi, li, acc, keep, scale, PRECISION) -> (mi, li, acc)``, the FA2 step, @triton.jit."""
    require_jit(update, "the update function")
    for seed, case in enumerate(UPDATE_CASES):
        qkv = random_qkv(case, seed=600 + seed)
        got, ref = _run_update(update, case, qkv), reference_of(case, *qkv)
        tol = tolerance(case.dtype)
        if close(got, ref, tol):
            continue
        _name_the_mistake(case, got, ref, tol, qkv, v2_tile_model, UPDATE_SWITCHES, UPDATE_MESSAGES, BLOCK_M,
                          BLOCK_N)
        err = ((got - ref).norm() / ref.norm()).item()
        fail(case, f"the output is wrong, and no single classic mistake of the update reproduces it "
             f"({known(got, ref, tol)}). The step: sij = scale · qi · kjᵀ masked with keep, mi_new = max(mi, "
             "rowmax(sij)), pij = exp(sij - mi_new), alpha = exp(mi - mi_new), li = alpha·li + rowsum(pij), "
             "acc = alpha·acc + pij·vj; return (mi_new, li, acc)." + near_miss_hint(err, case.dtype))
    return (f"{len(UPDATE_CASES)} cases in the v2 loop: ragged N, B and H > 1, causal, N = 1, large scores, rows of "
            "large negative scores, float16")


# ---------------------------------------------------------------------------------------------
# Part 2: the mask of a tile


@triton.jit
def keep_probe_kernel(OUT, N, N_PAD, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr,
                      KEEP: tl.constexpr):
    """Program (pid_m, pid_n) stores KEEP's tile for query block pid_m and key block pid_n (as 0/1) into OUT,
    (rows of the padded query range, N_PAD keys)."""
    pid_m, pid_n = tl.program_id(0), tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    keep = tl.broadcast_to(KEEP(offs_m, offs_n, N, CAUSAL), (BLOCK_M, BLOCK_N))  # (1, BLOCK_N) is a mask too
    tl.store(OUT + offs_m[:, None] * N_PAD + offs_n[None, :], keep.to(tl.int8))


KEEP_CASES = ((50, False), (50, True), (64, True), (17, True))  # (N, causal): ragged, causal, whole blocks, short


def _keep_models(N: int, n_pad: int, causal: bool):
    """The right mask of queries 0 .. N - 1 against keys 0 .. n_pad - 1, and (mask, message) for the wrong ones."""
    rows, cols = torch.arange(N)[:, None], torch.arange(n_pad)[None, :]
    inside = (cols < N).expand(N, n_pad)
    if not causal:
        return inside, [
            (torch.ones(N, n_pad, dtype=torch.bool), "the keys past N are kept (the ragged end of the last block): "
             "keep = offs_n[None, :] < N"),
            ((cols <= N).expand(N, n_pad), "the mask lets key N itself through: offs_n < N, not <="),
            (inside & (cols <= rows), "the causal mask is applied although CAUSAL is False: only `if CAUSAL:` adds it"),
        ]
    return inside & (cols <= rows), [
        (inside & (cols < rows), "the causal mask is off by one: it hides the diagonal. Query i sees key j when "
         "j <= i: offs_n[None, :] <= offs_m[:, None]"),
        (inside & ((cols % BLOCK_N) <= (rows % BLOCK_M)), "the causal mask compares the indices inside the tiles "
         "(tl.arange(0, BLOCK_N) against tl.arange(0, BLOCK_M)): compare positions in the whole sequence, "
         "offs_n[None, :] <= offs_m[:, None]"),
        (inside & (cols >= rows), "the causal mask points the wrong way: it hides the past. Keep key j for query i "
         "when j <= i"),
        (inside, "there is no causal mask: with CAUSAL, query i sees only the keys j <= i (an `if CAUSAL:` that "
         "adds (offs_n[None, :] <= offs_m[:, None]) to the mask)"),
    ]


@exercise("v2 masks")
def check_v2_keep(keep) -> str:
    """``keep(offs_m, offs_n, N, CAUSAL) -> (BLOCK_M, BLOCK_N)`` boolean tile, @triton.jit."""
    require_jit(keep, "the mask function")
    for N, causal in KEEP_CASES:
        where = f"[N={N}, causal={causal}] BLOCK_M={BLOCK_M}, BLOCK_N={BLOCK_N}"
        rows_pad, n_pad = triton.cdiv(N, BLOCK_M) * BLOCK_M, triton.cdiv(N, BLOCK_N) * BLOCK_N
        out = torch.full((rows_pad, n_pad), -1, dtype=torch.int8, device=runtime.DEVICE)
        launch(keep_probe_kernel, (rows_pad // BLOCK_M, n_pad // BLOCK_N), out, N, n_pad, BLOCK_M=BLOCK_M,
               BLOCK_N=BLOCK_N, CAUSAL=causal, KEEP=keep, where=where, source=keep)
        got = out.cpu()[:N]
        if not torch.isin(got, torch.tensor([0, 1], dtype=torch.int8)).all():
            raise ExerciseFailed(f"{where}: keep holds values other than True and False: return a boolean tile, "
                                 "a comparison such as offs_n[None, :] < N (combined with &).")
        got = got.bool()
        right, models = _keep_models(N, n_pad, causal)
        if torch.equal(got, right):
            continue
        for model, text in models:
            if torch.equal(got, model):
                raise ExerciseFailed(f"{where}: {text}.")
        kept, hidden = torch.nonzero(got & ~right), torch.nonzero(~got & right)
        parts = []
        for name, wrong in (("kept although it must be hidden", kept), ("hidden although it must be kept", hidden)):
            if len(wrong):
                parts.append(f"{len(wrong)} (query, key) pair(s) {name}, e.g. query {int(wrong[0][0])} and key "
                             f"{int(wrong[0][1])} (queries {ranges(wrong[:, 0].tolist())})")
        raise ExerciseFailed(f"{where}: keep is wrong, and it is none of the classic wrong masks: " + "; ".join(parts)
                             + ". Query i sees key j when j < N and, with CAUSAL, j <= i (positions in the sequence).")
    return "ragged N, causal and not, whole blocks, N shorter than a block: every (query, key) pair"
