"""Pictures of ring attention (notebook 16): which K/V shard each rank holds at each step, who computes which
part of the attention matrix, and the work per rank under the two layouts (from ``flashattn.distributed.layouts``)."""

from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.patches import Patch

from flashattn.distributed import layouts

from .plots import use_style

RANK_COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f")


def rank_color(rank: int) -> str:
    return RANK_COLORS[rank % len(RANK_COLORS)]


def plot_schedule(world_size: int, layout: str, causal: bool = True, ax=None):
    """A grid of ranks × steps: the K/V shard each rank holds at each step (coloured by its owner, with its chunks
    of the sequence), and what the rank computes with it. Returns the Figure."""
    use_style()
    if ax is None:
        fig, ax = plt.subplots(figsize=(1.2 + 1.9 * world_size, 0.8 + 0.75 * world_size))
    else:
        fig = ax.figure
    per = layouts.chunks_per_rank(layout)
    for r in range(world_size):
        plan = layouts.step_plan(r, world_size, 2 * per, causal=causal, layout=layout)
        for s, st in enumerate(plan):
            chunks = ", ".join(map(str, layouts.chunks(st.source, world_size, layout)))
            ax.add_patch(plt.Rectangle((s, r), 1, 1, facecolor=rank_color(st.source),
                                       alpha=0.25 if not st.computes else 0.75, edgecolor="white", linewidth=2))
            ax.text(s + 0.5, r + 0.5, f"K/V of rank {st.source}\nchunk{'s' if per > 1 else ''} {chunks}\n{st.kind}",
                    ha="center", va="center", fontsize=7.5)
    ax.set_xlim(0, world_size)
    ax.set_ylim(world_size, 0)
    ax.set_xticks([s + 0.5 for s in range(world_size)], [f"step {s}" for s in range(world_size)])
    ax.set_yticks([r + 0.5 for r in range(world_size)], [f"rank {r}" for r in range(world_size)])
    ax.grid(False)
    ax.set_title(f"{layout} layout, {'causal' if causal else 'no mask'}: after each step every shard moves one rank "
                 "down (rank W−1's to rank 0)", fontsize=9)
    return fig


def plot_ownership(world_size: int, layout: str, ax=None):
    """The causal attention matrix in chunks of the sequence: each (query chunk, key chunk) block coloured by the
    rank that computes it (the owner of the query chunk); blocks right of the diagonal are never computed."""
    use_style()
    fig, ax = plt.subplots(figsize=(4.2, 4.2)) if ax is None else (ax.figure, ax)
    pieces = world_size * layouts.chunks_per_rank(layout)
    owner = {c: r for r in range(world_size) for c in layouts.chunks(r, world_size, layout)}
    for qc in range(pieces):
        for kc in range(qc + 1):
            ax.add_patch(plt.Rectangle((kc, qc), 1, 1, facecolor=rank_color(owner[qc]),
                                       alpha=0.45 if kc == qc else 0.85, edgecolor="white"))
    ax.plot([0, pieces], [0, pieces], color="#444444", linewidth=0.8)
    ax.set_xlim(0, pieces)
    ax.set_ylim(pieces, 0)
    ticks = [c + 0.5 for c in range(pieces)]
    ax.set_xticks(ticks, [str(c) for c in range(pieces)], fontsize=8)
    ax.set_yticks(ticks, [str(c) for c in range(pieces)], fontsize=8)
    ax.set_xlabel("key chunk")
    ax.set_ylabel("query chunk")
    ax.grid(False)
    ax.set_title(f"{layout}: who computes what", fontsize=9)
    ax.legend(handles=[Patch(color=rank_color(r), label=f"rank {r}") for r in range(world_size)], fontsize=7,
              loc="upper right")
    return fig


def plot_work(world_size: int, layout: str, causal: bool = True, n_local: int = 8192, block: int = 128, ax=None):
    """Bars of the key blocks each rank's kernels visit (``layouts.work``), stacked by step. Returns the Figure."""
    use_style()
    fig, ax = plt.subplots(figsize=(4.6, 3.4)) if ax is None else (ax.figure, ax)
    table = layouts.work(world_size, layout, causal, n_local, block, block)
    bottoms = [0] * world_size
    for s in range(world_size):
        heights = [table[r][s] for r in range(world_size)]
        ax.bar(range(world_size), heights, bottom=bottoms, color="#1f77b4" if s == 0 else "#9ecae1",
               edgecolor="white", label="step 0 (own shard)" if s == 0 else ("later steps" if s == 1 else None))
        bottoms = [b + h for b, h in zip(bottoms, heights, strict=True)]
    ax.set_xticks(range(world_size), [f"rank {r}" for r in range(world_size)], fontsize=8)
    ax.set_ylabel(f"key blocks visited ({block}×{block} tiles)")
    ax.set_title(f"{layout}, {'causal' if causal else 'no mask'}: N_local = {n_local}", fontsize=9)
    ax.legend(fontsize=7)
    return fig
