"""The FlashAttention loops of notebooks 04 and 05 in float64, each with switches that put in one classic
mistake: the "mistake models" that the checks of ``flash`` (the loops in PyTorch) and ``flash_kernels``
(the kernels in Triton) compare a wrong answer with, to say which mistake it looks like.

The models run tile by tile, as the kernels do, so that a mask using the index inside the block, or an
unmasked ragged end, is reproduced exactly. ``V2_SWITCHES`` and ``V1_SWITCHES`` name each mistake once;
each check pairs the names with its own message.
"""

from __future__ import annotations

import torch

NEG_INF = float("-inf")


def _causal_keep(rows, cols, start_m, causal_mask):
    if causal_mask == "right":
        return cols[None, :] <= rows[:, None]
    if causal_mask == "strict":
        return cols[None, :] < rows[:, None]
    if causal_mask == "local":
        return (cols - cols[0])[None, :] <= (rows - start_m)[:, None]
    if causal_mask == "wrong_way":
        return cols[None, :] >= rows[:, None]
    return torch.ones(len(rows), len(cols), dtype=torch.bool)  # "none"


def _half(x, where: str, rounded) -> torch.Tensor:
    """x rounded to float16 (and back) when ``where`` is one of the places ``rounded`` names."""
    return x.to(torch.float16).to(x.dtype) if where in rounded else x


def _tile(x, cols, N):
    """Rows ``cols`` of x (BH, N, D), zero where cols >= N: what a load with other=0.0 gives."""
    out = torch.zeros(x.shape[0], len(cols), x.shape[2], dtype=x.dtype)
    ok = cols < N
    out[:, ok] = x[:, cols[ok]]
    return out


def v2_tile_model(q, k, v, causal: bool, block_m: int, block_n: int, scale: float, *, tail="mask",
                  causal_mask="right", hi="right", rescale_acc=True, rescale_l=True, exponent="new",
                  update_max=True, normalize="end", init_max=NEG_INF, init_sum=0.0, init_acc=0.0,
                  rounded=()) -> torch.Tensor:
    """The v2 kernel's loop in float64 over (BH, N, D) tensors, tile by tile, with one mistake switched on.

    tail: "mask" (scores past N are -inf), "zero" (left at the 0.0 the zero-filled keys give) or "drop"
    (the last, shorter key block is never used).
    causal_mask: "right" (key j <= query i), "strict" (j < i), "local" (indices inside the tiles),
    "wrong_way" (j >= i), "none". hi: "right" (causal loop up to the end of the diagonal block) or
    "before_diagonal" (stops where the Q block starts). exponent: "new" (exp(s - mi_new)), "old"
    (exp(s - mi), the max before this block), "old_guarded" (the same with a -inf mi replaced by 0),
    "block" (exp(s - rowmax of the block) with beta, unguarded), "raw" (exp(s), no max at all).
    update_max=False: mi is never assigned. normalize: "end", "never", "every_step" (divide acc by li at
    every step, and not at the end), "every_step_and_end" (both). init_max, init_sum, init_acc: the state
    before the first block (-inf, 0, 0); a finite init_max only shows where float32 underflows, so run that
    model on float32 inputs. rounded: the intermediates rounded to float16 ("qk": q and k before the product,
    "p", "v", "out": the stored output).
    """
    BH, N, D = q.shape
    out = torch.empty_like(q)
    for start_m in range(0, N, block_m):
        rows = torch.arange(start_m, min(start_m + block_m, N))
        qi = q[:, rows]
        mi = torch.full((BH, len(rows)), init_max, dtype=q.dtype)
        li = torch.full((BH, len(rows)), init_sum, dtype=q.dtype)
        acc = torch.full((BH, len(rows), D), init_acc, dtype=q.dtype)
        end = N
        if causal:
            end = min(N, start_m + block_m) if hi == "right" else start_m
        if tail == "drop":
            end = min(end, N - N % block_n)
        for start_n in range(0, end, block_n):
            cols = torch.arange(start_n, start_n + block_n)
            kj, vj = _half(_tile(k, cols, N), "qk", rounded), _half(_tile(v, cols, N), "v", rounded)
            sij = (_half(qi, "qk", rounded) @ kj.transpose(1, 2)) * scale
            keep = (cols < N)[None, :] if tail != "zero" else torch.ones(1, block_n, dtype=torch.bool)
            if causal:
                keep = keep & _causal_keep(rows, cols, start_m, causal_mask)
            sij = sij.masked_fill(~keep, NEG_INF)
            mij = sij.amax(-1)
            mi_new = torch.maximum(mi, mij)
            alpha = torch.exp(mi - mi_new) if exponent != "raw" else torch.ones_like(mi)  # raw: nothing to rescale
            if exponent == "block":
                beta = torch.exp(mij - mi_new)
                pij = torch.exp(sij - mij[..., None])
                rowsum, pv = beta * pij.sum(-1), beta[..., None] * (pij @ vj)
            else:
                against = {"new": mi_new, "old": mi, "old_guarded": torch.where(torch.isneginf(mi), 0.0, mi),
                           "raw": torch.zeros_like(mi)}[exponent]
                pij = _half(torch.exp(sij - against[..., None]), "p", rounded)
                rowsum, pv = pij.sum(-1), pij @ vj
            li = (alpha * li if rescale_l else li) + rowsum
            acc = (alpha[..., None] * acc if rescale_acc else acc) + pv
            if normalize in ("every_step", "every_step_and_end"):
                acc = acc / li[..., None]
            if update_max:
                mi = mi_new
        out[:, rows] = acc / li[..., None] if normalize in ("end", "every_step_and_end") else acc
    return _half(out, "out", rounded)


V2_SWITCHES = {  # mistake -> the switches of v2_tile_model that put it in
    "exp_old_max": dict(exponent="old"),
    "exp_old_max_guarded": dict(exponent="old_guarded"),
    "max_never_updated": dict(update_max=False),
    "unmasked_tail": dict(tail="zero"),
    "dropped_tail": dict(tail="drop"),
    "missing_alpha_acc": dict(rescale_acc=False),
    "missing_alpha_l": dict(rescale_l=False),
    "missing_alpha_both": dict(rescale_acc=False, rescale_l=False),
    "no_final_division": dict(normalize="never"),
    "divide_every_step": dict(normalize="every_step"),
    "divide_every_step_and_end": dict(normalize="every_step_and_end"),
    "causal_strict": dict(causal_mask="strict"),
    "causal_local": dict(causal_mask="local"),
    "causal_wrong_way": dict(causal_mask="wrong_way"),
    "causal_missing": dict(causal_mask="none"),
    "causal_stops_early": dict(hi="before_diagonal"),
    "fa1_exponent_unguarded": dict(exponent="block"),
    # the state before the first block: with mi = -inf, alpha = 0 wipes whatever li and acc start with, so a
    # wrong start of li or acc only counts together with a finite start of mi (and that one only where float32
    # underflows: these models run in float32)
    "max_from_zero": dict(init_max=0.0, dtype=torch.float32),
    "max_from_zero_sum_from_one": dict(init_max=0.0, init_sum=1.0, dtype=torch.float32),
    "max_from_zero_acc_from_one": dict(init_max=0.0, init_acc=1.0, dtype=torch.float32),
    # after those: with every row maximum below 88 a missing max gives what a max started at 0 gives (a case with
    # large scores, earlier in the checks, tells them apart)
    "no_max": dict(exponent="raw", dtype=torch.float32),  # float32: where exp overflows
    # an intermediate rounded to float16 in a float32 problem
    "rounded_out": dict(rounded=("out",)),
    "rounded_p": dict(rounded=("p",)),
    "rounded_pv": dict(rounded=("p", "v")),
    "rounded_qk": dict(rounded=("qk",)),
}


def v1_tile_model(q, k, v, causal: bool, block_m: int, block_n: int, scale: float, *, keep="mask", guard=True,
                  exponent="block", alpha=True, beta_o=True, beta_l=True, division="undo", swapped=(),
                  rounded=(), with_sum=False) -> torch.Tensor:
    """The v1 loop (outer K/V blocks, inner Q blocks) in float64 over (BH, N, D), with one mistake.

    keep: "mask" (scores outside ``keep`` are -inf), "ignore" (no mask: the zero-filled keys past N score
    0, causal ignored), "zero" (masked scores set to 0). guard=False: a fully masked row exponentiates
    against its block max -inf (NaN). exponent: "block" (exp(s - mij)), "new" (exp(s - mi_new), beta
    still applied), "old" (exp(s - mi), the max before this block). division: "undo"
    ((alpha·li·oi + beta·pv) / li_new), "none", "no_undo" ((alpha·oi + beta·pv) / li_new). swapped: where
    alpha and beta trade places ("l": li_new = beta·li + alpha·lij, "o": the same in O). rounded: the
    intermediates rounded to float16 ("p", "out": O after each step). with_sum: return O and the final l side by
    side, (BH, N, D + 1), so that two mistakes with the same O can be told apart by their running sum.
    """
    BH, N, D = q.shape
    o = torch.zeros_like(q)
    row_sum = torch.zeros(BH, N, dtype=q.dtype)
    row_max = torch.full((BH, N), NEG_INF, dtype=q.dtype)
    for start_n in range(0, N, block_n):
        cols = torch.arange(start_n, start_n + block_n)
        kj, vj = _tile(k, cols, N), _tile(v, cols, N)
        lo = (start_n // block_m) * block_m if causal else 0
        for start_m in range(lo, N, block_m):
            rows = torch.arange(start_m, min(start_m + block_m, N))
            oi, li, mi = o[:, rows], row_sum[:, rows], row_max[:, rows]
            sij = (q[:, rows] @ kj.transpose(1, 2)) * scale
            hidden = ~(cols < N)[None, :]
            if causal:
                hidden = hidden | (cols[None, :] > rows[:, None])
            if keep != "ignore":
                sij = sij.masked_fill(hidden, NEG_INF if keep == "mask" else 0.0)
            mij = sij.amax(-1)
            mi_new = torch.maximum(mi, mij)
            offset = {"block": torch.where(torch.isneginf(mij), 0.0, mij) if guard else mij,
                      "new": mi_new, "old": mi}[exponent]
            pij = _half(torch.exp(sij - offset[..., None]), "p", rounded)
            a = torch.exp(mi - mi_new) if alpha else torch.ones_like(mi)
            b = torch.exp(mij - mi_new)
            a_l, b_l = (b, a) if "l" in swapped else (a, b)
            a_o, b_o = (b, a) if "o" in swapped else (a, b)
            li_new = a_l * li + (b_l if beta_l else 1.0) * pij.sum(-1)
            pv = (b_o[..., None] if beta_o else 1.0) * (pij @ vj)
            kept = a_o[..., None] * (li[..., None] * oi if division != "no_undo" else oi) + pv
            o[:, rows] = _half(kept if division == "none" else kept / li_new[..., None], "out", rounded)
            row_sum[:, rows], row_max[:, rows] = li_new, mi_new
    return torch.cat([o, row_sum[..., None]], dim=-1) if with_sum else o


V1_SWITCHES = {  # mistake -> the switches of v1_tile_model that put it in
    "exp_old_max": dict(exponent="old"),
    "keep_ignored": dict(keep="ignore"),
    "keep_zero": dict(keep="zero"),
    "unguarded": dict(guard=False),
    "exp_new_max_and_beta": dict(exponent="new"),
    "missing_alpha": dict(alpha=False),
    "missing_beta_o": dict(beta_o=False),
    "missing_beta_l": dict(beta_l=False),
    "missing_beta_both": dict(beta_o=False, beta_l=False),
    "no_division": dict(division="none"),
    "no_undo": dict(division="no_undo"),
    "alpha_beta_swapped_l": dict(swapped=("l",)),
    "alpha_beta_swapped_o": dict(swapped=("o",)),
    "alpha_beta_swapped": dict(swapped=("l", "o")),
    "rounded_out": dict(rounded=("out",)),
    "rounded_p": dict(rounded=("p",)),
}
