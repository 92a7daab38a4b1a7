"""The inputs and the comparisons the attention-kernel checks share (notebooks 02, 04, 05, 06).

A ``Case`` is one problem: sizes, causal or not, dtype, the memory layout of q, k, v (and of the output),
and what the values look like. Inputs are placed in buffers with NaN around them, so that an unmasked read
past the end shows as NaN. In the "mixed" layout every tensor has its own strides, none of them contiguous in
any dimension (the last included: its elements are 2, 3, ... apart), no two tensors share one, and the
memory between elements holds random numbers, so that a tensor read through another's strides, or as if it
were contiguous, gives numbers a model of that mistake reproduces (``evidence.stride_suspects``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from flashattn.reference import reference

from ._check import ExerciseFailed
from .evidence import first_wrong
from .triton_check import Buffer, close

NAN = float("nan")


@dataclass(frozen=True)
class Case:
    label: str
    B: int
    H: int
    N: int
    D: int
    causal: bool
    dtype: torch.dtype = torch.float32
    layout: str = "bhnd"  # "bhnd": contiguous (B, H, N, D); "mixed": see MIXED
    q_scale: float = 1.0  # > 1 gives large scores
    values: str = "random"  # "random", or "negative_rows": see random_qkv

    def text(self) -> str:
        dtype = str(self.dtype).replace("torch.", "")
        return f"[{self.label}] B={self.B}, H={self.H}, N={self.N}, D={self.D}, causal={self.causal}, {dtype}"

    @property
    def scale(self) -> float:
        return 1.0 / math.sqrt(self.D)


# the "mixed" layout of each tensor: (order of the dimensions in memory, padding after each, step of each)
MIXED = {
    "q": ((0, 2, 1, 3), (0, 0, 3, 0), (1, 1, 1, 2)),  # a projection's (B, N, H, D) output, every other element
    "k": ((0, 1, 2, 3), (0, 0, 5, 1), (1, 1, 1, 3)),  # padded rows, every third element
    "v": ((1, 0, 3, 2), (1, 0, 2, 0), (1, 1, 1, 1)),  # (H, B, D, N) memory: stride_vn = 1
    "o": ((0, 1, 2, 3), (0, 0, 32, 3), (1, 1, 1, 4)),  # padded rows (and BLOCK_M rows past N), every fourth
    "s": ((0, 1, 3, 2), (0, 0, 32, 16), (1, 1, 1, 1)),  # S stored column by column, padded
}


# Problems that more than one kernel check runs (the scores, v1 and v2 kernels), each at the same place in
# its list, ordered so that one kind of mistake shows at a time
ONE_HEAD = Case("one head, N a multiple of both blocks", 1, 1, 64, 16, False)
FIRST_CASES = (ONE_HEAD, Case("N not a multiple of the blocks, B and H > 1", 2, 3, 50, 16, False),
               Case("causal", 2, 2, 50, 16, True))  # the first three of the scores and v2 checks
N_IS_ONE = Case("N = 1", 1, 2, 1, 16, True)
LARGE_SCORES = Case("large scores (q × 40, row maxima up to about 150)", 1, 2, 50, 16, False, q_scale=40.0)
NEGATIVE_ROWS = Case("rows whose scores are all below -100, between rows of mixed sign", 2, 1, 40, 16, False,
                     values="negative_rows")


def random_qkv(case: Case, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Fresh float64 q, k, v (B, H, N, D), rounded to the case's dtype (so the reference sees the same numbers).

    "negative_rows": the keys share a direction u; every other query row points against it, so that all its
    scores lie around -200 (exp of them underflows float32 to 0: a running max started at 0 shows), the rows
    between are q × 40 (scores of both signs, maxima far above 0)."""
    gen = torch.Generator().manual_seed(seed)
    shape = (case.B, case.H, case.N, case.D)
    q, k, v = (torch.randn(*shape, generator=gen, dtype=torch.float64) for _ in range(3))
    q = case.q_scale * q
    if case.values == "negative_rows":
        u = torch.randn(case.D, generator=gen, dtype=torch.float64)
        u = u / u.norm()
        k = 2.0 * u + 0.25 * k
        against = -100.0 * math.sqrt(case.D) * u + 0.1 * q  # scores: 2·(-100)·|u|² ≈ -200
        q = torch.where((torch.arange(case.N) % 2 == 0)[:, None], against, 40.0 * q)
    return tuple(t.to(case.dtype).double() for t in (q, k, v))


def _mixed(which: str, shape, dtype, fill, values, seed: int) -> Buffer:
    order, pad, step = MIXED[which]
    return Buffer(shape, dtype, order=order, pad=pad, step=step, fill=fill, values=values,
                  gaps="noise" if values is not None else None, seed=seed)


def input_buffer(case: Case, values: torch.Tensor, which: str, fill=NAN) -> Buffer:
    """Input ``which`` ("q", "k" or "v"), (B, H, N, D), in the case's layout, surrounded by ``fill``."""
    shape = (case.B, case.H, case.N, case.D)
    if case.layout == "mixed":
        return _mixed(which, shape, case.dtype, fill, values, seed="qkv".index(which))
    return Buffer(shape, case.dtype, fill=fill, values=values)


def input_buffers(case: Case, qkv, fill=NAN) -> tuple[Buffer, Buffer, Buffer]:
    return tuple(input_buffer(case, t, which, fill) for t, which in zip(qkv, "qkv", strict=True))


def output_buffer(case: Case, which: str, shape, dtype, block_rows: int, block_cols: int = 0) -> Buffer:
    """The output ``which`` ("o" or "s"), holding the sentinel: rows (and columns) past N land in padding of
    at least a block, so that an unmasked store of an edge tile shows; "mixed": see MIXED."""
    if case.layout == "mixed":
        order, pad, step = MIXED[which]
        return Buffer(shape, dtype, order=order, pad=pad, step=step)
    return Buffer(shape, dtype, pad=(0, 0, block_rows, block_cols))


def reference_of(case: Case, q, k, v) -> torch.Tensor:
    return reference(q, k, v, causal=case.causal).double()


def per_head_hint(got: torch.Tensor, ref: torch.Tensor, tol: float) -> str | None:
    """When only head (0, 0) is right: the batch and head offsets are the likely mistake."""
    B, H = ref.shape[:2]
    if B * H == 1:
        return None
    right = [[close(got[b, h], ref[b, h], tol) for h in range(H)] for b in range(B)]
    if right[0][0] and not all(all(r) for r in right):
        wrong = [(b, h) for b in range(B) for h in range(H) if not right[b][h]]
        return (f"head (b, h) = (0, 0) is right, {len(wrong)} other(s) are not, e.g. {wrong[0]}: the offsets of "
                "batch and head. With pid_bh = tl.program_id(1): off_b = pid_bh // H, off_h = pid_bh % H, and "
                "each tensor starts at X + off_b * stride_xb + off_h * stride_xh (use every tensor's own strides).")
    return None


def match_models(got: torch.Tensor, ref: torch.Tensor, models, tol: float, ref_tol: float | None = None) -> str | None:
    """The message of the first model that differs from ref (by more than ``ref_tol``, the check's own tolerance;
    ``tol`` by default) and that got reproduces within ``tol`` (NaN where it has NaN). A result that is NaN
    everywhere is weak evidence: then every model that gives it is named, as alternatives."""
    matches = []
    for build, message in models:
        model = build()
        if model is None or close(model, ref, tol if ref_tol is None else ref_tol) or not close(got, model, tol):
            continue
        matches.append(message)
        if torch.isfinite(got).any():
            break
    if len(matches) > 1:
        return ("NaN everywhere, which more than one classic mistake gives here (this case cannot tell them apart): "
                + " Or: ".join(matches))
    return matches[0] if matches else None


def first_bad_row(got: torch.Tensor, ref: torch.Tensor, tol: float = 1e-4) -> tuple[int, int, int] | None:
    """(b, h, row) of the first query row with an element that stands out as wrong (or not finite), or None
    when no element does (a result that is off by a little everywhere)."""
    index = first_wrong(got, ref, tol)
    return None if index is None else index[:3]


def fail(case: Case, text: str) -> None:
    raise ExerciseFailed(f"{case.text()}: {text}")
