"""flashattn.bank_plots: a tile coloured by bank, one request outlined; five layouts side by side."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from flashattn import bank_plots, banks, layouts

# --- pictures ------------------------------------------------------------------------------------


def test_plot_request_draws_banks_lanes_and_bars():
    read = banks.column_read(layouts.padded(64, 32, pad_words=1))
    fig = bank_plots.plot_request(read)
    try:
        assert isinstance(fig, Figure)
        ax, ax_bars, colorbar = fig.axes
        assert colorbar.get_ylabel() == "bank"
        image = ax.images[0].get_array()
        assert image.shape == (32, 33)  # 32 rows, 32 columns + the padding column
        assert image[5, 0] == banks.bank(read.layout.byte_address(5, 0)) == 5
        assert bool(np.ma.getmaskarray(image)[:, 32].all())  # padding drawn as "bad" (grey)
        outlined = [p for p in ax.patches if isinstance(p, Rectangle)]
        assert len(outlined) == 32 and {(p.get_x() + 0.5, p.get_y() + 0.5) for p in outlined} == {
            (0, r) for r in range(32)}
        heights = [bar.get_height() for bar in ax_bars.patches]
        assert heights == [1] * 32  # one word from every bank
        assert "1 wavefront, ideal 1: conflict-free" in ax_bars.get_title()
        assert read.description in fig._suptitle.get_text()
    finally:
        plt.close(fig)


def test_plot_request_vector_phases():
    read = banks.column_read(layouts.row_major(64, 32), access_bytes=16)
    fig = bank_plots.plot_request(read)
    try:
        ax, ax_bars, _ = fig.axes
        assert len([p for p in ax.patches if isinstance(p, Rectangle)]) == 32 * 4
        assert len(ax_bars.containers) == 4  # one bar series per phase
        assert [b.get_height() for b in ax_bars.containers[0]][:5] == [8, 8, 8, 8, 0]
        assert "32 wavefronts (4 phases: 8 + 8 + 8 + 8)" in ax_bars.get_title()
    finally:
        plt.close(fig)


def test_plot_layouts_side_by_side():
    fig, results = bank_plots.plot_layouts(32, 4, 4)
    try:
        assert len(fig.axes) == 5 and len(results) == 5
        for ax, (title, read, req) in zip(fig.axes, results, strict=True):
            assert title in ax.get_title() and f"{req.wavefronts} wavefront" in ax.get_title()
            assert req.wavefronts == read.wavefronts
        assert [r.wavefronts for _, _, r in results] == [32, 1, 32, 1, 4]
        assert "64×32 K tile" in fig._suptitle.get_text()
    finally:
        plt.close(fig)
    fig, results = bank_plots.plot_layouts(64, 2, 16)
    try:
        assert [r.wavefronts for _, _, r in results] == [32, 4, 32, 4, 4]
        assert "padded +4 words" == results[1][0]
    finally:
        plt.close(fig)


def test_bank_colors_are_distinct():
    colors = bank_plots.bank_colors().colors
    assert len(colors) == 32 and len({tuple(c) for c in colors}) == 32
