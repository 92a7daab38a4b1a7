"""Pictures of ``fast``'s loops (notebooks 10, 11 and 14): which key blocks run masked, which a mask skips, and a
timeline of what overlaps with what in the Gluon kernel (from ``flashattn.models.schedule``)."""

from __future__ import annotations

import math

import matplotlib.pyplot as plt
from matplotlib.colors import ListedColormap
from matplotlib.patches import Patch

from flashattn.models.schedule import RESOURCES

from .plots import use_style

AGENT_COLORS = ("#1f77b4", "#2ca02c", "#9467bd", "#8c564b", "#e377c2")
LOAD_COLORS = {"Q": "#bbbbbb", "K": "#f5b041", "V": "#f0e442"}
WAIT_COLOR = "#eeeeee"


def plot_key_stages(stages_fn, n_keys: int, block_m: int, block_n: int, causal: bool, ax=None):
    """Every (Q tile, key block) of an N × N problem: run without a mask, with one, or skipped, as the stages
    ``stages_fn(m0, block_m, block_n, n_keys, causal) -> [(lo, hi, masked), ...]`` say. Returns the Figure."""
    use_style()
    tiles, blocks = math.ceil(n_keys / block_m), math.ceil(n_keys / block_n)
    fig, ax = plt.subplots(figsize=(min(9, 1.5 + 0.35 * blocks), min(6, 1.2 + 0.35 * tiles))) if ax is None else (
        ax.figure, ax)
    colours = {False: "#ff7f0e", True: "#fdd0a2"}
    counts = {False: 0, True: 0}
    for t in range(tiles):
        for lo, hi, masked in stages_fn(t * block_m, block_m, block_n, n_keys, causal):
            for start in range(lo, hi, block_n):
                ax.add_patch(plt.Rectangle((start / block_n, t), 1, 1, facecolor=colours[masked], edgecolor="white"))
                counts[masked] += 1
    ax.set_xlim(0, blocks)
    ax.set_ylim(tiles, 0)
    step = max(1, blocks // 16)
    ax.set_xticks([b + 0.5 for b in range(0, blocks, step)], [str(b) for b in range(0, blocks, step)], fontsize=8)
    ax.set_yticks([t + 0.5 for t in range(tiles)], [str(t) for t in range(tiles)], fontsize=8)
    ax.set_xlabel(f"key block (BLOCK_N = {block_n})")
    ax.set_ylabel(f"Q tile (BLOCK_M = {block_m})")
    ax.grid(False)
    ax.set_title(f"{'causal' if causal else 'non-causal'}, N = {n_keys}: {counts[False]} blocks unmasked, "
                 f"{counts[True]} masked, {tiles * blocks - counts[False] - counts[True]} skipped", fontsize=9)
    ax.legend(handles=[Patch(color=colours[False], label="no mask"), Patch(color=colours[True], label="masked"),
                       Patch(facecolor="white", edgecolor="#999999", label="skipped")],
              loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=8)
    fig.tight_layout()
    return fig


TILE_COLOURS = ("#ffffff", "#fdd0a2", "#ff7f0e")  # skipped, partial (masked), full (no mask): as plot_key_stages


def plot_tile_kinds(kinds, title: str = "", ax=None, block_m: int | None = None, block_n: int | None = None):
    """A (Tm, Tn) matrix of tile kinds (``mask_blocks``: 0 skipped, 1 partial, 2 full) as a picture, Q tiles down
    and key blocks across, in the colours of :func:`plot_key_stages`. Returns the Figure."""
    use_style()
    rows, cols = kinds.shape
    fig, ax = plt.subplots(figsize=(5.2, 4.2)) if ax is None else (ax.figure, ax)
    ax.imshow(kinds.cpu().numpy(), cmap=ListedColormap(TILE_COLOURS), vmin=0, vmax=2, interpolation="nearest",
              aspect="auto")
    ax.set_xlabel("key block" + (f" (BLOCK_N = {block_n})" if block_n else ""))
    ax.set_ylabel("Q tile" + (f" (BLOCK_M = {block_m})" if block_m else ""))
    ax.grid(False)
    counts = [int((kinds == k).sum()) for k in range(3)]
    ax.set_title(f"{title}{': ' if title else ''}{counts[2]} full, {counts[1]} partial, {counts[0]} skipped",
                 fontsize=9)
    if ax.figure is fig and len(fig.axes) == 1:
        ax.legend(handles=[Patch(color=TILE_COLOURS[2], label="full (no mask)"),
                           Patch(color=TILE_COLOURS[1], label="partial (masked)"),
                           Patch(facecolor="white", edgecolor="#999999", label="skipped")],
                  loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=8)
    ax.set_xlim(-0.5, cols - 0.5)
    ax.set_ylim(rows - 0.5, -0.5)
    fig.tight_layout()
    return fig


def _short(wait_label: str) -> str:
    """'wait k_ready[0] phase 1' -> 'k_ready[0]'; 'wait until <= 1 products run' -> 'wgmma <= 1'."""
    if wait_label.startswith("wait until <= "):
        return f"wgmma <= {wait_label.split()[3]}"
    return wait_label.removeprefix("wait ").split(" phase")[0]


def _bar(ax, y, iv, colour, hatch=None, text=None, min_text=0.0):
    width = iv["end"] - iv["start"]
    ax.barh(y, width, left=iv["start"], height=0.7, color=colour, edgecolor="white", linewidth=0.5, hatch=hatch)
    if text and width > min_text:  # no text in bars too narrow to hold it
        ax.text(iv["start"] + width / 2, y, text, ha="center", va="center", fontsize=6, clip_on=True)


def plot_timeline(result, title: str = "", *, ax=None, until: float | None = None, note: str = ""):
    """A Gantt chart of a :func:`flashattn.models.schedule.simulate` result: the SM's shared units (TMA copies,
    tensor-core products, softmax) and, per warp role, what it waited for. Colours: one per warpgroup on the
    shared units (QK solid, PV hatched); copies by tensor. ``until``: the last clock drawn; ``note``: a remark
    for the x axis (where the durations come from). Returns the Figure."""
    use_style()
    agents = list(dict.fromkeys(iv["agent"] for iv in result.intervals if iv["row"] not in RESOURCES))
    agents += [a for a in dict.fromkeys(iv["agent"] for iv in result.intervals) if a not in agents]
    rows = list(RESOURCES) + agents
    fig, ax = plt.subplots(figsize=(12, 0.9 + 0.45 * len(rows))) if ax is None else (ax.figure, ax)
    colour = {name: AGENT_COLORS[i % len(AGENT_COLORS)] for i, name in enumerate(a for a in agents if a != "producer")}
    colour["producer"] = "#7f7f7f"
    y = {row: i for i, row in enumerate(rows)}
    span = until or result.end or 1.0
    for iv in result.intervals:
        if until is not None and iv["start"] >= until:
            continue
        if iv["row"] == "TMA":
            _bar(ax, y["TMA"], iv, LOAD_COLORS.get(iv["kind"], "#cccccc"), text=iv["label"], min_text=0.015 * span)
        elif iv["row"] in RESOURCES:
            hatch = "///" if iv["kind"] in ("PV", "rescale") else None
            _bar(ax, y[iv["row"]], iv, colour.get(iv["agent"], "#cccccc"), hatch=hatch, text=iv["label"],
                 min_text=0.015 * span)
        elif iv["kind"] == "wait":
            _bar(ax, y[iv["row"]], iv, WAIT_COLOR, text=_short(iv["label"]), min_text=0.05 * span)
        else:
            _bar(ax, y[iv["row"]], iv, "#444444")
    ax.set_yticks(range(len(rows)), [f"{r} (waits)" if r in agents else r for r in rows], fontsize=8)
    ax.set_ylim(len(rows) - 0.4, -0.6)
    ax.set_xlim(0, until or result.end)
    ax.set_xlabel("clocks of one SM" + (f" ({note})" if note else ""))
    ax.grid(axis="y", visible=False)
    handles = [Patch(color=colour[a], label=a) for a in agents if a != "producer"]
    handles += [Patch(facecolor="white", edgecolor="#444444", hatch="///", label="PV / rescale"),
                Patch(color=LOAD_COLORS["K"], label="K copy"), Patch(color=LOAD_COLORS["V"], label="V copy"),
                Patch(color=WAIT_COLOR, label="waiting")]
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=8)
    busy = result.busy("tensor cores") / result.end if result.end else 0.0
    ax.set_title(f"{title}{': ' if title else ''}tensor cores busy {busy:.0%} of {result.end:,.0f} clocks", fontsize=10)
    fig.tight_layout()
    return fig
