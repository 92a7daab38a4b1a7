"""The block structure of attention masks (notebook 14): which tiles of (Q block × key block) a mask lets a kernel
skip, which it leaves partial, which full; and the lists the masked kernels read, in FlexAttention's form.

A tile of rows ``m0 .. m0 + block_m`` and keys ``n0 .. n0 + block_n`` is

* **skipped** when no (query, key) pair in it takes part: the kernel never loads its keys;
* **full** when every pair in it takes part (a float mask: adds 0 to every score) and the tile lies wholly inside
  the L × S problem: the kernel runs it without ``tl.where``;
* **partial** otherwise: some pairs take part, or the tile hangs over the last query or key. Only these pay for
  the element mask.

Tiles that hang over an edge are partial even where every pair inside the problem takes part, as in
FlexAttention's ``create_block_mask``; so one classification serves the forward kernel, the dQ kernel (Q blocks
along the rows) and the dK/dV kernel (the same tiles read by columns), whose rows past L must not add into dK.

Masks here are boolean (True = takes part) or float (added to the scores, -inf = does not take part), as
``torch.nn.functional.scaled_dot_product_attention`` takes them. Windows follow FlashAttention's ``window_size``:
query i sees the keys j with ``i + offset - left <= j <= i + offset + right`` (-1: unbounded on that side), where
``offset`` aligns the diagonal (0: top-left, as torch's ``is_causal``; S - L: bottom-right, as FlashAttention's).
"""

from __future__ import annotations

import dataclasses

import torch
import triton

SKIPPED, PARTIAL, FULL = 0, 1, 2
KIND_NAMES = ("skipped", "partial", "full")


# --- windows ----------------------------------------------------------------------------------------------------

def normalize_window(window, causal: bool) -> tuple[int, int]:
    """``(left, right)`` checked: integers >= -1 (-1: unbounded); ``causal`` sets the right side to 0 (a window
    whose right side is positive cannot be causal)."""
    if not (isinstance(window, (tuple, list)) and len(window) == 2
            and all(isinstance(w, int) and not isinstance(w, bool) for w in window)):
        raise TypeError(f"window must be a pair of ints (left, right), -1 for unbounded, got {window!r}")
    left, right = window
    if left < -1 or right < -1:
        raise ValueError(f"window sides must be >= -1 (-1: unbounded), got {tuple(window)}")
    if causal:
        if right > 0:
            raise ValueError(f"window={tuple(window)} with causal=True: a causal window's right side is 0 (pass "
                             f"({left}, 0) or ({left}, -1), or causal=False)")
        right = 0
    return left, right


def window_is_unbounded(left: int, right: int) -> bool:
    return left == -1 and right == -1


def _reach(side: int, L: int, S: int) -> int:
    """A window side as a distance: -1 (unbounded) becomes one that reaches every key."""
    return L + S if side == -1 else side


def window_mask(L: int, S: int, window=(-1, -1), causal: bool = False, offset: int = 0, device=None) -> torch.Tensor:
    """The (L, S) boolean mask of a window: True where query i sees key j (see the module docstring)."""
    left, right = normalize_window(window, causal)
    i = torch.arange(L, device=device)[:, None] + offset
    j = torch.arange(S, device=device)[None, :]
    return (j >= i - _reach(left, L, S)) & (j <= i + _reach(right, L, S))


def window_kinds(L: int, S: int, block_m: int, block_n: int, window=(-1, -1), causal: bool = False,
                 offset: int = 0, device=None) -> torch.Tensor:
    """The (Tm, Tn) tile kinds of a window, from the tiles' corners alone (what the kernels compute per program):

    the tile holds some pair iff the span of ``j - i`` over it, ``[n0 - m_last, n_last - m0]``, meets the window's
    ``[offset - left, offset + right]``; it is full iff it lies inside the problem and the span of ``j - i`` over
    the whole tile, ``[n0 - (m0 + block_m - 1), n0 + block_n - 1 - m0]``, lies inside the window's."""
    left, right = normalize_window(window, causal)
    lo, hi = offset - _reach(left, L, S), offset + _reach(right, L, S)  # the window's range of j - i
    m0 = torch.arange(triton.cdiv(L, block_m), device=device)[:, None] * block_m
    n0 = torch.arange(triton.cdiv(S, block_n), device=device)[None, :] * block_n
    m_last, n_last = torch.clamp(m0 + block_m, max=L) - 1, torch.clamp(n0 + block_n, max=S) - 1
    some = (n0 - m_last <= hi) & (n_last - m0 >= lo)
    inside = (m0 + block_m <= L) & (n0 + block_n <= S)
    every = inside & (n0 + block_n - 1 - m0 <= hi) & (n0 - (m0 + block_m - 1) >= lo)
    return _kinds(some, every)


# --- documents and padding ----------------------------------------------------------------------------------------

def document_ids(lengths) -> torch.Tensor:
    """The document of every position of a packed sequence of documents of these ``lengths``."""
    lengths = torch.as_tensor(lengths, dtype=torch.long)
    return torch.repeat_interleave(torch.arange(len(lengths)), lengths)


def cu_seqlens(lengths, device=None) -> torch.Tensor:
    """``flash_attn_varlen_func``'s int32 ``cu_seqlens``: (B + 1,) offsets of each document in the packed layout."""
    lengths = torch.as_tensor(lengths, dtype=torch.int32)
    return torch.cat([torch.zeros(1, dtype=torch.int32), torch.cumsum(lengths, 0, dtype=torch.int32)]).to(device)


def document_mask(lengths_q, lengths_k=None, window=(-1, -1), causal: bool = False, device=None) -> torch.Tensor:
    """The (total_q, total_k) mask of packed documents: a query sees the keys of its own document only, through
    the document's window (causal and windows aligned bottom-right in each document, as FlashAttention's varlen)."""
    lengths_q = [int(n) for n in lengths_q]
    lengths_k = lengths_q if lengths_k is None else [int(n) for n in lengths_k]
    if len(lengths_q) != len(lengths_k):
        raise ValueError(f"as many key documents as query documents, got {len(lengths_q)} and {len(lengths_k)}")
    mask = torch.zeros(sum(lengths_q), sum(lengths_k), dtype=torch.bool, device=device)
    q0 = k0 = 0
    for lq, lk in zip(lengths_q, lengths_k, strict=True):
        mask[q0:q0 + lq, k0:k0 + lk] = window_mask(lq, lk, window, causal, offset=lk - lq, device=device)
        q0, k0 = q0 + lq, k0 + lk
    return mask


def padding_mask(lengths, S: int, device=None) -> torch.Tensor:
    """The (B, 1, 1, S) key-padding mask of sequences of these valid ``lengths``: every query sees its sequence's
    first ``lengths[b]`` keys (broadcast over heads and queries, as a model passes it to SDPA)."""
    lengths = torch.as_tensor(lengths, device=device)
    return (torch.arange(S, device=device)[None, :] < lengths[:, None])[:, None, None, :]


# --- dense masks --------------------------------------------------------------------------------------------------

def _kinds(some: torch.Tensor, every: torch.Tensor) -> torch.Tensor:
    return torch.where(every, FULL, torch.where(some, PARTIAL, SKIPPED)).to(torch.int8)


def _blocks(x: torch.Tensor, dim: int, n: int, block: int, reduce) -> torch.Tensor:
    """``reduce`` (torch.any / torch.all) over blocks of ``block`` along ``dim`` (length 1: broadcast, or n); the
    ragged last block of an ``all`` is False (it hangs over the edge)."""
    blocks = triton.cdiv(n, block)
    if x.shape[dim] == 1:  # broadcast along this axis: every block sees the same values
        out = x.expand(*x.shape[:dim], blocks, *x.shape[dim + 1:]).clone()
        if reduce is torch.all and n % block:
            out.narrow(dim, blocks - 1, 1).fill_(False)
        return out
    whole = n // block
    parts = [reduce(x.narrow(dim, 0, whole * block).unflatten(dim, (whole, block)), dim=dim + 1)]
    if n % block:
        tail = x.narrow(dim, whole * block, n - whole * block)
        parts.append(tail.any(dim=dim, keepdim=True) if reduce is torch.any else torch.zeros_like(tail.narrow(dim, 0, 1)))
    return torch.cat(parts, dim=dim) if len(parts) > 1 else parts[0]


def classify(mask: torch.Tensor, block_m: int, block_n: int, *, shape=None, causal: bool = False) -> torch.Tensor:
    """The (…, Tm, Tn) int8 tile kinds (SKIPPED, PARTIAL, FULL) of a boolean or float ``mask`` (…, L, S).

    ``shape`` = (L, S) when the mask broadcasts along L or S (a (…, 1, S) key-padding mask has length 1 there);
    the leading dimensions are kept as they are (broadcast ones stay of size 1: nothing is expanded). ``causal``
    combines the mask with torch's top-left causal mask, tile by tile: a tile is full when both leave it full,
    skipped when either skips it (a tile that both leave partial stays partial, though the two together may
    leave no pair in it: computed, never wrong)."""
    L, S = mask.shape[-2:] if shape is None else shape
    if mask.shape[-2] not in (1, L) or mask.shape[-1] not in (1, S):
        raise ValueError(f"mask of shape {tuple(mask.shape)} does not broadcast to (..., {L}, {S})")
    if mask.dtype == torch.bool:
        takes, free = mask, mask
    else:
        takes, free = mask != float("-inf"), mask == 0
    some = _blocks(_blocks(takes, takes.dim() - 2, L, block_m, torch.any), takes.dim() - 1, S, block_n, torch.any)
    every = _blocks(_blocks(free, free.dim() - 2, L, block_m, torch.all), free.dim() - 1, S, block_n, torch.all)
    kinds = _kinds(some, every)
    if causal:
        kinds = torch.minimum(kinds, window_kinds(L, S, block_m, block_n, causal=True, device=mask.device))
    return kinds


def counts(kinds: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """(full, partial) tiles per Q block (``dim=-1``: along a row of tiles) or per key block (``dim=-2``), as an
    int32 (…, 2) tensor: the numbers the kernels' debug output reports."""
    return torch.stack([(kinds == FULL).sum(dim), (kinds == PARTIAL).sum(dim)], dim=-1).to(torch.int32)


def summary(kinds: torch.Tensor) -> dict:
    """How many tiles are skipped, partial, full, and the fraction of the tiles a kernel computes."""
    total = kinds.numel()
    found = {name: int((kinds == kind).sum()) for kind, name in enumerate(KIND_NAMES)}
    return {**found, "tiles": total, "computed": found["partial"] + found["full"],
            "computed_fraction": (found["partial"] + found["full"]) / total if total else 0.0}


@dataclasses.dataclass(frozen=True)
class BlockTables:
    """The tiles to compute, per Q block and per key block, in FlexAttention's ``BlockMask`` form (its names): for Q
    block m, ``kv_num_blocks[..., m]`` partial key blocks, listed first in ``kv_indices[..., m, :]``, and
    ``full_kv_num_blocks[..., m]`` full ones in ``full_kv_indices``; the ``q_`` tensors the same per key block
    (what the dK/dV kernel walks). All int32, leading dimensions as the mask's (broadcast ones of size 1)."""

    kv_num_blocks: torch.Tensor
    kv_indices: torch.Tensor
    full_kv_num_blocks: torch.Tensor
    full_kv_indices: torch.Tensor
    q_num_blocks: torch.Tensor
    q_indices: torch.Tensor
    full_q_num_blocks: torch.Tensor
    full_q_indices: torch.Tensor
    block_m: int
    block_n: int


def _lists(kinds: torch.Tensor, kind: int) -> tuple[torch.Tensor, torch.Tensor]:
    """How many tiles of ``kind`` per row of ``kinds``, and their column indices first, in ascending order."""
    is_kind = kinds == kind
    order = torch.argsort((~is_kind).to(torch.int8), dim=-1, stable=True)
    return is_kind.sum(-1).to(torch.int32), order.to(torch.int32).contiguous()


def block_tables(kinds: torch.Tensor, block_m: int, block_n: int) -> BlockTables:
    """:class:`BlockTables` of tile kinds (…, Tm, Tn)."""
    kv_num, kv_idx = _lists(kinds, PARTIAL)
    full_kv_num, full_kv_idx = _lists(kinds, FULL)
    by_key = kinds.transpose(-1, -2)
    q_num, q_idx = _lists(by_key, PARTIAL)
    full_q_num, full_q_idx = _lists(by_key, FULL)
    return BlockTables(kv_num, kv_idx, full_kv_num, full_kv_idx, q_num, q_idx, full_q_num, full_q_idx,
                       block_m, block_n)
