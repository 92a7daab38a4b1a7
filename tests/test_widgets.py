"""Widgets: the pure functions behind them, and that each widget builds."""

from __future__ import annotations

import base64

import ipywidgets
import matplotlib.pyplot as plt
import pytest
from matplotlib.figure import Figure

from flashattn import plots, runtime, traffic, widgets

# --- HBM traffic ------------------------------------------------------------------------------


def test_plot_traffic_has_one_line_per_variant_with_the_model_numbers():
    n_values = [128, 256, 512]
    p = dict(D=32, dtype_bytes=2, block_m=64, block_n=32, B=2, H=3, causal=True)
    fig = plots.plot_traffic(n_values, variants=("naive", "v1", "v2", "v2_kt"), **p)
    try:
        assert isinstance(fig, Figure)
        ax_read, ax_write = fig.axes
        for ax, key in ((ax_read, "read"), (ax_write, "write")):
            assert ax.get_yscale() == "log" and ax.get_xscale() == "log"
            assert [line.get_label() for line in ax.lines] == ["naive", "v1", "v2", "v2_kt"]
            for line in ax.lines:
                variant = line.get_label()
                assert line.get_color() == plots.color(variant)
                assert list(line.get_xdata()) == n_values
                assert list(line.get_ydata()) == [traffic.hbm_bytes(variant, N=n, **p)[key] for n in n_values]
        assert "read" in ax_read.get_title() and "written" in ax_write.get_title()
        assert "causal" in fig._suptitle.get_text()
        assert [t.get_text() for t in ax_read.get_legend().get_texts()] == ["naive", "v1", "v2", "v2_kt"]
    finally:
        plt.close(fig)


def test_plot_traffic_rejects_empty_and_bad_sizes():
    with pytest.raises(ValueError, match="empty"):
        plots.plot_traffic([], 64, 4, 64, 64, 1, 1)
    with pytest.raises(ValueError, match="block_m"):
        plots.plot_traffic([128], 64, 4, 0, 64, 1, 1)
    plt.close("all")


def test_traffic_summary_numbers():
    p = dict(N=1024, D=64, dtype_bytes=4, block_m=64, block_n=64, B=2, H=4)
    s = traffic.traffic_summary(**p)
    v1 = traffic.hbm_bytes("v1", **p)
    v2 = traffic.hbm_bytes("v2", **p)
    assert s["old_bytes"] == v1 and s["new_bytes"] == v2
    assert s["read_saving"] == pytest.approx(1 - v2["read"] / v1["read"])
    assert s["write_saving"] == pytest.approx(1 - v2["write"] / v1["write"])
    assert s["total_saving"] == pytest.approx(1 - (v2["read"] + v2["write"]) / (v1["read"] + v1["write"]))
    assert s["text"].startswith("N=1024: v2 reads ") and "than v1" in s["text"]
    other = traffic.traffic_summary(**p, new="v1", old="naive")
    assert other["write_saving"] > 0 and "v1" in other["text"] and "naive" in other["text"]


def test_traffic_defaults_come_from_the_full_sizes():
    d = widgets.traffic_defaults()
    full = runtime.SIZES_BY_NAME["full"]
    assert (d["B"], d["H"], d["D"], d["n_max"]) == (full.B, full.H, full.D, max(full.N_sweep))
    assert d["D"] in widgets.TRAFFIC_HEAD_DIMS and d["block_m"] in widgets.TRAFFIC_BLOCKS


def test_traffic_view_with_defaults():
    d = widgets.traffic_defaults()
    fig, summary = widgets.traffic_view(**d)
    try:
        assert [line.get_label() for line in fig.axes[0].lines] == list(widgets.TRAFFIC_VARIANTS)
        assert list(fig.axes[0].lines[0].get_xdata())[-1] == d["n_max"]
        assert summary["text"].startswith(f"N={d['n_max']}:")
        assert summary["write_saving"] > 0.9  # v2 writes O once, v1 once per K/V block
    finally:
        plt.close(fig)


def _controls(box):
    return {c.description: c for hbox in box.children if isinstance(hbox, ipywidgets.HBox) for c in hbox.children}


def _summary_text(view, settings):
    fig, summary = view(**settings)
    plt.close(fig)
    return summary["text"]


def _images(box):
    return [child for child in box.children if isinstance(child, ipywidgets.Image)]


def test_figure_png_is_a_png_and_closes_the_figure():
    before = plt.get_fignums()  # figures another test on this worker left open are not this test's
    fig, _ = widgets.traffic_view(**widgets.traffic_defaults())
    assert fig.number in plt.get_fignums()
    png = widgets.figure_png(fig)
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 10_000
    assert plt.get_fignums() == before


def test_traffic_widget_shows_one_figure_the_current_one():
    box = widgets.traffic_widget()
    assert isinstance(box, widgets.FigureWidget) and isinstance(box, ipywidgets.VBox)
    controls = _controls(box)
    assert set(controls) == {"N max", "dtype", "causal", "D", "block_m", "block_n"}
    assert controls["N max"].continuous_update is False
    assert len(_images(box)) == 1 and not any(isinstance(c, ipywidgets.Output) for c in box.children)
    default_png = bytes(box.image.value)
    assert default_png.startswith(b"\x89PNG")
    assert box.text == _summary_text(widgets.traffic_view, widgets.traffic_defaults())
    controls["block_m"].value = 128
    controls["causal"].value = True
    assert box.settings() == {**widgets.traffic_defaults(), "block_m": 128, "causal": True}
    expected = _summary_text(widgets.traffic_view, box.settings())
    assert box.text == expected and bytes(box.image.value) != default_png  # replaced, not added
    assert len(_images(box)) == 1
    assert plt.get_fignums() == []


def test_traffic_widget_redraws_through_its_view(monkeypatch):
    calls = []

    def view(**settings):
        calls.append(settings)
        return plt.figure(), {"text": f"call {len(calls)}"}

    monkeypatch.setattr(widgets, "traffic_view", view)
    box = widgets.traffic_widget(B=1, H=2)
    assert calls == [{**widgets.traffic_defaults(), "B": 1, "H": 2}]  # drawn once at creation
    _controls(box)["D"].value = 128
    assert len(calls) == 2 and calls[-1]["D"] == 128 and calls[-1]["B"] == 1
    assert box.text == "call 2"


def test_widget_displays_as_one_bundle_with_a_static_figure():
    from IPython.core.formatters import DisplayFormatter

    box = widgets.traffic_widget(B=1, H=2, n_max=1024)
    data, _ = DisplayFormatter().format(box)
    assert set(data) == {"application/vnd.jupyter.widget-view+json", "image/png", "text/plain"}
    assert data["application/vnd.jupyter.widget-view+json"]["model_id"] == box.model_id
    assert base64.b64decode(data["image/png"]) == bytes(box.image.value)
    assert data["text/plain"].startswith("N=1024: v2 reads") and "VBox" not in data["text/plain"]
    _controls(box)["N max"].value = 2048
    data, _ = DisplayFormatter().format(box)  # displayed again later: the current figure
    assert base64.b64decode(data["image/png"]) == bytes(box.image.value) and data["text/plain"].startswith("N=2048")


def test_traffic_widget_rejects_bad_settings():
    with pytest.raises(ValueError, match="n_max"):
        widgets.traffic_widget(n_max=1000)
    with pytest.raises(ValueError, match="block_m must be one of"):
        widgets.traffic_widget(block_m=48)
    with pytest.raises(TypeError, match="unknown settings \\['blocks'\\]"):
        widgets.traffic_widget(blocks=64)


def test_widget_runs_headless_in_a_kernel_without_hanging(tmp_path):
    """What nbmake does: execute the widget cell in a real kernel through nbclient (no widget manager)."""
    import nbclient
    import nbformat

    nb = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_code_cell("from flashattn.teaching.widgets import traffic_widget"),
        nbformat.v4.new_code_cell("traffic_widget(B=1, H=2)"),
    ])
    nbclient.NotebookClient(nb, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}},
                            store_widget_state=True).execute()
    (output,) = nb.cells[1].outputs
    assert set(output["data"]) == {"application/vnd.jupyter.widget-view+json", "image/png", "text/plain"}
    assert base64.b64decode(output["data"]["image/png"]).startswith(b"\x89PNG")
    states = nb.metadata["widgets"]["application/vnd.jupyter.widget-state+json"]["state"]
    assert output["data"]["application/vnd.jupyter.widget-view+json"]["model_id"] in states
    assert not any(s["model_name"] == "OutputModel" for s in states.values())
