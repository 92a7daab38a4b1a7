"""Layout mistakes in the kernels the learner writes, named from evidence (the scores, matmul and v2 checks).

* ``name_store_mistake``: when a kernel wrote outside its output, or left some of it unwritten, compare the
  positions it changed with those a store with one mistake changes: another tensor's strides, the contiguous
  ones, swapped program ids, wrong batch and head offsets, a missing mask. Name the one that matches
  exactly; otherwise say what was written where.
* ``name_read_mistake``: when the values are wrong, compare them with the result of reading one input with
  the strides (or head offsets) of a mistake, and name the one that matches.
"""

from __future__ import annotations

import torch

from ._check import ExerciseFailed
from .evidence import HEAD_MAPPINGS, Named, changed, head_positions, ranges, read_as, read_heads, stride_suspects
from .triton_check import close


def store_models(out: Named, others: list[Named], index: torch.Tensor, *, heads: bool = True) -> list:
    """(text, positions) for a store of ``out``'s elements ``index`` ((n, ndim) integers) with one mistake in
    its strides or (for (B, H, ...) outputs) in its batch and head offsets."""
    models = []
    if heads and len(out.strides) > 2:  # first: the same positions as some stride swaps, and the usual cause
        per_head = torch.unique(index[:, 2:], dim=0)
        for text, mapping in HEAD_MAPPINGS:
            models.append((f"your kernel stores {out.name}'s heads at the wrong places: {text}",
                           head_positions(out.buffer, mapping, per_head)))
    for text, strides in stride_suspects(out, others):
        flat = (out.buffer.offset + index.long() @ torch.tensor(strides, dtype=torch.long)).tolist()
        models.append((f"your kernel stores {out.name} at the wrong places: {text}", set(flat)))
    return models


def wrote_badly(out: Named) -> bool:
    """Whether the kernel wrote outside ``out``'s tensor or left some of it unwritten."""
    return bool(out.buffer.outside_writes()) or bool(out.buffer.unwritten().any())


def name_store_mistake(where: str, out: Named, models, *, mask_text: str | None = None, unmasked=None) -> None:
    """ExerciseFailed if the kernel wrote outside ``out`` or left some of it unwritten: the first of ``models()``
    ((text, positions)) whose positions are exactly those changed; an unmasked store (``unmasked()``: the
    positions the edge tiles reach without a mask) when every write outside lies among them; else what is
    known. (``models`` and ``unmasked`` are called only when something was written badly.)"""
    if not wrote_badly(out):
        return
    buf = out.buffer
    outside = buf.outside_writes()
    missing = buf.unwritten().cpu()
    actual = changed(buf)
    for text, model in models():
        if model == actual:
            raise ExerciseFailed(f"{where}: {text}.")
    unmasked = unmasked() if unmasked is not None else None
    if outside and unmasked is not None and set(outside) <= unmasked and mask_text:
        raise ExerciseFailed(f"{where}: your kernel wrote {len(outside)} element(s) outside {out.name}, e.g. at "
                             f"{buf.where(outside[0])}, all of them where the edge tiles reach past the end. "
                             f"{mask_text}")
    parts = []
    if outside:
        beyond = [i for i in outside if buf.beyond(i)]
        first = beyond[0] if beyond else outside[0]
        parts.append(f"your kernel wrote {len(outside)} element(s) outside {out.name}, e.g. at {buf.where(first)}"
                     + (f" ({len(beyond)} of them beyond its memory altogether)" if beyond else ""))
    if missing.any():
        lead = torch.nonzero(missing.flatten(2).any(-1)) if missing.dim() > 2 else None
        if lead is not None and len(lead):
            b, h = (int(i) for i in lead[0])
            rows = torch.nonzero(missing[b, h].any(-1)).flatten().tolist()
            parts.append(f"{int(missing.sum())} of its {missing.numel()} elements were never written (in "
                         f"{len(lead)} head(s); in head ({b}, {h}): rows {ranges(rows)})")
        else:
            parts.append(f"{int(missing.sum())} of its {missing.numel()} elements were never written")
    raise ExerciseFailed(
        f"{where}: " + "; ".join(parts) + ". That is not the pattern of a missing mask on the edge tiles, of "
        f"{out.name} stored with another tensor's strides or the contiguous ones, nor of wrong batch and head "
        "offsets or swapped program ids: check the address of every element you store (offsets of the tile, "
        f"of its head, and {out.name}'s own four strides).")


def name_read_mistake(where: str, got: torch.Tensor, tol: float, inputs: list[Named], others: list[Named],
                      evaluate) -> None:
    """ExerciseFailed naming the read mistake (one input read with a suspect's strides, or with wrong head
    offsets) whose result ``evaluate(name=tensor)`` matches ``got``; return when none does."""
    matches = []
    for x in inputs:
        rest = [y for y in inputs + others if y is not x]
        for text, strides in stride_suspects(x, rest):
            replaced = read_as(x.buffer, strides)
            if replaced is not None and close(got, evaluate(**{x.name: replaced}), tol):
                matches.append(f"your kernel reads the wrong elements of {x.name}: {text}")
    if not matches and len(inputs[0].strides) > 2:
        for text, mapping in HEAD_MAPPINGS:
            mapped = {x.name: read_heads(x.buffer, mapping) for x in inputs}
            if any(t is None for t in mapped.values()):
                continue
            if close(got, evaluate(**mapped), tol):
                matches.append(f"your kernel reads every tensor's heads at the wrong places: {text}")
                break
            for name, tensor in mapped.items():
                if close(got, evaluate(**{name: tensor}), tol):
                    matches.append(f"your kernel reads {name}'s heads at the wrong places: {text}")
    if matches:
        more = f" (the result fits {len(matches) - 1} other reading as well)" if len(matches) > 1 else ""
        raise ExerciseFailed(f"{where}: {matches[0]}{more}.")
