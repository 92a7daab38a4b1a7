"""The inputs and the comparisons the attention-kernel checks share (notebooks 02, 04, 05, 06).

A ``Case`` is one problem: sizes, causal or not, dtype, and the memory layout of q, k, v. Inputs are
placed in buffers with NaN around them (and, for the "mixed" layout, in non-contiguous memory with padded
rows, each tensor with its own strides), so that an unmasked read past the end shows as NaN.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from flashattn.reference import reference

from ._check import ExerciseFailed
from .triton_check import Buffer, close

NAN = float("nan")
OFFSETS_ADVICE = ("That is beyond the whole tensor: check the batch and head offsets (off_b = pid_bh // H, "
                  "off_h = pid_bh % H, times each tensor's own stride_b and stride_h) and the strides.")


@dataclass(frozen=True)
class Case:
    label: str
    B: int
    H: int
    N: int
    D: int
    causal: bool
    dtype: torch.dtype = torch.float32
    layout: str = "bhnd"  # "bhnd": contiguous (B, H, N, D); "mixed": see input_buffer
    q_scale: float = 1.0  # > 1 gives large scores

    def text(self) -> str:
        dtype = str(self.dtype).replace("torch.", "")
        return f"[{self.label}] B={self.B}, H={self.H}, N={self.N}, D={self.D}, causal={self.causal}, {dtype}"

    @property
    def scale(self) -> float:
        return 1.0 / math.sqrt(self.D)


# Problems that more than one kernel check runs (the scores, v1 and v2 kernels), each at the same place in
# its list, ordered so that one kind of mistake shows at a time
ONE_HEAD = Case("one head, N a multiple of both blocks", 1, 1, 64, 16, False)
FIRST_CASES = (ONE_HEAD, Case("N not a multiple of the blocks, B and H > 1", 2, 3, 50, 16, False),
               Case("causal", 2, 2, 50, 16, True))  # the first three of the scores and v2 checks
N_IS_ONE = Case("N = 1", 1, 2, 1, 16, True)
LARGE_SCORES = Case("large scores (q × 40, row maxima up to about 150)", 1, 2, 50, 16, False, q_scale=40.0)


def random_qkv(case: Case, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Fresh float64 q, k, v (B, H, N, D), rounded to the case's dtype (so the reference sees the same numbers)."""
    gen = torch.Generator().manual_seed(seed)
    shape = (case.B, case.H, case.N, case.D)
    q, k, v = (torch.randn(*shape, generator=gen, dtype=torch.float64) for _ in range(3))
    return tuple(t.to(case.dtype).double() for t in (case.q_scale * q, k, v))


def input_buffer(case: Case, values: torch.Tensor, which: str, fill=NAN) -> Buffer:
    """Input ``which`` ("q", "k" or "v"), (B, H, N, D), in the case's layout, surrounded by ``fill``.

    "mixed": q and v are views of (B, N + 3, H, D) memory (a projection's output, rows padded), k of
    (B, H, N + 5, D) memory, so that no two of them share strides and a padded row holds ``fill``.
    """
    shape = (case.B, case.H, case.N, case.D)
    if case.layout == "mixed" and which in ("q", "v"):
        return Buffer(shape, case.dtype, order=(0, 2, 1, 3), pad=(0, 0, 3, 0), fill=fill, values=values)
    if case.layout == "mixed":
        return Buffer(shape, case.dtype, pad=(0, 0, 5, 0), fill=fill, values=values)
    return Buffer(shape, case.dtype, fill=fill, values=values)


def input_buffers(case: Case, qkv, fill=NAN) -> tuple[Buffer, Buffer, Buffer]:
    return tuple(input_buffer(case, t, which, fill) for t, which in zip(qkv, "qkv", strict=True))


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


def match_models(got: torch.Tensor, ref: torch.Tensor, models, tol: float) -> str | None:
    """The message of the first model that differs from ref and that got reproduces (NaN where it has NaN)."""
    for build, message in models:
        model = build()
        if model is None or close(model, ref, tol):
            continue
        if close(got, model, tol):
            return message
    return None


def first_bad_row(got: torch.Tensor, ref: torch.Tensor) -> tuple[int, int, int]:
    """(b, h, row) of the first query row that is wrong (or not finite)."""
    err = (got - ref).norm(dim=-1) / ref.norm(dim=-1).clamp_min(1e-30)
    bad = ~(err <= 1e-3)
    return tuple(int(i) for i in torch.nonzero(bad)[0])


def fail(case: Case, text: str) -> None:
    raise ExerciseFailed(f"{case.text()}: {text}")
