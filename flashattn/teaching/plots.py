"""Figures in one course style, saved deterministically to ``figures/``.

Every plotting function returns a matplotlib Figure; ``save(fig, name)`` writes
``figures/<name>.png`` without timestamps or version strings, so re-running a notebook does not
change a committed figure unless its content changed.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt

from flashattn.runtime import REPO_ROOT

FIGURES_DIR = REPO_ROOT / "figures"

# One palette for the whole course: each variant keeps its colour from notebook to notebook.
COLORS = {
    "naive": "#7f7f7f",
    "v1": "#d62728",
    "v2": "#1f77b4",
    "v2_kt": "#2ca02c",
    "v2_kt_view": "#17becf",
    "v2_padded": "#9467bd",
    "fast": "#ff7f0e",
    "sdpa": "#000000",
}

STYLE = {
    "figure.figsize": (7.0, 4.0),
    "figure.dpi": 100,
    "savefig.dpi": 110,
    "font.size": 10,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "legend.frameon": False,
    "svg.hashsalt": "flashattn",
}


def use_style() -> None:
    plt.rcParams.update(STYLE)


def color(variant: str) -> str:
    return COLORS.get(variant, "#8c564b")


def save(fig, name: str, directory: Path | None = None) -> Path:
    """Write ``fig`` as ``<directory>/<name>.png`` (default ``figures/``) with no varying metadata."""
    directory = Path(directory or FIGURES_DIR)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{name}.png"
    fig.savefig(path, metadata={"Software": None}, bbox_inches="tight")
    return path


def caption(ax, text: str) -> None:
    """A small grey provenance line under the axes (e.g. ``recorded.label(entry)``)."""
    ax.annotate(text, xy=(0, -0.16), xycoords="axes fraction", fontsize=7, color="#666666",
                ha="left", va="top")


use_style()
