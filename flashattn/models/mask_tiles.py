"""The tiles four common masks leave a kernel (notebook 14's widget): causal, a sliding window, packed documents
and key padding, on one N × N problem, and the work each saves.

Built on ``kernels.mask_blocks`` (the classification the masked kernels use); this module only makes the example
masks and counts: the tiles computed against all of them (dense) and against causal's, and for packed documents
also the tiles of ``attention_varlen``, whose blocks start at each document (so no tile crosses two).
"""

from __future__ import annotations

import random

import torch

from flashattn.kernels import mask_blocks

MASKS = ("causal", "sliding window", "documents", "padding")


def document_lengths(N: int, documents: int, seed: int = 0) -> tuple[int, ...]:
    """``documents`` random lengths (each >= 1) that add up to N."""
    if not 1 <= documents <= N:
        raise ValueError(f"documents must be from 1 to N={N}, got {documents}")
    cuts = sorted(random.Random(seed).sample(range(1, N), documents - 1))
    return tuple(b - a for a, b in zip([0, *cuts], [*cuts, N], strict=True))


def example_mask(mask: str, N: int, *, window: int = 256, documents: int = 4, valid: float = 0.6,
                 seed: int = 0) -> torch.Tensor:
    """The (N, N) boolean mask of one of :data:`MASKS`: causal; a causal sliding window of ``window`` keys (each
    query sees itself and the ``window - 1`` keys before it); ``documents`` packed documents of random lengths,
    causal in each; padding: a sequence whose first ``valid`` fraction of keys is real (every query sees them)."""
    if mask not in MASKS:
        raise ValueError(f"mask must be one of {', '.join(MASKS)}, got {mask!r}")
    if mask == "causal":
        return mask_blocks.window_mask(N, N, causal=True)
    if mask == "sliding window":
        if window < 1:
            raise ValueError(f"window must be at least 1 key, got {window}")
        return mask_blocks.window_mask(N, N, (window - 1, 0), causal=True)
    if mask == "documents":
        return mask_blocks.document_mask(document_lengths(N, documents, seed), causal=True)
    if not 0 < valid <= 1:
        raise ValueError(f"valid must be a fraction in (0, 1], got {valid}")
    return mask_blocks.padding_mask([max(1, round(valid * N))], N)[0, 0].expand(N, N)


def tiles(mask: str, N: int, block_m: int, block_n: int, *, window: int = 256, documents: int = 4,
          valid: float = 0.6, seed: int = 0) -> tuple[torch.Tensor, dict]:
    """``(kinds, summary)``: the (Tm, Tn) tile kinds of the example mask, and what they cost: ``skipped``,
    ``partial``, ``full``, ``computed`` tiles and their fractions of all tiles (``vs_dense``) and of causal's
    (``vs_causal``); for documents also ``varlen_computed`` (``attention_varlen``'s tiles) and the lengths."""
    dense = example_mask(mask, N, window=window, documents=documents, valid=valid, seed=seed)
    kinds = mask_blocks.classify(dense, block_m, block_n)
    found = mask_blocks.summary(kinds)
    causal = mask_blocks.summary(mask_blocks.window_kinds(N, N, block_m, block_n, causal=True))["computed"]
    found.update(mask=mask, N=N, block_m=block_m, block_n=block_n, vs_dense=found["computed_fraction"],
                 vs_causal=found["computed"] / causal, pairs=int(dense.sum()))
    if mask == "documents":
        lengths = document_lengths(N, documents, seed)
        found["lengths"] = lengths
        found["varlen_computed"] = sum(mask_blocks.summary(mask_blocks.window_kinds(n, n, block_m, block_n,
                                                                                     causal=True))["computed"]
                                       for n in lengths)
    return kinds, found
