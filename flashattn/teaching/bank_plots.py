"""Pictures of shared-memory banks: a tile coloured by bank with one warp's request outlined, the
distinct words it asks of each bank, and one column read in five layouts side by side (notebook 06)."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.colors import ListedColormap
from matplotlib.patches import Rectangle

from flashattn.kernels.v2 import compute_padded_headdim
from flashattn.models.banks import NUM_BANKS, WARP_SIZE, Request, WarpRead, bank, column_read, words_per_access
from flashattn.models.layouts import TileLayout, doubled, padded, row_major, transposed, xor_swizzled
from flashattn.teaching import plots


def bank_colors():
    """32 distinguishable colours, one per bank (a ListedColormap)."""
    colors = list(plt.get_cmap("tab20").colors) + list(plt.get_cmap("tab20b").colors)
    order = list(range(0, 20, 2)) + list(range(1, 20, 2)) + list(range(20, 32))  # neighbours in different hues
    return ListedColormap([colors[i] for i in order], name="banks")


def _grid(layout: TileLayout, max_rows: int | None, max_cols: int | None):
    """Bank of every logical element (and of the padding), as a 2-D array; padding cells are -1."""
    rows = min(layout.rows, max_rows or layout.rows)
    cols = min(layout.cols, max_cols or layout.cols)
    if layout.order == "row":
        shape = (rows, cols + (layout.padding if cols == layout.cols else 0))
    else:
        shape = (rows + (layout.padding if rows == layout.rows else 0), cols)
    grid = np.full(shape, -1, dtype=int)
    for r in range(rows):
        for c in range(cols):
            grid[r, c] = bank(layout.byte_address(r, c))
    return grid, rows, cols


def draw_request(ax, read: WarpRead, *, max_rows: int | None = None, max_cols: int | None = None,
                 title: str | None = None, annotate: bool | None = None, aspect: str = "equal",
                 colorbar: bool = False) -> Request:
    """Draw the tile coloured by bank on ``ax``, the lanes' elements outlined (and labelled with their
    bank when ``annotate``; by default for tiles up to 64×64); returns the analysis."""
    req = read.analyze()
    touched_rows = max(r for lane in read.lane_elements for r, _ in lane) + 1
    touched_cols = max(c for lane in read.lane_elements for _, c in lane) + 1
    max_rows = max_rows or max(touched_rows, min(read.layout.rows, WARP_SIZE))
    grid, rows, cols = _grid(read.layout, max_rows, max_cols or max(touched_cols, min(read.layout.cols, 64)))
    cmap = bank_colors().with_extremes(bad="#dddddd")
    image = ax.imshow(np.ma.masked_less(grid, 0), cmap=cmap, vmin=-0.5, vmax=NUM_BANKS - 0.5, aspect=aspect,
                      interpolation="nearest")
    ax.grid(False)
    if annotate is None:
        annotate = grid.shape[0] * grid.shape[1] <= 64 * 64
    fontsize = 6 if max(grid.shape) <= 40 else 4
    for elements in read.lane_elements:
        for r, c in elements:
            if r < grid.shape[0] and c < grid.shape[1]:
                ax.add_patch(Rectangle((c - 0.5, r - 0.5), 1, 1, fill=False, lw=1.2, ec="black"))
                if annotate:  # the bank number of each element read
                    red, green, blue, _ = cmap(grid[r, c])
                    dark = 0.299 * red + 0.587 * green + 0.114 * blue < 0.5
                    ax.text(c, r, str(grid[r, c]), ha="center", va="center", fontsize=fontsize,
                            color="white" if dark else "#222222")
    if read.layout.padding:
        if read.layout.order == "row" and grid.shape[1] > cols:
            ax.axvline(cols - 0.5, color="#555555", lw=0.8, ls="--")
        elif read.layout.order == "col" and grid.shape[0] > rows:
            ax.axhline(rows - 0.5, color="#555555", lw=0.8, ls="--")
    ax.set_xlabel("column")
    ax.set_ylabel("row")
    ax.set_title(title or f"{read.layout.name}\n{req.describe()}", fontsize=8)
    if colorbar:
        bar = ax.figure.colorbar(image, ax=ax, ticks=range(0, NUM_BANKS, 4), fraction=0.04, pad=0.02)
        bar.set_label("bank")
    return req


def plot_request(read: WarpRead, *, max_rows: int | None = None, max_cols: int | None = None,
                 title: str | None = None):
    """A tile coloured by bank (32 colours), the elements one warp request reads outlined, and below it
    the distinct words the request asks of each bank, phase by phase. Returns a Figure."""
    plots.use_style()
    fig, (ax, ax_bars) = plt.subplots(2, 1, figsize=(7.5, 7.5), gridspec_kw={"height_ratios": [3, 1]})
    req = draw_request(ax, read, max_rows=max_rows, max_cols=max_cols, title=title or read.layout.name,
                       colorbar=True)
    _draw_bank_bars(ax_bars, req)
    fig.suptitle(read.description, fontsize=9)
    fig.tight_layout()
    return fig


def _draw_bank_bars(ax, req: Request) -> None:
    bottom = np.zeros(NUM_BANKS)
    shades = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728"]
    for i, phase in enumerate(req.phases):
        counts = np.array(phase.words_per_bank)
        ax.bar(range(NUM_BANKS), counts, bottom=bottom, color=shades[i % 4],
               label=f"phase {i}: lanes {phase.lanes[0]}–{phase.lanes[-1]}, {phase.wavefronts} "
                     f"wavefront{'s' if phase.wavefronts != 1 else ''}"
               if phase.lanes else f"phase {i}: no active lane")
        bottom += counts
    ax.set_xlim(-0.5, NUM_BANKS - 0.5)
    ax.set_xticks(range(0, NUM_BANKS, 4))
    ax.set_xlabel("bank")
    ax.set_ylabel("distinct words")
    ax.set_title(req.describe(), fontsize=9)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))


def comparison_layouts(D: int = 32, element_bytes: int = 4, access_bytes: int = 4, block_n: int = 64,
                       swizzle_period: int = 8) -> list[tuple[str, TileLayout]]:
    """The layouts of the side-by-side picture for a (block_n, D) K tile, with short titles.

    Padding is one access wide (+1 word for 4-byte, +2 for 8-byte, +4 for 16-byte accesses).
    """
    pad = words_per_access(access_bytes)
    return [
        ("row-major (v2)", row_major(block_n, D, element_bytes)),
        (f"padded +{pad} word{'s' if pad > 1 else ''}", padded(block_n, D, element_bytes, pad)),
        (f"doubled to {compute_padded_headdim(D)} (the source)", doubled(block_n, D, element_bytes)),
        ("transposed (v2_kt)", transposed(block_n, D, element_bytes)),
        (f"XOR-swizzled (period {swizzle_period})", xor_swizzled(block_n, D, element_bytes, swizzle_period)),
    ]


def plot_layouts(D: int = 32, element_bytes: int = 4, access_bytes: int = 4, block_n: int = 64, col: int = 0):
    """Side by side: the same warp read of column ``col`` of a (block_n, D) K tile in five layouts.

    Returns ``(figure, results)`` where results is a list of ``(title, WarpRead, Request)``.
    """
    plots.use_style()
    layouts = comparison_layouts(D, element_bytes, access_bytes, block_n)
    fig, axes = plt.subplots(1, len(layouts), figsize=(3.2 * len(layouts), 5.2))
    results = []
    for ax, (title, layout) in zip(axes, layouts, strict=True):
        read = column_read(layout, col, 0, access_bytes)
        req = draw_request(ax, read, max_rows=WARP_SIZE if layout.order == "row" else None,
                           title=f"{title}\n{read.analyze().short()}", annotate=False, aspect="auto")
        results.append((title, read, req))
    fig.suptitle(f"one warp reads column {col} of a {block_n}×{D} K tile ({element_bytes}-byte elements, "
                 f"{access_bytes}-byte accesses); colour = bank, outlined = the elements read", fontsize=10)
    fig.tight_layout()
    return fig, results
