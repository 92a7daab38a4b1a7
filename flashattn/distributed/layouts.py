"""Which positions of the sequence each rank holds, and what each rank computes at each step of the ring
(notebook 16). Pure functions of (rank, world size, shard length): no process group needed.

Two layouts of a sequence of N positions over W ranks:

* ``"contiguous"``: rank r holds positions [r·n, (r+1)·n), n = N / W.
* ``"zigzag"``: the sequence is cut into 2W chunks of c = N / (2W) positions; rank r holds chunk r and chunk
  2W−1−r (in that order), so that under a causal mask every rank gets one early chunk (little to attend to)
  and one late chunk (much to attend to). PyTorch's ``context_parallel`` calls this the head-tail load
  balancer; ring-flash-attention calls it zigzag.

The ring: at step s rank r holds the K/V shard of rank (r − s) mod W, its *source*. :func:`step_plan` says what
rank r computes with it: the pair (local queries, source keys) is either attended in full, or causally on the
diagonal (the source is r itself), or skipped (every key comes after every query), or, under zigzag, one half
against the other (the source's first chunk, or this rank's second chunk of queries).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch

LAYOUTS = ("contiguous", "zigzag")


def check_layout(layout) -> str:
    if not isinstance(layout, str) or layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {', '.join(map(repr, LAYOUTS))}, got {layout!r}")
    return layout


def chunks_per_rank(layout: str) -> int:
    """How many chunks of the sequence one rank holds: 1 (contiguous) or 2 (zigzag)."""
    return 2 if check_layout(layout) == "zigzag" else 1


def chunks(rank: int, world_size: int, layout: str) -> tuple[int, ...]:
    """The chunks (of ``world_size · chunks_per_rank(layout)``) that ``rank`` holds, in the order it holds them."""
    if check_layout(layout) == "zigzag":
        return (rank, 2 * world_size - 1 - rank)
    return (rank,)


def positions(rank: int, world_size: int, n_local: int, layout: str) -> list[int]:
    """The global positions of this rank's ``n_local`` rows, in order (``n_local`` divisible by the chunks)."""
    per = chunks_per_rank(layout)
    if n_local % per:
        raise ValueError(f"the zigzag layout holds two chunks per rank: the shard length must be even, got {n_local}")
    c = n_local // per
    return [chunk * c + i for chunk in chunks(rank, world_size, layout) for i in range(c)]


class Step(NamedTuple):
    """What one rank computes at one step: local query rows ``q`` against rows ``kv`` of the source's shard."""

    source: int  # the rank whose K/V shard this rank holds at this step
    kind: str  # "diagonal", "full", "skipped", "first key chunk" or "second query chunk"
    q: slice
    kv: slice
    causal: bool  # the causal mask on this (q, kv) pair (only on the diagonal, where q and kv are the same rows)

    @property
    def computes(self) -> bool:
        return self.kind != "skipped"


def step_plan(rank: int, world_size: int, n_local: int, *, causal: bool, layout: str) -> list[Step]:
    """What ``rank`` computes at each of the ``world_size`` steps of the ring (step s: source (rank − s) mod W).

    Contiguous, causal: the source's keys all come before this rank's queries (source < rank: full), are the same
    positions (source = rank: causal on the diagonal), or all come after them (source > rank: skipped). Rank
    W−1 computes W−1 full pairs and a diagonal, rank 0 one diagonal: the work grows with the rank.

    Zigzag, causal (c = n_local / 2; this rank holds chunks r and 2W−1−r, the source s' chunks s' and 2W−1−s'):
    s' = r: causal on the whole local pair; s' < r: all local queries against the source's first chunk (its
    second chunk is after both of ours); s' > r: our second chunk of queries against all the source's keys (our
    first chunk is before both of its). Every step costs the same: 2c² scores (the diagonal's 4c²/2).

    Not causal: every step attends all local queries to all keys, in either layout.
    """
    if not (isinstance(world_size, int) and world_size >= 1 and isinstance(rank, int) and 0 <= rank < world_size):
        raise ValueError(f"rank must be in [0, world_size), got rank={rank!r}, world_size={world_size!r}")
    per = chunks_per_rank(layout)
    if not isinstance(n_local, int) or n_local < per or n_local % per:
        raise ValueError(f"{layout}: the shard length must be a positive multiple of {per}, got {n_local!r}")
    everything, c = slice(0, n_local), n_local // per
    plan = []
    for s in range(world_size):
        source = (rank - s) % world_size
        if not causal:
            plan.append(Step(source, "full", everything, everything, False))
        elif source == rank:
            plan.append(Step(source, "diagonal", everything, everything, True))
        elif layout == "contiguous":
            plan.append(Step(source, "full", everything, everything, False) if source < rank
                        else Step(source, "skipped", slice(0, 0), slice(0, 0), False))
        elif source < rank:
            plan.append(Step(source, "first key chunk", everything, slice(0, c), False))
        else:
            plan.append(Step(source, "second query chunk", slice(c, n_local), everything, False))
    return plan


def rows(sl: slice) -> int:
    return sl.stop - sl.start


def key_blocks(L: int, S: int, causal: bool, block_m: int, block_n: int) -> int:
    """The (query block, key block) tiles a kernel visits for L queries against S keys: every tile, or under the
    causal mask (top-left, query i sees keys j <= i) the tiles on or left of the diagonal."""
    if not causal:
        return math.ceil(L / block_m) * math.ceil(S / block_n)
    return sum(math.ceil(min(S, (i + 1) * block_m) / block_n) for i in range(math.ceil(L / block_m)))


def plan_key_blocks(plan: list[Step], block_m: int = 64, block_n: int = 64) -> int:
    """The tiles one rank's kernels visit over the whole ring (the work per rank, in the kernels' own unit)."""
    return sum(key_blocks(rows(st.q), rows(st.kv), st.causal, block_m, block_n) for st in plan if st.computes)


def schedule(world_size: int, layout: str) -> list[list[tuple[int, ...]]]:
    """``schedule[rank][step]``: the chunks of the sequence whose keys and values ``rank`` holds at ``step``."""
    return [[chunks((r - s) % world_size, world_size, layout) for s in range(world_size)] for r in range(world_size)]


def local_rows(x, rank: int, world_size: int, layout: str, dim: int = 2):
    """Rank ``rank``'s shard of the full tensor ``x`` along ``dim`` (a copy): what ``shard`` returns there."""
    pieces = world_size * chunks_per_rank(layout)
    if x.shape[dim] % pieces:
        raise ValueError(f"the {layout} layout cuts the sequence into {pieces} chunks over {world_size} ranks, so its "
                         f"length must be a multiple of {pieces}; got N={x.shape[dim]} (dim {dim} of shape "
                         f"{tuple(x.shape)})")
    all_chunks = x.chunk(pieces, dim=dim)
    return torch.cat([all_chunks[c] for c in chunks(rank, world_size, layout)], dim=dim)


def gather_rows(shards: list, layout: str, dim: int = 2):
    """The full tensor from every rank's shard (``shards[r]``), in sequence order: what ``unshard`` returns."""
    world_size, per = len(shards), chunks_per_rank(layout)
    in_order = [None] * (world_size * per)
    for rank, piece in enumerate(shards):
        for chunk, part in zip(chunks(rank, world_size, layout), piece.chunk(per, dim=dim), strict=True):
            in_order[chunk] = part
    return torch.cat(in_order, dim=dim)


def work(world_size: int, layout: str, causal: bool, n_local: int, block_m: int = 128,
         block_n: int = 128) -> list[list[int]]:
    """``work[rank][step]``: the (query block, key block) tiles each rank's kernel visits at each step."""
    return [[key_blocks(rows(st.q), rows(st.kv), st.causal, block_m, block_n) if st.computes else 0
             for st in step_plan(r, world_size, n_local, causal=causal, layout=layout)] for r in range(world_size)]
