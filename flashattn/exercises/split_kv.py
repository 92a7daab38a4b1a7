"""The exercise of notebook 15: the merge of the splits, written in Triton.

``check_merge_splits(kernel)``: ``kernel(O_PART, LSE_PART, O, num_splits, stride_pr, stride_ps, stride_lr,
stride_or, D, BLOCK_S)`` is one program per output row (grid ``(rows,)``). Split s of row r wrote its partial
output ``O_PART[r, s, :]`` (normalized by its own sum, float32) and its log-sum-exp ``LSE_PART[r, s]``; a split
that saw none of the row's keys wrote lse = -inf and no output (the check fills those with NaN). The kernel writes
``O[r, :] = Σ_s w_s · O_PART[r, s, :] / Σ_s w_s`` with ``w_s = exp(lse_s − max_s lse_s)``. Columns are contiguous;
rows and splits step by the strides given. ``BLOCK_S`` is the power of two >= num_splits.

The cases are ordered so that one kind of mistake shows at a time (every split full; num_splits not a power of two;
empty splits; lse around +100 and around −120), and a wrong result is compared with float64 models of the classic
mistakes: no max subtracted, weights proportional to lse itself (as if lse were the sum l), no division by the sum
of the weights, every split weighed alike, exp2 of a natural-log lse, padding lanes loaded as lse = 0, the
partial outputs of empty splits read.
"""

# ruff: noqa: E741  (O: the output, as in flashattn/kernels)

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
import triton

from ._check import ExerciseFailed, exercise
from .triton_check import Buffer, check_writes, close, launch, require_jit

NAN, NEG_INF = float("nan"), float("-inf")
TOL = 1e-5  # float32 arithmetic on float32 inputs


@dataclass(frozen=True)
class Case:
    label: str
    rows: int
    splits: int
    D: int = 16
    lse_center: float = 2.0
    empty: float = 0.0  # the share of (row, split) pairs that saw no key (never all the splits of a row)

    def text(self) -> str:
        return f"[{self.label}] rows={self.rows}, num_splits={self.splits}, D={self.D}"


CASES = (
    Case("every split saw keys", rows=3, splits=4),
    Case("num_splits not a power of two: BLOCK_S = 8, three lanes past the splits", rows=3, splits=5),
    Case("empty splits: lse = -inf, partial outputs never written (NaN here)", rows=5, splits=6, empty=0.4),
    Case("large scores: lse around +100 (exp(100) overflows float32)", rows=3, splits=4, lse_center=100.0),
    Case("small weights: lse around -120 (exp(-120) is 0 in float32)", rows=3, splits=3, lse_center=-120.0),
)


def partials(case: Case, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Float32 partial outputs (rows, splits, D) and lse (rows, splits); empty pairs: lse -inf, output NaN."""
    gen = torch.Generator().manual_seed(seed)
    o = torch.randn(case.rows, case.splits, case.D, generator=gen)
    lse = case.lse_center + 3 * torch.rand(case.rows, case.splits, generator=gen)
    empty = torch.rand(case.rows, case.splits, generator=gen) < case.empty
    empty[torch.arange(case.rows), torch.randint(0, case.splits, (case.rows,), generator=gen)] = False
    return o.masked_fill(empty[..., None], NAN), lse.masked_fill(empty, NEG_INF)


def merge(o, lse, *, max_shift=True, weights="exp", normalize=True, pad_zero=0) -> torch.Tensor:
    """The merge in float64, and the mistake models (``pad_zero``: that many padding lanes with lse 0, output 0)."""
    o, lse = o.double(), lse.double()
    if pad_zero:
        lse = torch.cat([lse, torch.zeros(lse.shape[0], pad_zero, dtype=lse.dtype)], 1)
        o = torch.cat([o, torch.zeros(o.shape[0], pad_zero, o.shape[2], dtype=o.dtype)], 1)
    full = lse > NEG_INF
    m = lse.amax(1, keepdim=True) if max_shift else torch.zeros_like(lse[:, :1])
    w = {"exp": torch.exp(lse - m), "exp2": torch.exp2(lse - m), "lse": torch.where(full, lse, 0.0),
         "uniform": full.double()}[weights]
    total = (w[..., None] * torch.where(full[..., None], o, 0.0)).sum(1)
    return total / w.sum(1, keepdim=True) if normalize else total


MISTAKES = (  # (model keyword arguments, what the learner should change), in the order tried
    (dict(normalize=False), "the weighted sum is not divided by the sum of the weights: O = Σ w_s·o_s / Σ w_s (the "
     "partial outputs are each normalized by their own sum; the weights say how much of the whole sum each holds)"),
    (dict(weights="lse"), "the weights are the lse values themselves, as if lse were the sum l of its split. lse is "
     "a logarithm, lse_s = m_s + log l_s: split s holds a share of the whole sum proportional to exp(lse_s), so "
     "w_s = exp(lse_s − max lse)"),
    (dict(weights="uniform"), "every split weighs the same: a split whose keys scored higher holds more of the "
     "softmax's mass. Weigh split s by exp(lse_s − max lse)"),
    (dict(weights="exp2"), "lse is in natural log (m + ln l): weigh by tl.exp(lse − max), not tl.exp2 (exp2 would "
     "need the lse multiplied by log2(e) first)"),
)
PAD_MESSAGE = ("the lanes past num_splits count as splits: their lse was loaded as 0 (other=0.0), so they got the "
               "weight exp(0 − max) and their outputs were read from past the end. Load lse with "
               "other=float('-inf'), the lse of a split that saw nothing: its weight is then exp(-inf) = 0")


def _fail(case: Case, text: str) -> None:
    raise ExerciseFailed(f"{case.text()}: {text}")


def _run(kernel, case: Case, o, lse, fill=NAN) -> Buffer:
    """Launch on views of padded memory holding ``fill`` around the partials."""
    O_PART = Buffer(o.shape, torch.float32, pad=(0, 1, 8), fill=fill, values=o)  # rows and splits padded
    LSE_PART = Buffer(lse.shape, torch.float32, pad=(0, 3), fill=fill, values=lse)
    O = Buffer((case.rows, case.D), torch.float32, pad=(0, 8))
    launch(kernel, (case.rows,), O_PART.view, LSE_PART.view, O.view, case.splits, O_PART.view.stride(0),
           O_PART.view.stride(1), LSE_PART.view.stride(0), O.view.stride(0), D=case.D,
           BLOCK_S=triton.next_power_of_2(case.splits), where=case.text())
    return O


def _diagnose(case: Case, O: Buffer, o, lse, rerun) -> None:
    check_writes(O, "O", case.text(), "Each program writes its row's D columns: O + row * stride_or + offs_d.")
    if O.unwritten().any():
        row = int(torch.nonzero(O.unwritten().cpu())[0][0])
        _fail(case, f"row {row} of O was never written: program r (tl.program_id(0)) stores row r.")
    got, ref = O.view.double().cpu(), merge(o, lse)
    if close(got, ref, TOL):
        return
    finite = torch.isfinite(got).all(1)
    if abs(case.lse_center) > 50 and not finite.all():
        _fail(case, "NaN or inf: the weights exp(lse) were taken without subtracting the largest lse first. In "
              "float32 exp overflows above 88.7 (inf / inf = NaN) and underflows below about −103 (0 / 0 = NaN); "
              "w_s = exp(lse_s − max lse) keeps every weight in (0, 1], the largest exactly 1")
    if case.empty and not finite.all():
        has_empty = torch.isneginf(lse).any(1)
        if torch.equal(~finite, has_empty):
            _fail(case, "NaN exactly in the rows with an empty split: the partial outputs of the empty splits "
                  "(lse = -inf) were read and used. They were never written (NaN here, anything on a GPU), and "
                  "0 · NaN is NaN even though their weight is 0: load O_PART with mask=(lse > -inf)[:, None]")
    right = [close(got[r], ref[r], TOL) for r in range(case.rows)]
    if right[0] and not all(right):
        _fail(case, f"row 0 is right and row {right.index(False)} is not: step to row r of every tensor with its "
              "own row stride (O_PART + r * stride_pr, LSE_PART + r * stride_lr, O + r * stride_or), and to split "
              "s of O_PART with stride_ps: here each tensor is a view of padded memory")
    if not finite.all():
        pad = triton.next_power_of_2(case.splits) - case.splits
        if pad:  # one row alone, zeros around it: lanes past num_splits read zeros
            alone = rerun(dataclasses.replace(case, rows=1), o[:1], lse[:1], 0.0).view.double().cpu()
            if close(alone, merge(o[:1], lse[:1], pad_zero=pad), TOL):
                _fail(case, PAD_MESSAGE)
        again = rerun(case, o, lse, 0.0).view.double().cpu()  # zeros around the partials instead of NaN
        if torch.isfinite(again).all():
            _fail(case, "NaN in the output, which goes away when the memory around the partials holds zeros: your "
                  "kernel reads outside them and uses what it reads. Split s of row r is at O_PART + r * stride_pr "
                  "+ s * stride_ps (its lse at LSE_PART + r * stride_lr + s); lanes past num_splits must not count")
    for kwargs, message in MISTAKES:
        model = merge(o, lse, **kwargs)
        if not close(model, ref, TOL) and close(got, model, TOL):
            _fail(case, message)
    pad = triton.next_power_of_2(case.splits) - case.splits
    if pad and close(got, merge(o, lse, pad_zero=pad), TOL):
        _fail(case, PAD_MESSAGE)
    row = right.index(False) if not all(right) else 0
    _fail(case, f"row {row} is {got[row, :4].tolist()} …, expected {ref[row, :4].tolist()} … (relative error "
          f"{((got - ref).norm() / ref.norm()).item():.2g}). The merge: m = max lse, w = exp(lse − m), "
          "O = Σ w·o / Σ w")


@exercise("merge of the splits")
def check_merge_splits(kernel) -> str:
    """``kernel(O_PART, LSE_PART, O, num_splits, stride_pr, stride_ps, stride_lr, stride_or, D, BLOCK_S)``."""
    require_jit(kernel, "the merge kernel")
    for seed, case in enumerate(CASES):
        o, lse = partials(case, seed=300 + seed)
        _diagnose(case, _run(kernel, case, o, lse), o, lse, lambda *args: _run(kernel, *args))
    return (f"{len(CASES)} cases: every split full, num_splits not a power of two, empty splits, lse around +100 "
            "and −120")
