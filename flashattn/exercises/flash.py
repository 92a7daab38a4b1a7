"""Exercises of notebooks 04 and 05: the FlashAttention updates, in plain PyTorch over tiles.

* ``check_flash_v1_step(fn)``: ``fn(qi, kj, vj, oi, li, mi, scale) -> (oi_new, li_new, mi_new)``, one
  FlashAttention-1 update (the state kept normalized, with alpha and beta), notebook 04.
* ``check_flash_v2(fn)``: ``fn(q, k, v, block_n, causal) -> out``, one head of FlashAttention-2:
  stream over K/V blocks keeping (mi, li, acc), divide once at the end, notebook 05.

Each check runs the learner's function on fresh random inputs whose length is not a multiple of the
block, compares it with the float64 reference, and, when it is wrong, compares it with "mistake
models" (the same algorithm with one classic mistake in it: ``flash_models``) to say which mistake it
looks like.
"""

from __future__ import annotations

import math

import torch

from flashattn.reference import reference

from ._check import ExerciseFailed, call, exercise, rel_error
from .flash_models import V1_SWITCHES, V2_SWITCHES, v1_tile_model, v2_tile_model

TOL = 1e-4  # float32 arithmetic gives ~1e-7; every mistake model is off by far more than this


def _qkv(N: int, D: int, seed: int):
    gen = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(N, D, generator=gen) for _ in range(3))
    return 2.0 * q, k, v  # sharper scores: the running max moves from block to block


def _reference(q, k, v, causal: bool) -> torch.Tensor:
    return reference(q[None, None].double(), k[None, None].double(), v[None, None].double(),
                     causal=causal)[0, 0]


def _as_output(out, shape, what: str) -> torch.Tensor:
    if not isinstance(out, torch.Tensor):
        raise ExerciseFailed(f"{what} should be a torch.Tensor, got {type(out).__name__}")
    if tuple(out.shape) != tuple(shape):
        raise ExerciseFailed(f"{what} should have shape {tuple(shape)}, got {tuple(out.shape)}")
    return out.detach().to("cpu", torch.float64)


def _bad_rows(out: torch.Tensor, ref: torch.Tensor) -> list[int]:
    err = (out - ref).norm(dim=-1) / ref.norm(dim=-1).clamp_min(1e-300)
    return [int(r) for r in torch.nonzero(~(err <= TOL)).flatten()]


def _nonfinite_rows(out: torch.Tensor) -> list[int]:
    return [int(r) for r in torch.nonzero(~torch.isfinite(out).all(dim=-1)).flatten()]


def _rows_text(rows: list[int]) -> str:
    shown = ", ".join(map(str, rows[:6]))
    return f"rows {shown}" + (f" and {len(rows) - 6} more" if len(rows) > 6 else "")


def _factor(out_row: torch.Tensor, ref_row: torch.Tensor) -> float | None:
    """c if out_row ≈ c·ref_row (the row has the right direction, the wrong size), else None."""
    c = float(out_row @ ref_row / (ref_row @ ref_row).clamp_min(1e-300))
    if (out_row - c * ref_row).norm() <= 1e-3 * out_row.norm():
        return c
    return None


# ---------------------------------------------------------------------------------------------
# Exercise 1 (notebook 05): FlashAttention-2 for one head, streaming over K/V blocks


def _v2_model(q, k, v, block_n: int, causal: bool, **switches) -> torch.Tensor:
    """The v2 loop for one head (N, D) in float64, all N queries in one tile, with ``switches`` (a mistake of
    ``V2_SWITCHES``) put in."""
    q, k, v = (t.double()[None] for t in (q, k, v))
    N, D = q.shape[1:]
    return v2_tile_model(q, k, v, causal, N, block_n, 1.0 / math.sqrt(D), **switches)[0]


# mistake (flash_models.V2_SWITCHES) -> diagnosis ({row}, {how}, {case}, {tail} are filled in), in the order
# tried; NaN-producing models are matched NaN for NaN, so the first ones here are recognised before any
# generic NaN message
V2_MESSAGES = {
    "exp_old_max":
        "every row is NaN ({case}): you exponentiate the scores against mi, the running max from *before* this "
        "block, which is -inf at the first block: exp(sij - (-inf)) = inf. Compute mi_new = max(mi, rowmax(sij)) "
        "first and use pij = exp(sij - mi_new[:, None]).",
    "exp_old_max_guarded":
        "row {row} {how} ({case}): you exponentiate the scores against the running max from before this block "
        "(and 0 at the first). pij must be exp(sij - mi_new) with mi_new = max(mi, rowmax(sij)), the max that "
        "includes this block: then every exponent is <= 0 and alpha = exp(mi - mi_new) rescales the old state.",
    "max_never_updated":
        "row {row} {how} ({case}): only the last block counts. mi is never updated (mi = mi_new is missing), so "
        "it stays -inf, alpha = exp(-inf - mi_new) = 0 at every step and the state is wiped each time.",
    "unmasked_tail":
        "row {row} {how} ({case}): the last block was filled up with zero keys to block_n, and their scores "
        "(0, not -inf) count: each adds exp(0 - mi_new) to li. Keys past N must get the score -inf (or use a "
        "shorter last block, k[start:start + block_n]).",
    "missing_alpha_acc":
        "row {row} {how} ({case}): did you rescale the accumulator by "
        "alpha = exp(mi - mi_new) before adding pij @ vj? When the running max grows, what acc holds "
        "was weighted against the old max.",
    "missing_alpha_l":
        "row {row} {how} ({case}): did you rescale li by alpha? "
        "li = alpha * li + pij.sum(-1): the old sum was taken against the old max, like acc.",
    "missing_alpha_both":
        "row {row} {how} ({case}): neither acc nor li is rescaled when the running max grows; "
        "multiply both by alpha = exp(mi - mi_new) before adding the new block.",
    "no_final_division":
        "row {row} {how} ({case}), which is that row's softmax denominator: "
        "did you divide acc by li once after the loop?",
    "divide_every_step":
        "row {row} {how} ({case}): you divide acc by li_new at every step without undoing the "
        "previous division. Either keep acc unnormalized and divide once at the end (v2), or multiply "
        "the old li back in before adding: acc = (alpha * li * acc + pij @ vj) / li_new (v1).",
    "divide_every_step_and_end":
        "row {row} {how} ({case}): acc is divided by li_new at every step and again at the end. "
        "In the v2 form acc stays unnormalized inside the loop: divide once, after it.",
    "dropped_tail":
        "row {row} {how} ({case}): the last {tail} keys are never used. N is not a multiple of "
        "block_n; loop with range(0, N, block_n) and let the last block be shorter.",
}


def _v2_cases():
    # (N, D, block_n, causal): N not a multiple of block_n in most; all queries form one tile
    # (BLOCK_M = N > block_n), so a causal run has rows fully masked inside every later K/V block.
    return ((48, 16, 16, False), (50, 16, 16, False), (50, 16, 16, True), (37, 8, 8, True),
            (29, 8, 64, True))


def _case_text(N, block_n, causal):
    return f"N={N}, block_n={block_n}, causal={causal}"


def _same(out: torch.Tensor, model: torch.Tensor) -> bool:
    """NaN where the model has NaN, and the finite values within TOL (relative, Frobenius)."""
    bad = ~torch.isfinite(model)
    if not torch.equal(bad, ~torch.isfinite(out)):
        return False
    return bool(bad.all()) or rel_error(out[~bad], model[~bad]) <= TOL


def _precision_message(out, ref, rounded_run, text) -> str | None:
    """A result about as far from the reference as the right computation on inputs rounded to 16 bits
    (``rounded_run(dtype)`` returns that computation's output)."""
    err = rel_error(out, ref)
    for dtype, roundoff in ((torch.float16, "4.9e-4"), (torch.bfloat16, "3.9e-3")):
        if err <= 3 * rel_error(rounded_run(dtype), ref):
            return (f"the output is close but not exact ({text}): relative error {err:.2g}, about what rounding "
                    f"the inputs to {str(dtype).replace('torch.', '')} gives (unit roundoff {roundoff}). Compute in "
                    "the inputs' dtype (float32): no .half(), .bfloat16() or 16-bit tensors in the loop.")
    return None


def _diagnose_v2(case, out, ref, q, k, v, passed):
    N, D, block_n, causal = case
    text = _case_text(N, block_n, causal)
    bad_rows = _bad_rows(out, ref) or [0]
    row = bad_rows[0]
    factor = _factor(out[row], ref[row]) if torch.isfinite(out[row]).all() else None
    how = f"is off by a factor of {factor:.4g}" if factor is not None else "is wrong"
    for name, message in V2_MESSAGES.items():
        model = _v2_model(q, k, v, block_n, causal, **V2_SWITCHES[name])
        if not _same(ref, model) and _same(out, model):
            raise ExerciseFailed(message.format(row=row, how=how, case=text, tail=N % block_n))
    bad = _nonfinite_rows(out)
    if bad:
        raise ExerciseFailed(
            f"{_rows_text(bad)} contain NaN or inf ({text}). "
            + ("Here all N queries form one tile, taller than block_n, so with causal=True every K/V block "
               "after the first has fully masked query rows (those before the block's first key: all their "
               "scores are -inf). Their block max is -inf and exp(-inf - (-inf)) = NaN. Exponentiate against the "
               "running max mi_new (finite after the first block), or replace a -inf max by 0 before "
               "subtracting it." if causal else
               "Check the initial state (mi = -inf, li = 0, acc = 0) and that you never divide by 0.")
        )
    precision = _precision_message(
        out, ref, lambda dtype: _v2_model(*(t.to(dtype) for t in (q, k, v)), block_n, causal), text)
    if precision:
        raise ExerciseFailed(precision)
    if causal and any(not c for (_, _, _, c) in passed):
        raise ExerciseFailed(
            f"the non-causal runs are right but {text} is not (first wrong row {row}): check the causal "
            "mask. Query i may see key j when j <= i, with j the key's position in the whole sequence "
            "(start + its index in the block), not its index inside the block.")
    if factor is not None:
        raise ExerciseFailed(
            f"row {row} {how} ({text}): the weights are right but their sum is "
            "not; check that li and acc are rescaled by the same alpha and that you divide by li once.")
    raise ExerciseFailed(
        f"the output is wrong ({text}): relative error {rel_error(out, ref):.3g}, first wrong row {row} of "
        f"{N}. Did you use scale = 1/sqrt(D) and exponentiate the scores against the running max?")


@exercise("flash_v2")
def check_flash_v2(fn) -> str:
    """Check ``fn(q, k, v, block_n, causal)``: one head of FlashAttention-2 in PyTorch, (N, D) in and out."""
    passed = []  # the cases (N, D, block_n, causal) that came out right
    worst = 0.0
    for seed, case in enumerate(_v2_cases()):
        N, D, block_n, causal = case
        q, k, v = _qkv(N, D, seed=100 + seed)
        ref = _reference(q, k, v, causal)
        out = _as_output(call(fn, q.clone(), k.clone(), v.clone(), block_n, causal), (N, D),
                         f"flash_v2 output for q of shape ({N}, {D})")
        err = rel_error(out, ref)
        if not err <= TOL:
            _diagnose_v2(case, out, ref, q, k, v, passed)
        passed.append(case)
        worst = max(worst, err)
    return (f"matches the float64 reference (worst relative error {worst:.1e}) for "
            f"{len(passed)} cases, N not a multiple of block_n, causal and not")


# ---------------------------------------------------------------------------------------------
# Exercise 2 (notebook 04): one FlashAttention-1 update, the state kept normalized


def _v1_model(q, k, v, block_m: int, block_n: int, scale: float, **switches) -> torch.Tensor:
    """The v1 loop for one head (N, D) in float64 with ``switches`` (a mistake of ``V1_SWITCHES``) put in."""
    q, k, v = (t.double()[None] for t in (q, k, v))
    return v1_tile_model(q, k, v, False, block_m, block_n, scale, **switches)[0]


V1_MESSAGES = {  # mistake (flash_models.V1_SWITCHES) -> diagnosis, in the order tried
    "missing_beta_o":
        "row {row} of O is wrong ({case}): did you multiply pij @ vj by beta = exp(mij - mi_new)? pij was "
        "exponentiated against the block's own max mij, so it must be brought to the new max mi_new.",
    "missing_beta_l":
        "row {row} {how} ({case}): li_new = alpha * li + beta * lij: the block's sum lij is taken against "
        "its own max mij and needs beta = exp(mij - mi_new) too.",
    "missing_beta_both":
        "row {row} {how} ({case}): beta = exp(mij - mi_new) is missing from both li_new and the new "
        "term of O.",
    "missing_alpha":
        "row {row} {how} ({case}): did you rescale the old state by alpha = exp(mi - mi_new)? Both li "
        "and the old O were weighted against the old max.",
    "no_division":
        "row {row} {how} ({case}): O is never divided by li_new. In the v1 form O is kept normalized: "
        "oi_new = (alpha * li * oi + beta * pij @ vj) / li_new at every step.",
    "no_undo":
        "row {row} {how} ({case}): the old O is already divided by li; multiply it back by li before "
        "adding the new block: oi_new = (alpha * li * oi + beta * pij @ vj) / li_new.",
}


def _run_v1(step, q, k, v, block_m, block_n, scale):
    """Drive a step function in the v1 loop order: outer loop over K/V blocks, inner over Q blocks."""
    N, D = q.shape
    o = torch.zeros(N, D, dtype=q.dtype)
    row_sum = torch.zeros(N, dtype=q.dtype)
    row_max = torch.full((N,), float("-inf"), dtype=q.dtype)
    for start_n in range(0, N, block_n):
        kj, vj = k[start_n:start_n + block_n], v[start_n:start_n + block_n]
        for start_m in range(0, N, block_m):
            rows = slice(start_m, start_m + block_m)
            new = step(q[rows], kj, vj, o[rows].clone(), row_sum[rows].clone(), row_max[rows].clone(), scale)
            if not (isinstance(new, tuple) and len(new) == 3):
                raise ExerciseFailed("flash_v1_step should return a tuple (oi_new, li_new, mi_new)")
            n_rows = q[rows].shape[0]
            o[rows] = _as_output(new[0], (n_rows, D), "oi_new").to(q.dtype)
            row_sum[rows] = _as_output(new[1], (n_rows,), "li_new").to(q.dtype)
            row_max[rows] = _as_output(new[2], (n_rows,), "mi_new").to(q.dtype)
    return o, row_sum, row_max


@exercise("flash_v1_step")
def check_flash_v1_step(fn) -> str:
    """Check ``fn(qi, kj, vj, oi, li, mi, scale) -> (oi_new, li_new, mi_new)``, the FA1 update."""
    N, D, block_m, block_n = 50, 16, 16, 16
    case = f"N={N}, blocks {block_m}x{block_n}, after all K/V blocks"
    q, k, v = _qkv(N, D, seed=7)
    scale = 1.0 / math.sqrt(D)
    ref = _reference(q, k, v, causal=False)
    s = (q.double() @ k.double().T) * scale
    m_ref = s.amax(dim=-1)
    l_ref = torch.exp(s - m_ref[:, None]).sum(-1)

    def learner(*args):
        return call(fn, *args)

    o, row_sum, row_max = (t.double() for t in _run_v1(learner, q, k, v, block_m, block_n, scale))
    bad = _nonfinite_rows(o)
    if bad:
        raise ExerciseFailed(
            f"{_rows_text(bad)} of O contain NaN or inf ({case}). The state starts at O = 0, l = 0, "
            "m = -inf: dividing by the old li (0 at the first block) gives inf, for example; divide by li_new.")
    if rel_error(o, ref) > TOL:
        row = _bad_rows(o, ref)[0]
        factor = _factor(o[row], ref[row])
        how = f"is off by a factor of {factor:.4g}" if factor is not None else "is wrong"
        for name, message in V1_MESSAGES.items():
            mo = _v1_model(q, k, v, block_m, block_n, scale, **V1_SWITCHES[name])
            if rel_error(mo, ref) > TOL and rel_error(o, mo) <= TOL:
                raise ExerciseFailed(message.format(row=row, how=how, case=case))

        def rounded_run(dtype):
            return _v1_model(*(t.to(dtype) for t in (q, k, v)), block_m, block_n, scale)

        precision = _precision_message(o, ref, rounded_run, case)
        if precision:
            raise ExerciseFailed(precision)
        raise ExerciseFailed(
            f"O is wrong ({case}): relative error {rel_error(o, ref):.3g}, first wrong row {row}. "
            "The v1 update: mij = rowmax(sij), pij = exp(sij - mij), lij = rowsum(pij), "
            "mi_new = max(mi, mij), alpha = exp(mi - mi_new), beta = exp(mij - mi_new), "
            "li_new = alpha*li + beta*lij, oi_new = (alpha*li*oi + beta*pij@vj) / li_new.")
    if rel_error(row_max, m_ref) > TOL or rel_error(row_sum, l_ref) > TOL:
        raise ExerciseFailed(
            f"O is right but the state is not ({case}): mi_new should be the running row max of the scaled "
            "scores, max(mi, rowmax(sij)), and li_new the running sum Σ exp(s - mi_new). A state shifted by a "
            "constant gives the right O here but the wrong statistics for a later pass (e.g. a backward).")
    return (f"O matches the float64 reference (relative error {rel_error(o, ref):.1e}); l and m are the "
            f"row sums and maxima; N={N} with {block_m}x{block_n} blocks")
