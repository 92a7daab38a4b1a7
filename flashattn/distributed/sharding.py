"""This rank's shard of a full tensor, and the full tensor back from every rank's shard (notebook 16).

``shard(x, dim, layout)`` cuts dimension ``dim`` of ``x`` (the same full tensor on every rank) as ``layout`` says
(``layouts``: contiguous, or zigzag's two chunks r and 2W−1−r) and returns this rank's piece, a new contiguous
tensor (differentiable with respect to ``x``). ``unshard(x, dim, layout)`` gathers every rank's shard
(``dist.all_gather``) and puts the chunks back in sequence order; it is for looking at results and checking
them, not differentiable. Both check their arguments on every rank together (``checks.agree``).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from . import layouts
from .checks import DTYPES, agree, check_dim, dtype_code, process_group

MAX_DIMS = 8  # the shapes two ranks compare are padded to this many dimensions


def shard(x: torch.Tensor, dim: int, layout: str = "contiguous", group=None) -> torch.Tensor:
    """This rank's shard of ``x`` along ``dim``: chunk r of W (contiguous), or chunks r and 2W−1−r of 2W (zigzag)."""
    what = "shard"
    rank, world_size = process_group(group, what)
    error, row = None, []
    try:
        dim = check_dim(x, dim, what)
        pieces = world_size * layouts.chunks_per_rank(layout)
        N = x.shape[dim]
        if N % pieces:
            raise ValueError(f"shard: the {layout} layout cuts the sequence into {pieces} chunks over {world_size} "
                             f"ranks, so its length must be a multiple of {pieces}; got N={N} (dim {dim} of shape "
                             f"{tuple(x.shape)})")
        row = [dim, N, layouts.LAYOUTS.index(layout)]
    except (TypeError, ValueError) as err:
        error = err
    agree(group, what, error, row, ["dim", "sequence length N", ("layout", layouts.LAYOUTS)])
    return layouts.local_rows(x, rank, world_size, layout, dim)


def unshard(x: torch.Tensor, dim: int, layout: str = "contiguous", group=None) -> torch.Tensor:
    """The full tensor, on every rank, from every rank's shard ``x`` along ``dim`` (the inverse of :func:`shard`)."""
    what = "unshard"
    _, world_size = process_group(group, what)
    error, row = None, []
    try:
        dim = check_dim(x, dim, what)
        per = layouts.chunks_per_rank(layout)
        if x.dim() > MAX_DIMS:
            raise ValueError(f"unshard: tensors of at most {MAX_DIMS} dimensions, got {x.dim()}")
        if x.shape[dim] % per:
            raise ValueError(f"unshard: a zigzag shard holds two chunks, so its length must be even; got "
                             f"{x.shape[dim]} (dim {dim} of shape {tuple(x.shape)})")
        row = [dim, layouts.LAYOUTS.index(layout), dtype_code(x.dtype), x.dim(),
               *x.shape, *([-1] * (MAX_DIMS - x.dim()))]
    except (TypeError, ValueError) as err:
        error = err
    agree(group, what, error, row, ["dim", ("layout", layouts.LAYOUTS), ("dtype", DTYPES), "number of dimensions",
                                    *(f"size of dim {i}" for i in range(MAX_DIMS))])
    x = x.detach().contiguous()
    gathered = [torch.empty_like(x) for _ in range(world_size)]
    dist.all_gather(gathered, x, group=group)
    return layouts.gather_rows(gathered, layout, dim)
