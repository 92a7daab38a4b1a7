"""Masked attention on the Gluon kernels (Hopper; notebook 14): which problems take them, and their launches, bound
once per problem. The forward runs ``fast``'s Gluon kernel: a causal sliding window its WINDOW
(:func:`takes_gluon_window`, :func:`window_forward`); a (B, 1, 1, S) boolean key-padding mask its KEY_MASK
(:func:`takes_gluon_key_mask`, :func:`key_mask_forward`), at the head dimensions in
``kernels.masked.GLUON_KEY_MASK_DIMS``; packed documents its DOCS (:func:`takes_gluon_documents`,
:func:`documents_forward`), at those in ``GLUON_DOCUMENTS_DIMS``, and their backward the fast backward's Gluon
kernel (:func:`documents_backward`, at ``GLUON_DOCUMENTS_BACKWARD_DIMS``). ``masking.py`` calls them; everything
else runs the Triton kernels of ``kernels/masked.py`` and ``masked_backward.py``.
"""

from __future__ import annotations

import torch

from flashattn.kernels import launch_cache, masked
from flashattn.kernels.fast_options import gluon_available


def _gluon_problem(q4, k4, v4) -> bool:
    """What the Gluon kernel needs of every problem: Hopper, 16-bit, D = 64 or 128, as many keys as queries, one K/V
    head per query head, 32-bit row coordinates, inputs it reads in place."""
    (B, H, L, D), (Hkv, S) = q4.shape, k4.shape[1:3]
    if not (gluon_available(q4.dtype, D) and L == S and H == Hkv and B * H * L < 2**31):
        return False
    from flashattn.kernels.descriptors import heads_in_columns

    return heads_in_columns(q4, k4, v4) is not None


def takes_gluon_window(q4, k4, v4, spec, tiles, counts) -> bool:
    """Whether the forward runs fast's Gluon kernel with a window (``fast_gluon.py``): a causal sliding window (query
    i sees keys i - left .. i) on Hopper, 16-bit, D = 64 or 128, as many keys as queries, one K/V head per query
    head, inputs it reads in place. Explicit ``tiles`` and ``counts`` take the Triton kernel (it counts its
    blocks); so does everything else."""
    if (tiles is not None or counts is not None or spec.packed or spec.mask is not None or spec.left < 0
            or spec.right != 0):
        return False
    return _gluon_problem(q4, k4, v4)


def takes_gluon_key_mask(q4, k4, v4, spec, tiles, counts) -> bool:
    """Whether the forward runs fast's Gluon kernel with a key-padding mask (``fast_gluon.py``'s KEY_MASK): a boolean
    ``attn_mask`` that broadcasts over heads and queries (a (B, 1, 1, S) padding mask, zero strides in the (B, Hq, L,
    S) view), on Hopper, 16-bit, at a head dimension in ``masked.GLUON_KEY_MASK_DIMS`` (64 or 128), as many keys as
    queries, one K/V head per query head, inputs it reads in place, no explicit tiles and no counts. The backward
    runs the dense mask's Triton kernels either way."""
    mask = spec.mask
    if (q4.shape[-1] not in masked.GLUON_KEY_MASK_DIMS or tiles is not None or counts is not None or mask is None
            or mask.dtype != torch.bool or mask.stride(1) != 0 or mask.stride(2) != 0):
        return False
    return _gluon_problem(q4, k4, v4)


def takes_gluon_documents(q4, k4, v4, spec, tiles, counts, dims=None) -> bool:
    """Whether the forward runs fast's Gluon kernel on packed documents (``fast_gluon.py``'s DOCS): one
    ``cu_seqlens`` tensor for the queries and the keys (each document attends to itself), no window, causal or not,
    at a head dimension in ``masked.GLUON_DOCUMENTS_DIMS`` (or ``dims``), on Hopper, 16-bit, one K/V head per query
    head, inputs it reads in place, no explicit tiles and no counts."""
    if (not spec.packed or spec.cu_q is not spec.cu_k or spec.left >= 0 or not (spec.causal or spec.right < 0)
            or q4.shape[-1] not in (masked.GLUON_DOCUMENTS_DIMS if dims is None else dims) or tiles is not None
            or counts is not None or q4.shape[2] == 0):
        return False
    return _gluon_problem(q4, k4, v4)


def takes_gluon_documents_backward(q4, k4, v4, do4, spec, tiles, counts) -> bool:
    """Whether the backward of packed documents runs the fast backward's Gluon kernel (``fast_backward_gluon.py``'s
    DOCS): the problems :func:`takes_gluon_documents` takes, at a head dimension in
    ``masked.GLUON_DOCUMENTS_BACKWARD_DIMS``, dO read in place too; ``tiles``: the caller's explicit ones, if any."""
    from flashattn.kernels import triton_compat
    from flashattn.kernels.descriptors import heads_in_columns

    return (triton_compat.HAS_GLUON_BACKWARD
            and takes_gluon_documents(q4, k4, v4, spec, tiles, counts, masked.GLUON_DOCUMENTS_BACKWARD_DIMS)
            and heads_in_columns(q4, k4, v4, do4) is not None)


def documents_forward(q4, k4, v4, o4, lse3, spec, scale: float) -> None:
    """The Gluon forward on packed documents (:func:`takes_gluon_documents`), its launch bound once per problem (as
    :func:`window_forward`); the block table (a tile per document and Q block) is built from the call's
    ``cu_seqlens`` on the GPU, with no copy to the host."""
    from flashattn.kernels import fast_gluon

    opts = masked.gluon_documents_options(q4.dtype, q4.shape[-1], spec.causal)
    docs = spec.cu_q.numel() - 1
    table = masked.block_table(spec.cu_q, q4.shape[2], opts.consumers * opts.block_m, reverse=False)
    key = launch_cache.problem_key((q4, k4, v4, o4, lse3, spec.cu_q, table), ("documents", spec.causal, scale, opts))
    run = launch_cache.kept(_RUNS, key, lambda: fast_gluon.bind(q4, k4, v4, o4, lse3, spec.causal, scale, True, opts,
                                                                docs=docs))
    run(q4, k4, v4, o4, lse3, spec.cu_q, table)


def documents_backward(q4, k4, v4, o4, lse3, do4, spec, scale: float) -> tuple:
    """dq, dk, dv of packed documents (:func:`takes_gluon_documents_backward`) as (1, H, total, D) views laid out
    as the inputs, by the Gluon backward (its launch bound once per problem), delta and dQ's sums beside it as
    ``fast_backward`` makes them."""
    from flashattn.kernels import fast_backward
    from flashattn.kernels import fast_backward_gluon as fbg

    if lse3.data_ptr() % 16 or not lse3.is_contiguous():  # the kernel indexes it as (H, total); bind's checks
        lse3 = lse3.clone(memory_format=torch.contiguous_format)
    table = masked.block_table(spec.cu_q, q4.shape[2], fbg.BLOCK_N.value, reverse=False)
    delta = fast_backward.delta_rows(o4, do4)
    key = launch_cache.problem_key((q4, k4, v4, lse3, do4, delta, spec.cu_q, table),
                                   ("documents backward", spec.causal, scale))
    run = launch_cache.kept(_RUNS, key, lambda: fbg.bind(q4, k4, v4, lse3, do4, delta, causal=spec.causal,
                                                         scale=scale, docs=spec.cu_q.numel() - 1))
    dq_acc, dk4, dv4 = run(q4, k4, v4, lse3, do4, delta, None, spec.cu_q, table)
    return fast_backward.finish_dq(dq_acc, q4.dtype, scale), dk4, dv4


def key_mask_rows(mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A key-padding mask's (B, S) rows as bytes (a view: 1 where the key takes part) and each row's last kept key
    + 1 (int32 (B,); 0 for a row that keeps none), computed on the GPU: the kernel loads no key block past it."""
    rows = mask[:, 0, 0, :].view(torch.uint8)
    keys = torch.arange(1, rows.shape[1] + 1, dtype=torch.int32, device=rows.device)
    return rows, torch.where(rows != 0, keys, 0).amax(-1)


def key_mask_blocks(rows: torch.Tensor, ends: torch.Tensor, block_n: int) -> torch.Tensor:
    """:func:`key_mask_rows`' ends with a flag per key block of ``block_n`` keys after each: int32 (B, 1 + S /
    block_n), 1 where some key of the block is dropped (fast_gluon's KEY_MASK 2 reads that block's mask bytes; a
    full block runs as without a mask). Keys past S count as kept: the kernel masks them as any ragged tail."""
    S = rows.shape[1]
    full = torch.nn.functional.pad(rows, (0, -S % block_n), value=1).unflatten(1, (-1, block_n)).amin(-1)
    return torch.cat((ends[:, None], (full == 0).to(torch.int32)), 1)


_RUNS: dict = {}  # a problem's bound Gluon launch (fast_gluon.bind), by launch_cache.problem_key


def bind_window(q4, k4, v4, o4, lse3, left: int, scale: float):
    """The Gluon window forward's launch bound for these tensors' problem (``fast_gluon.bind``): ``run(q4, k4, v4,
    o4, lse3)``."""
    from flashattn.kernels import fast_gluon

    opts = masked.gluon_window_options(q4.dtype, q4.shape[-1])
    return fast_gluon.bind(q4, k4, v4, o4, lse3, True, scale, True, opts, left=left)


def window_forward(q4, k4, v4, o4, lse3, left: int, scale: float) -> None:
    """The Gluon window forward, its launch bound once per problem (shapes, strides, dtypes, alignment, window,
    scale) as ``fast`` binds its own: a short window's kernel runs for about as long as a launch takes to prepare."""
    opts = masked.gluon_window_options(q4.dtype, q4.shape[-1])
    key = launch_cache.problem_key((q4, k4, v4, o4, lse3), (left, scale, opts))
    run = launch_cache.kept(_RUNS, key, lambda: bind_window(q4, k4, v4, o4, lse3, left, scale))
    run(q4, k4, v4, o4, lse3)


def key_mask_forward(q4, k4, v4, o4, lse3, spec, scale: float) -> None:
    """The Gluon forward with a key-padding mask (:func:`takes_gluon_key_mask`), its launch bound once per problem
    (as :func:`window_forward`); the mask's rows and ends are the call's own."""
    from flashattn.kernels import fast_gluon

    opts = masked.gluon_key_mask_options(q4.dtype, q4.shape[-1], spec.causal)
    kmask, kv_end = key_mask_rows(spec.mask)
    if masked.GLUON_KEY_MASK_BLOCKS:
        kv_end = key_mask_blocks(kmask, kv_end, opts.block_n)
    key = launch_cache.problem_key((q4, k4, v4, o4, lse3, kmask, kv_end), ("key mask", spec.causal, scale, opts))
    run = launch_cache.kept(_RUNS, key, lambda: fast_gluon.bind(q4, k4, v4, o4, lse3, spec.causal, scale, True, opts,
                                                                key_mask=(kmask, kv_end)))
    run(q4, k4, v4, o4, lse3, kmask, kv_end)
