"""What a wrong result shows, and the layout mistakes a result can be tested against.

A check names a mistake only when the evidence fits it: the learner's result must be reproduced by a model
of the kernel with that one mistake in it. Where no model fits, :func:`known` says what is known (which
rows, which columns, the error's pattern) instead of a guess.

Layout mistakes are modelled on the buffers themselves: a tensor read with the wrong strides is
``torch.as_strided`` of its buffer with those strides (:func:`read_as`); an output stored with the wrong
strides, from a swapped grid, or without a mask changes a set of positions of its buffer that can be
computed (:func:`positions`) and compared with the positions the kernel changed. ``stride_suspects`` lists
the strides a kernel plausibly uses for a tensor in place of its own: another tensor's, the contiguous
ones, one of its own in the wrong dimension.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import torch

from .triton_check import Buffer


def ranges(indices, most: int = 6) -> str:
    """'0-15, 32, 40-47' for sorted distinct integers (at most ``most`` groups, then how many more)."""
    values = sorted({int(i) for i in indices})
    groups: list[list[int]] = []
    for v in values:
        if groups and v == groups[-1][1] + 1:
            groups[-1][1] = v
        else:
            groups.append([v, v])
    text = [f"{a}" if a == b else f"{a}-{b}" for a, b in groups[:most]]
    more = sum(b - a + 1 for a, b in groups[most:])
    return ", ".join(text) + (f" and {more} more" if more else "")


def _wrong_elements(got: torch.Tensor, ref: torch.Tensor, tol: float) -> torch.Tensor:
    """Boolean, shaped like ref: the elements that are wrong (NaN/inf where ref has none, or off by more than
    tol times the largest finite |ref| of the same leading index)."""
    got, ref = got.detach().double().cpu(), ref.detach().double().cpu()
    special = ~torch.isfinite(ref)
    same_special = special & (got.nan_to_num(posinf=1e300, neginf=-1e300) == ref.nan_to_num(posinf=1e300,
                                                                                           neginf=-1e300))
    wrong = (special != ~torch.isfinite(got)) | (special & ~same_special)
    finite = ~special & torch.isfinite(got)
    scale = ref.nan_to_num(0.0, 0.0, 0.0).abs()
    scale = scale.flatten(-2).amax(-1)[..., None, None] if ref.dim() >= 2 else scale.amax()
    return wrong | (finite & ((got - ref).nan_to_num(0.0).abs() > 10 * tol * scale.clamp_min(1e-30)))


def first_wrong(got: torch.Tensor, ref: torch.Tensor, tol: float):
    """The index (a tuple) of the first wrong element, or None when none stands out on its own."""
    if got.shape != ref.shape:
        return None
    found = torch.nonzero(_wrong_elements(got, ref, tol))
    return tuple(int(i) for i in found[0]) if len(found) else None


def _relative_error(got, ref) -> float:
    finite = torch.isfinite(ref) & torch.isfinite(got)
    if not finite.any():
        return math.inf
    return float((got[finite] - ref[finite]).norm() / ref[finite].norm().clamp_min(1e-30))


def known(got: torch.Tensor, ref: torch.Tensor, tol: float, *, row: str = "row", col: str = "column",
          head: str = "head") -> str:
    """What is known about a wrong result, in words: the error, where it lies (leading indices, rows,
    columns, above or below the diagonal) and its pattern (a factor per row, a constant offset, a sign,
    a transpose, NaN), without naming a cause."""
    got, ref = got.detach().double().cpu(), ref.detach().double().cpu()
    if got.shape != ref.shape:
        return f"the result has shape {tuple(got.shape)}, the right one {tuple(ref.shape)}"
    x = got.reshape(-1, *ref.shape[-2:]) if ref.dim() >= 2 else got.reshape(1, 1, -1)
    y = ref.reshape(-1, *ref.shape[-2:]) if ref.dim() >= 2 else ref.reshape(1, 1, -1)
    wrong = _wrong_elements(x, y, tol)
    nonfinite = ~torch.isfinite(x) & torch.isfinite(y)
    parts = [f"relative error {_relative_error(x, y):.3g}" + (" (of the finite elements)" if nonfinite.any() else "")]
    if not wrong.any():
        parts.append("no element stands out: the error is spread thinly over the whole result, the size of "
                     "rounding to a shorter type rather than of a wrong step")
        return "; ".join(parts)
    leading = ref.shape[:-2]
    bad_lead = torch.nonzero(wrong.flatten(1).any(1)).flatten().tolist()
    if len(leading) and math.prod(leading) > 1:
        names = [tuple(int(i) for i in torch.unravel_index(torch.tensor(i), leading)) for i in bad_lead]
        shown = ", ".join(str(n if len(n) > 1 else n[0]) for n in names[:4])
        parts.append(f"wrong in {len(bad_lead)} of {math.prod(leading)} {head}s ({shown}"
                     f"{', ...' if len(names) > 4 else ''})")
    first = bad_lead[0]
    rows = torch.nonzero(wrong[first].any(1)).flatten().tolist()
    cols = torch.nonzero(wrong[first].any(0)).flatten().tolist()
    R, C = y.shape[-2:]
    where = " of the first of them" if len(bad_lead) > 1 else ""
    parts.append(f"{row}s {ranges(rows)}{where} (of {R})" + (f", {col}s {ranges(cols)} (of {C})"
                                                            if len(cols) < C else f", every {col}"))
    if R == C and R > 1:
        i, j = torch.nonzero(wrong[first], as_tuple=True)
        if bool((j > i).all()):
            parts.append("only above the diagonal")
        elif bool((j < i).all()):
            parts.append("only below the diagonal")
        elif bool((j == i).all()):
            parts.append("only on the diagonal")
    if nonfinite.any():
        parts.append(f"{int(nonfinite.sum())} element(s) NaN or inf where the right result is finite")
    pattern = _pattern(x, y, wrong, row)
    if pattern:
        parts.append(pattern)
    return "; ".join(parts)


def _pattern(x, y, wrong, row: str) -> str | None:
    """A simple relation between the wrong result and the right one, if one holds."""
    ok = torch.isfinite(x) & torch.isfinite(y)
    if not ok.all():
        return None
    diff = x - y
    size = y.abs().max().clamp_min(1e-30)
    if (diff - diff.mean()).abs().max() <= 1e-4 * size and diff.mean().abs() > 1e-4 * size:
        return f"every element is off by the same {diff.mean().item():.4g}"
    if (x + y).abs().max() <= 1e-4 * size:
        return "the result is the right one with its sign flipped"
    if x.shape[-1] == x.shape[-2] and (x - y.transpose(-1, -2)).abs().max() <= 1e-4 * size:
        return "the result is the right one transposed"
    rows = wrong.any(-1)
    xr, yr = x[rows], y[rows]
    norms = (yr * yr).sum(-1)
    if len(xr) and bool((norms > 0).all()):
        c = (xr * yr).sum(-1) / norms
        if ((xr - c[:, None] * yr).norm(dim=-1) <= 1e-3 * xr.norm(dim=-1).clamp_min(1e-30)).all():
            lo, hi = c.min().item(), c.max().item()
            factor = f"{lo:.4g}" if abs(hi - lo) <= 1e-3 * abs(hi) else f"{lo:.4g} to {hi:.4g}"
            return f"each wrong {row} is the right one times a factor ({factor})"
    return None


# ---------------------------------------------------------------------------------------------
# Layouts: the tensors of a call, the strides a kernel may use in place of their own


@dataclass
class Named:
    """A tensor of the call: its name in the kernel's signature (``"K"``), its buffer, and the letters of its
    strides' names (``"bhnd"`` for stride_kb, stride_kh, stride_kn, stride_kd)."""

    name: str
    buffer: Buffer
    dims: str

    @property
    def strides(self) -> tuple[int, ...]:
        return tuple(self.buffer.view.stride())

    def stride_name(self, d: int) -> str:
        return f"stride_{self.name.lower()}{self.dims[d]}"

    def names(self) -> str:
        return ", ".join(f"{self.stride_name(d)} = {s}" for d, s in enumerate(self.strides))


def contiguous_strides(shape) -> tuple[int, ...]:
    out, size = [], 1
    for s in reversed(shape):
        out.append(size)
        size *= int(s)
    return tuple(reversed(out))


def stride_suspects(x: Named, others: list[Named]) -> list[tuple[str, tuple[int, ...]]]:
    """(the mistake in words, the strides a kernel with it uses for x), most common first: the contiguous
    strides, all of another tensor's, some dimensions as if contiguous, one stride replaced (by another
    tensor's, or one of x's other strides), two of x's strides swapped. Each set of strides appears once."""
    own, shape = x.strides, x.buffer.shape
    contiguous = contiguous_strides(shape)
    found: dict[tuple[int, ...], str] = {own: ""}

    def add(strides, text):
        strides = tuple(int(s) for s in strides)
        if strides not in found:
            found[strides] = text

    same_rank = [y for y in others if len(y.strides) == len(own)]
    add(contiguous, f"{x.name} is addressed as if it were contiguous, strides {contiguous}; its own are {x.names()}")
    for y in same_rank:
        theirs = ", ".join(y.stride_name(d) for d in range(len(own)))
        add(y.strides, f"{x.name} is addressed with {y.name}'s strides ({theirs}) instead of its own ({x.names()})")
    for size in range(len(own) - 1, 0, -1):  # some of the dimensions as if contiguous (e.g. pid_bh * N * D, D, 1)
        for dims in itertools.combinations(range(len(own)), size):
            strides = tuple(contiguous[d] if d in dims else own[d] for d in range(len(own)))
            add(strides, f"{x.name} is addressed as if it were contiguous in "
                + ", ".join(f"{x.stride_name(d)} (taken as {contiguous[d]}, here {own[d]})" for d in dims))
    for d in range(len(own)):
        for y in same_rank:
            add(own[:d] + (y.strides[d],) + own[d + 1:],
                f"{x.name} is addressed with {y.stride_name(d)} (= {y.strides[d]}) where {x.stride_name(d)} "
                f"(= {own[d]}) belongs")
        add(own[:d] + (contiguous[d],) + own[d + 1:],
            f"{x.name}'s {x.stride_name(d)} is taken as {contiguous[d]}, its value if {x.name} were contiguous; "
            f"here {x.stride_name(d)} = {own[d]}")
        for e in range(len(own)):
            if e != d:
                add(own[:d] + (own[e],) + own[d + 1:],
                    f"{x.name} is addressed with {x.stride_name(e)} (= {own[e]}) where {x.stride_name(d)} "
                    f"(= {own[d]}) belongs")
    for d in range(len(own)):
        for e in range(d + 1, len(own)):
            swapped = list(own)
            swapped[d], swapped[e] = own[e], own[d]
            add(swapped, f"{x.name}'s {x.stride_name(d)} and {x.stride_name(e)} are swapped "
                f"({x.stride_name(d)} = {own[d]}, {x.stride_name(e)} = {own[e]})")
    return [(text, strides) for strides, text in found.items() if text]


def read_as(buffer: Buffer, strides) -> torch.Tensor | None:
    """What a kernel reads as ``buffer``'s tensor when it uses ``strides``: float64 on the CPU, or None when
    those strides leave the buffer."""
    shape = buffer.shape
    lo = buffer.offset + sum(min(0, (n - 1) * s) for n, s in zip(shape, strides, strict=True))
    hi = buffer.offset + sum(max(0, (n - 1) * s) for n, s in zip(shape, strides, strict=True))
    if lo < 0 or hi >= buffer.flat.numel():
        return None
    return torch.as_strided(buffer.flat, shape, tuple(strides), buffer.offset).double().cpu()


def changed(buffer: Buffer) -> set[int]:
    """The flat positions of the buffer the kernel changed."""
    return set(torch.nonzero(buffer._changed()).flatten().tolist())


def positions(buffer: Buffer, strides, index: torch.Tensor | None = None, base: int | None = None) -> set[int]:
    """The flat positions a store of the tensor's elements (all of them, or the (n, ndim) integer ``index``)
    through ``strides`` changes."""
    if index is None:
        index = torch.cartesian_prod(*(torch.arange(n) for n in buffer.shape)).reshape(-1, len(buffer.shape))
    flat = (buffer.offset if base is None else base) + index.long() @ torch.tensor(strides, dtype=torch.long)
    return set(flat.tolist())


def match_writes(out: Buffer, models) -> str | None:
    """The text of the first ``(text, positions)`` model whose positions are exactly those the kernel changed."""
    actual = changed(out)
    for text, model in models:
        where = model() if callable(model) else model
        if where is not None and where == actual:
            return text
    return None


# ---------------------------------------------------------------------------------------------
# Batch and head offsets: which (b, h) a program with pid_bh = b·H + h addresses

HEAD_MAPPINGS = (  # (the mistake in words, (pid_bh, B, H, stride_b, stride_h, elements per head) -> head's offset)
    ("off_b and off_h are swapped (off_b = pid_bh % H, off_h = pid_bh // H; it should be off_b = pid_bh // H, "
     "off_h = pid_bh % H)", lambda pid, B, H, sb, sh, n: (pid % H) * sb + (pid // H) * sh),
    ("the head offset is missing: every head of a batch element reads or writes head 0 (off_h * stride_h is "
     "left out)", lambda pid, B, H, sb, sh, n: (pid // H) * sb),
    ("the batch offset is missing: every batch element reads or writes batch 0 (off_b * stride_b is left out)",
     lambda pid, B, H, sb, sh, n: (pid % H) * sh),
    ("pid_bh is used as the head index alone (pid_bh * stride_h, no batch offset): it should be off_b * stride_b "
     "+ off_h * stride_h with off_b = pid_bh // H, off_h = pid_bh % H", lambda pid, B, H, sb, sh, n: pid * sh),
    ("pid_bh is used as the batch index alone (pid_bh * stride_b, no head offset): it should be off_b * stride_b "
     "+ off_h * stride_h with off_b = pid_bh // H, off_h = pid_bh % H", lambda pid, B, H, sb, sh, n: pid * sb),
    ("the heads are taken as if the tensor were contiguous (pid_bh * N * D): here each head starts at "
     "off_b * stride_b + off_h * stride_h, with the tensor's own strides", lambda pid, B, H, sb, sh, n: pid * n),
)


def head_bases(buffer: Buffer, mapping) -> list[int]:
    """The flat position each program pid_bh = 0 .. B·H - 1 takes as its head's first element under ``mapping``."""
    B, H = buffer.shape[:2]
    sb, sh = buffer.view.stride()[:2]
    per_head = math.prod(buffer.shape[2:])
    return [buffer.offset + mapping(pid, B, H, sb, sh, per_head) for pid in range(B * H)]


def read_heads(buffer: Buffer, mapping) -> torch.Tensor | None:
    """What a kernel whose programs address their heads by ``mapping`` reads as the (B, H, ...) tensor, or None
    where that leaves the buffer."""
    B, H = buffer.shape[:2]
    inner = buffer.shape[2:]
    strides = buffer.view.stride()[2:]
    span = sum((n - 1) * s for n, s in zip(inner, strides, strict=True))
    heads = []
    for base in head_bases(buffer, mapping):
        if base < 0 or base + span >= buffer.flat.numel():
            return None
        heads.append(torch.as_strided(buffer.flat, inner, strides, base).double().cpu())
    return torch.stack(heads).reshape(buffer.shape)


def head_positions(buffer: Buffer, mapping, index: torch.Tensor) -> set[int]:
    """The flat positions a store of every head's elements ``index`` ((n, ndim - 2) integer positions inside a
    head) changes when its programs address their heads by ``mapping``."""
    strides = torch.tensor(buffer.view.stride()[2:], dtype=torch.long)
    inner = (index.long() @ strides).tolist()
    return {base + i for base in head_bases(buffer, mapping) for i in inner}
