"""The pictures of notebook 16 (flashattn.teaching.ring_plots) and the work-per-rank widget."""

import matplotlib.pyplot as plt
import pytest

from flashattn.distributed import layouts
from flashattn.teaching import ring_plots, widgets


def test_schedule_has_one_cell_per_rank_and_step():
    fig = ring_plots.plot_schedule(3, "zigzag", causal=True)
    ax = fig.axes[0]
    assert len(ax.patches) == 9
    texts = [t.get_text() for t in ax.texts]
    assert texts[0].startswith("K/V of rank 0\nchunks 0, 5\ndiagonal")
    assert sum("second query chunk" in t for t in texts) == 3  # one per pair (rank < source)
    plt.close(fig)


@pytest.mark.parametrize("layout", layouts.LAYOUTS)
def test_ownership_colours_the_causal_blocks_by_the_rank_that_computes_them(layout):
    fig = ring_plots.plot_ownership(4, layout)
    pieces = 4 * layouts.chunks_per_rank(layout)
    assert len(fig.axes[0].patches) == pieces * (pieces + 1) // 2
    plt.close(fig)


def test_work_view_defaults_and_zigzag():
    fig, summary = widgets.ring_work_view(**widgets.ring_work_defaults())
    plt.close(fig)
    expected = [sum(row) for row in layouts.work(4, "contiguous", True, 8192, 128, 128)]
    assert summary["blocks"] == expected and summary["imbalance"] > 1.5
    fig, zigzag = widgets.ring_work_view(**{**widgets.ring_work_defaults(), "layout": "zigzag"})
    plt.close(fig)
    assert zigzag["imbalance"] == 1.0 and sum(zigzag["blocks"]) == sum(expected)
    fig, full = widgets.ring_work_view(4, "contiguous", False)
    plt.close(fig)
    assert full["imbalance"] == 1.0


def test_work_widget_redraws_and_refuses_unknown_settings():
    box = widgets.ring_work_widget()
    assert "contiguous" in box.text
    box.controls["layout"].value = "zigzag"
    assert "zigzag" in box.text and "1.00×" in box.text
    with pytest.raises(TypeError, match="unknown settings"):
        widgets.ring_work_widget(ranks=4)
    with pytest.raises(ValueError, match="ranks W must be one of"):
        widgets.ring_work_widget(world_size=5)
