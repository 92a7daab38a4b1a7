"""Fill-in-the-kernel exercises of notebooks 04 and 05: the learner writes the Triton.

* ``check_v2_kernel(kernel)`` (notebook 05): the whole FlashAttention-2 forward kernel, one program per
  (Q block, batch·head), with masks for the ragged end, the causal mask and the online softmax. The check
  launches it on grid ``(cdiv(N, BLOCK_M), B·H)`` with BLOCK_M = 32, BLOCK_N = 16.
* ``check_v1_update(update)`` (notebook 04): the body of the v1 inner loop as a ``@triton.jit`` function
  ``update(qi, kj, vj, oi, li, mi, keep, scale, PRECISION) -> (oi_new, li_new, mi_new)``, called by the
  course's own v1 kernel, ``kernels/v1.py``'s ``attn_kernel_v1``, in place of its ``v1_update`` (outer
  loop over K/V blocks, inner over Q blocks, state in HBM).

Each check runs the kernel on cases ordered so that one kind of mistake shows at a time (one head and
whole blocks; a ragged N with B, H > 1; causal; q, k, v and o each with their own strides, none of them 1;
N = 1; large scores; rows whose scores are all far below zero; float16), compares with the float64
reference, and, when wrong, names a mistake only when a model of it reproduces the result: float64 models of
the same loop with one classic mistake in it (``flash_models``: the tile structure included, so that a mask
using the index inside the block, or an unmasked ragged end, is reproduced exactly), then the layout models
of ``layout_checks`` (a tensor read or O stored through the wrong strides or head offsets, swapped program
ids). Where none fits, the message says what is known (``evidence.known``).
"""

# ruff: noqa: E741  (Q, K, V, O: the papers' notation, as in flashattn/kernels)

from __future__ import annotations

import torch
import triton

from flashattn import runtime
from flashattn.kernels.v1 import attn_kernel_v1

from ._check import exercise
from .attention_cases import (
    FIRST_CASES,
    LARGE_SCORES,
    N_IS_ONE,
    NEGATIVE_ROWS,
    ONE_HEAD,
    Case,
    fail,
    input_buffers,
    match_models,
    output_buffer,
    per_head_hint,
    random_qkv,
    reference_of,
)
from .evidence import Named, known
from .flash_models import NEG_INF, V1_SWITCHES, V2_SWITCHES, v1_tile_model, v2_tile_model
from .layout_checks import name_read_mistake, name_store_mistake, store_models
from .triton_check import close, launch, near_miss_hint, require_jit, require_masks, tolerance
from .triton_launch import check_undefined_lanes

MODEL_TOL = 1e-4  # a float32 kernel and its float64 model agree to ~1e-6; mistakes differ by far more
ROUNDED = ("the output is close but not exact, as if {what} were rounded to float16 (the model of that gives this "
           "result): this is a float32 problem, so keep every step in float32. ")

V2_MESSAGES = {  # mistake (flash_models.V2_SWITCHES) -> what the learner should change, in the order tried
    "exp_old_max":
        "every row is NaN: you exponentiate the scores against the running max from *before* this block. At "
        "the first block it is -inf, so exp(sij - mi) = exp(+inf). Compute mi_new = max(mi, rowmax(sij)) first "
        "and use pij = exp(sij - mi_new[:, None]).",
    "max_never_updated":
        "only the last K/V block counts: mi is never updated (mi = mi_new is missing), so it stays -inf, alpha = "
        "exp(-inf - mi_new) = 0 at every step, and the state is wiped each time. Set mi = mi_new at the end of "
        "each step.",
    "unmasked_tail":
        "the keys past N (the ragged end of the last K block) count: they were loaded as 0.0, so their scores "
        "are 0, not -inf, and each adds exp(0 - mi_new) to li. Mask the scores: sij = tl.where(offs_n[None, :] "
        "< N, sij, float('-inf')).",
    "missing_alpha_acc":
        "acc is not rescaled: when the running max grows, what acc holds was weighted against the old max. "
        "Multiply it by alpha = exp(mi - mi_new) before adding pij @ vj (e.g. tl.dot(p, vj, acc * alpha[:, None])).",
    "missing_alpha_l":
        "li is not rescaled: li = alpha * li + rowsum(pij), with alpha = exp(mi - mi_new), like acc.",
    "missing_alpha_both":
        "neither acc nor li is rescaled when the running max grows: multiply both by alpha = exp(mi - mi_new).",
    "no_final_division":
        "acc is never divided by li: divide once, after the loop, acc / li[:, None].",
    "divide_every_step":
        "acc is divided by li at every step: in v2 acc stays unnormalized in the loop; divide once after it.",
    "causal_strict":
        "the causal mask is off by one: it hides the diagonal. Query i sees key j when j <= i, not j < i.",
    "causal_local":
        "the causal mask compares the indices inside the tiles (tl.arange(0, BLOCK_N) against "
        "tl.arange(0, BLOCK_M)). Compare positions in the whole sequence: offs_n[None, :] <= offs_m[:, None].",
    "causal_wrong_way":
        "the causal mask points the wrong way: it hides the past. Keep key j for query i when j <= i.",
    "causal_missing":
        "there is no causal mask: with CAUSAL, query i sees only keys j <= i (and the loop can stop at the end of "
        "the diagonal block).",
    "causal_stops_early":
        "the causal loop stops before the diagonal block: the keys from the block's first query to its last are "
        "needed too. Loop up to min(N, (pid_m + 1) * BLOCK_M).",
    "fa1_exponent_unguarded":
        "NaN in the rows that are fully masked inside a diagonal block (with BLOCK_M = 32 > BLOCK_N = 16 some "
        "query rows see none of the block's keys): their block max is -inf and exp(-inf - (-inf)) = NaN. "
        "Exponentiate against the running max mi_new, which is finite from the first block on.",
    "max_from_zero":
        "the rows whose scores are all below -100 are NaN: mi starts at 0 instead of -inf. For those rows mi_new = "
        "max(0, rowmax(sij)) stays 0, every pij = exp(sij - 0) underflows to 0, li = 0 and acc / li = 0 / 0. "
        "Start the running max at -inf: mi = tl.full([BLOCK_M], float('-inf'), tl.float32).",
    "max_from_zero_sum_from_one":
        "mi starts at 0 and li at 1: with a finite starting max, alpha = exp(mi - mi_new) no longer wipes the "
        "starting state at the first block, so the 1 in li counts (and the rows whose scores are all below -100 "
        "come out 0). Start with mi = -inf, li = 0, acc = 0.",
    "max_from_zero_acc_from_one":
        "mi starts at 0 and acc does not start at 0: with a finite starting max, alpha = exp(mi - mi_new) no "
        "longer wipes the starting acc at the first block. Start with mi = -inf, li = 0, acc = 0 (tl.zeros).",
    "no_max":
        "NaN or inf where the scores are large: the scores are exponentiated without subtracting a max, and exp "
        "overflows float32 above 88.7. Exponentiate against the running max, pij = exp(sij - mi_new), which keeps "
        "every exponent <= 0.",
    "rounded_out": ROUNDED.format(what="the stored output") + "Store acc / li[:, None] as it is: tl.store converts "
        "to O's dtype itself.",
    "rounded_p": ROUNDED.format(what="the exponentials pij") + "Convert pij to vj.dtype (float32 here), not to "
        "tl.float16, before the product.",
    "rounded_pv": ROUNDED.format(what="pij and vj") + "Convert pij to vj.dtype, and leave vj as it was loaded.",
    "rounded_qk": ROUNDED.format(what="qi and kj") + "Multiply the tiles as they were loaded.",
}


def _name_the_mistake(case: Case, got, ref, tol: float, qkv, model, switches, messages, block_m: int,
                      block_n: int) -> None:
    """Fail with the message of the first mistake of ``messages`` whose model (``model`` run with the mistake's
    ``switches`` over the case's heads) ``got`` reproduces; return if none does."""
    shape = (case.B * case.H, case.N, case.D)
    flat = [t.reshape(shape) for t in qkv]

    def build(name):
        options = dict(switches[name])
        dtype = options.pop("dtype", torch.float64)  # float32 where the mistake shows only as float32 underflow
        if case.dtype != torch.float32 and options.get("rounded"):
            return lambda: None  # rounding to float16 is no mistake in a float16 problem
        return lambda: model(*(t.to(dtype) for t in flat), case.causal, block_m, block_n, case.scale,
                             **options).double().reshape(got.shape)

    models = [(build(name), message) for name, message in messages.items()]
    message = match_models(got, ref, models, MODEL_TOL if case.dtype == torch.float32 else 10 * tol, ref_tol=tol)
    if message:
        fail(case, message)


V2_BLOCK_M, V2_BLOCK_N = 32, 16
V2_CASES = (
    *FIRST_CASES,
    Case("q, k, v, o non-contiguous, each with its own strides (none of them 1)", 2, 2, 17, 16, True,
         layout="mixed"),
    N_IS_ONE, LARGE_SCORES, NEGATIVE_ROWS,
    Case("float16, non-contiguous", 1, 2, 100, 16, True, torch.float16, "mixed"),
)


def _launch_v2(kernel, case: Case, Q, K, V, O, undefined_lanes: bool = True) -> None:
    grid = (triton.cdiv(case.N, V2_BLOCK_M), case.B * case.H)
    launch(kernel, grid, Q.view, K.view, V.view, O.view, *Q.view.stride(), *K.view.stride(), *V.view.stride(),
           *O.view.stride(), case.H, case.N, case.scale, D=case.D, BLOCK_M=V2_BLOCK_M, BLOCK_N=V2_BLOCK_N,
           CAUSAL=case.causal, PRECISION="ieee", where=case.text(), undefined_lanes=undefined_lanes)


def _output(case: Case):
    # rows past N of every head land in padding (BLOCK_M rows), where a write past the end shows
    return output_buffer(case, "o", (case.B, case.H, case.N, case.D), case.dtype, V2_BLOCK_M)


def _reads_outside(kernel_run, case: Case, qkv) -> bool:
    """Run again with zeros around the inputs instead of NaN: does the output become finite?"""
    Q, K, V = input_buffers(case, qkv, fill=0.0)
    O = _output(case)
    kernel_run(Q, K, V, O)
    return bool(torch.isfinite(O.view).all())


def _rows_index(case: Case, rows: int) -> torch.Tensor:
    """(n, 4) positions (b, h, row, d) for rows 0 .. rows - 1 of every head."""
    return torch.cartesian_prod(torch.arange(case.B), torch.arange(case.H), torch.arange(rows), torch.arange(case.D))


def _grid_swapped(case: Case, O) -> set[int]:
    """The positions a store changes when the program ids are swapped: program (x, y) of the grid
    (cdiv(N, BLOCK_M), B·H) takes pid_bh = x and pid_m = y."""
    sb, sh, sn, sd = O.view.stride()
    out = set()
    for x in range(triton.cdiv(case.N, V2_BLOCK_M)):
        base = O.offset + (x // case.H) * sb + (x % case.H) * sh
        for y in range(case.B * case.H):
            for r in range(y * V2_BLOCK_M, min(case.N, (y + 1) * V2_BLOCK_M)):
                out.update(base + r * sn + d * sd for d in range(case.D))
    return out


def _check_v2_store(case: Case, named: dict) -> None:
    O = named["O"]

    def models():
        found = store_models(O, [named[n] for n in "QKV"], _rows_index(case, case.N))
        found.append(("the program ids are swapped: the check launches the grid (cdiv(N, BLOCK_M), B·H), so "
                      "pid_m = tl.program_id(0) and pid_bh = tl.program_id(1)", _grid_swapped(case, O.buffer)))
        return found

    def unmasked():
        rows = _rows_index(case, triton.cdiv(case.N, V2_BLOCK_M) * V2_BLOCK_M)
        return set((O.buffer.offset + rows @ torch.tensor(O.strides)).tolist())

    name_store_mistake(case.text(), O, models, unmasked=unmasked,
                       mask_text="Rows past N belong to no query: store with mask=offs_m[:, None] < N.")


def _diagnose_v2(kernel_run, case: Case, named: dict, qkv, passed: list[Case]) -> None:
    _check_v2_store(case, named)
    got, ref = named["O"].buffer.view.double().cpu(), reference_of(case, *qkv)
    tol = tolerance(case.dtype)
    if close(got, ref, tol):
        return
    if not torch.isfinite(got).all():  # first: a result that is NaN everywhere fits several models
        def rerun():
            Q, K, V = input_buffers(case, qkv)
            O = _output(case)
            kernel_run(Q, K, V, O, undefined_lanes=False)
            return O.view

        check_undefined_lanes(kernel_run.kernel, rerun, case.text())
    _name_the_mistake(case, got, ref, tol, qkv, v2_tile_model, V2_SWITCHES, V2_MESSAGES, V2_BLOCK_M, V2_BLOCK_N)
    model_tol = MODEL_TOL if case.dtype == torch.float32 else 10 * tol

    def evaluate(Q=None, K=None, V=None):
        q, k, v = (t if t is not None else d for t, d in zip((Q, K, V), qkv, strict=True))
        return reference_of(case, q, k, v)

    name_read_mistake(case.text(), got, model_tol, [named[n] for n in "QKV"], [named["O"]], evaluate)
    if not torch.isfinite(got).all() and _reads_outside(kernel_run, case, qkv):
        fail(case, "NaN in the output, which goes away when the memory around q, k and v holds zeros instead of "
             "NaN: your kernel reads past the end of a tensor (rows >= N) and uses what it reads. 0 * NaN is NaN "
             "even where p = 0: load K and V with mask=offs_n[:, None] < N, other=0.0.")
    hint = per_head_hint(got, ref, tol)
    if hint:
        fail(case, hint)
    err = ((got - ref).norm() / ref.norm()).item()
    what = known(got, ref, tol)
    if passed and case.layout == "mixed" and not any(c.layout == "mixed" for c in passed):
        fail(case, f"the contiguous cases were right, this one is not ({what}). What differs here is the layout: "
             "each tensor has its own strides, none of them 1 (q, k, v, o each in memory of its own shape, with "
             "padding). Use each tensor's four strides for every step, never N*D, D or 1.")
    fail(case, f"the output is wrong, and no single classic mistake of the v2 loop reproduces it ({what}). Compare "
         "your loop with the v2 pseudo-code: sij, mi_new, pij, alpha, li, acc, mi." + near_miss_hint(err, case.dtype))


@exercise("v2 kernel")
def check_v2_kernel(kernel) -> str:
    """``kernel(Q, K, V, O, 16 strides, H, N, scale, D, BLOCK_M, BLOCK_N, CAUSAL, PRECISION)``: FlashAttention-2."""
    require_jit(kernel, "the attention kernel")
    passed: list[Case] = []
    for seed, case in enumerate(V2_CASES):
        qkv = random_qkv(case, seed=200 + seed)
        Q, K, V = input_buffers(case, qkv)
        O = _output(case)

        def run(Q, K, V, O, case=case, undefined_lanes=True):
            _launch_v2(kernel, case, Q, K, V, O, undefined_lanes)

        run.kernel = kernel

        run(Q, K, V, O)
        named = {n: Named(n, b, "bhnd") for n, b in zip("QKVO", (Q, K, V, O), strict=True)}
        _diagnose_v2(run, case, named, qkv, passed)
        passed.append(case)
    require_masks(kernel, "N is not a multiple of BLOCK_M or BLOCK_N: the last blocks stick out of Q, K, V and O.")
    return (f"{len(passed)} cases: ragged N, B and H > 1, causal with fully masked rows in diagonal blocks, "
            "non-contiguous inputs and output, N = 1, large scores, rows of large negative scores, float16")


# ---------------------------------------------------------------------------------------------
# Notebook 04: the v1 update, as a @triton.jit function called by the v1 loop


V1_MESSAGES = {  # mistake (flash_models.V1_SWITCHES) -> what the learner should change, in the order tried
    "exp_old_max":
        "every row is NaN: pij is exponentiated against mi, the running max from before this block, which is "
        "-inf at the first block. In the v1 form pij = exp(sij - mij) with mij the block's own row max.",
    "keep_ignored":
        "the scores outside `keep` are used: the keys past N (loaded as 0.0, so scoring 0) and, when causal, "
        "the future keys. Apply the mask first: sij = tl.where(keep, sij, float('-inf')).",
    "keep_zero":
        "the masked scores are set to 0, not -inf: exp(0 - mij) still gives them weight. Use float('-inf').",
    "unguarded":
        "NaN in the rows that are fully masked inside a block (with BLOCK_M = 32 > BLOCK_N = 16 and causal, some "
        "query rows see none of a diagonal block's keys): their mij is -inf and exp(-inf - (-inf)) = NaN. "
        "Exponentiate those rows against 0 instead: tl.where(mij == float('-inf'), 0.0, mij).",
    "exp_new_max_and_beta":
        "pij is exponentiated against mi_new and then multiplied by beta as well: beta is applied twice. In the "
        "v1 form pij = exp(sij - mij) (the block's own max) and beta = exp(mij - mi_new) moves it to mi_new.",
    "missing_alpha":
        "the old state is not rescaled: multiply li and the old O by alpha = exp(mi - mi_new), both weighted "
        "against the old max.",
    "missing_beta_both":
        "beta = exp(mij - mi_new) is missing from both li_new and the new term of O.",
    "missing_beta_o":
        "pij @ vj is not multiplied by beta = exp(mij - mi_new): pij was exponentiated against the block's max.",
    "missing_beta_l":
        "li_new = alpha * li + beta * lij: the block's sum lij is relative to its own max and needs beta too.",
    "no_division":
        "O is never divided by li_new: in the v1 form O is kept normalized, "
        "oi_new = (alpha * li * oi + beta * pij @ vj) / li_new at every step.",
    "no_undo":
        "the old O is already divided by li: multiply it back by li before adding the new block, "
        "oi_new = (alpha * li * oi + beta * pij @ vj) / li_new.",
    "alpha_beta_swapped_l":
        "alpha and beta are swapped in the update of li: li_new = alpha * li + beta * lij (alpha rescales the old "
        "sum, beta the block's own lij). Check oi_new as well: with li_new = 0 after the first block, O is NaN "
        "whichever way round it uses them.",
    "alpha_beta_swapped":
        "alpha and beta are swapped in both li_new and oi_new: alpha = exp(mi - mi_new) rescales the old state "
        "(li, oi), beta = exp(mij - mi_new) the block's new terms (lij, pij @ vj).",
    "alpha_beta_swapped_o":
        "alpha and beta are swapped in the update of O: oi_new = (alpha * li * oi + beta * pij @ vj) / li_new "
        "(alpha rescales the old state, beta the block's new term).",
    "rounded_out": ROUNDED.format(what="oi_new") + "Return oi_new in float32: the v1 kernel stores it.",
    "rounded_p": ROUNDED.format(what="pij") + "Convert pij to vj.dtype (float32 here) before the product.",
}


V1_BLOCK_M, V1_BLOCK_N = 32, 16
V1_CASES = (
    ONE_HEAD,
    Case("causal: rows fully masked inside diagonal blocks", 1, 2, 64, 16, True),
    Case("N not a multiple of the blocks, B and H > 1, causal", 2, 2, 50, 16, True),
    Case("N = 17, shorter than one Q block", 2, 1, 17, 16, False),
    N_IS_ONE, LARGE_SCORES, NEGATIVE_ROWS,
    Case("float16", 1, 2, 100, 16, True, torch.float16),
)


def _run_v1(update, case: Case, qkv) -> tuple[torch.Tensor, torch.Tensor]:
    q, k, v = (t.to(runtime.DEVICE, case.dtype) for t in qkv)
    B, H, N, D = q.shape
    o = torch.zeros_like(q)
    l = torch.zeros(B * H, N, dtype=torch.float32, device=q.device)  # noqa: E741
    m = torch.full((B * H, N), NEG_INF, dtype=torch.float32, device=q.device)
    launch(attn_kernel_v1, (B * H,), q, k, v, o, l, m, *q.stride(), *k.stride(), *v.stride(), *o.stride(),
           H, N, case.scale, D=D, BLOCK_M=V1_BLOCK_M, BLOCK_N=V1_BLOCK_N, CAUSAL=case.causal,
           PRECISION="ieee", UPDATE=update, where=case.text(), source=update)
    return o.double().cpu(), l.double().cpu().reshape(B, H, N)


def _diagnose_v1(case: Case, got, qkv, row_sum) -> None:
    ref = reference_of(case, *qkv)
    tol = tolerance(case.dtype)
    if close(got, ref, tol):
        return
    # the models give O and the final l side by side: mistakes with the same O (NaN everywhere, say) differ in l
    both = torch.cat([got, row_sum[..., None]], dim=-1)
    right = v1_tile_model(*(t.reshape(case.B * case.H, case.N, case.D) for t in qkv), case.causal, V1_BLOCK_M,
                          V1_BLOCK_N, case.scale, with_sum=True).reshape(both.shape)
    switches = {name: dict(V1_SWITCHES[name], with_sum=True) for name in V1_MESSAGES}
    _name_the_mistake(case, both, right, tol, qkv, v1_tile_model, switches, V1_MESSAGES, V1_BLOCK_M, V1_BLOCK_N)
    err = ((got - ref).norm() / ref.norm()).item()
    what = known(got, ref, tol)
    if not torch.isfinite(got).all():
        if case.q_scale > 1:
            fail(case, f"NaN or inf for large scores: exp overflows float32 above 88.7; exponentiate against a max "
                 f"({what}).")
        fail(case, f"NaN or inf in O ({what}). The state starts at O = 0, l = 0, m = -inf: dividing by the old li "
             "(0 at the first block) gives inf; divide by li_new. And exp(-inf - (-inf)) is NaN.")
    fail(case, f"O is wrong, and no single classic mistake of the v1 update reproduces it ({what}). The v1 "
         "update: sij masked with keep, mij = rowmax(sij), pij = exp(sij - mij), lij = rowsum(pij), mi_new = "
         "max(mi, mij), alpha = exp(mi - mi_new), beta = exp(mij - mi_new), li_new = alpha*li + beta*lij, "
         "oi_new = (alpha*li*oi + beta*pij@vj) / li_new." + near_miss_hint(err, case.dtype))


@exercise("v1 update")
def check_v1_update(update) -> str:
    """``update(qi, kj, vj, oi, li, mi, keep, scale, PRECISION) -> (oi_new, li_new, mi_new)``, @triton.jit."""
    require_jit(update, "the update function")
    for seed, case in enumerate(V1_CASES):
        qkv = random_qkv(case, seed=300 + seed)
        o, row_sum = _run_v1(update, case, qkv)
        _diagnose_v1(case, o, qkv, row_sum)
    return (f"{len(V1_CASES)} cases in the v1 loop: ragged N, B and H > 1, causal with fully masked rows, N = 1, "
            "large scores, rows of large negative scores, float16")
