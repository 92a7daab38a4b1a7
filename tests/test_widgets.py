"""Widgets: the pure functions behind them, and that each widget builds."""

from __future__ import annotations

import ipywidgets
import matplotlib.pyplot as plt
import pytest
from matplotlib.figure import Figure

from flashattn import plots, runtime, traffic, widgets

# --- HBM traffic ------------------------------------------------------------------------------


def test_plot_traffic_has_one_line_per_variant_with_the_model_numbers():
    n_values = [128, 256, 512]
    p = dict(D=32, dtype_bytes=2, block_m=64, block_n=32, B=2, H=3, causal=True)
    fig = traffic.plot_traffic(n_values, variants=("naive", "v1", "v2", "v2_kt"), **p)
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
        traffic.plot_traffic([], 64, 4, 64, 64, 1, 1)
    with pytest.raises(ValueError, match="block_m"):
        traffic.plot_traffic([128], 64, 4, 0, 64, 1, 1)
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


def test_traffic_widget_builds_and_reacts(monkeypatch, capsys):
    calls = []
    monkeypatch.setattr(widgets, "_show_traffic", lambda **settings: calls.append(settings))
    box = widgets.traffic_widget(display_static=True)
    assert isinstance(box, ipywidgets.VBox)
    controls = {c.description: c for hbox in box.children[0].children for c in hbox.children}
    assert set(controls) == {"N max", "dtype", "causal", "D", "block_m", "block_n"}
    assert controls["N max"].continuous_update is False
    assert isinstance(box.children[1], ipywidgets.Output)
    assert calls == [widgets.traffic_defaults()]  # the static figure only: the Output fills on a change
    controls["block_m"].value = 128
    controls["causal"].value = True
    assert calls[-1]["block_m"] == 128 and calls[-1]["causal"] is True
    assert calls[-1]["B"] == widgets.traffic_defaults()["B"]


def test_traffic_widget_renders_for_real(capsys):
    box = widgets.traffic_widget(display_static=True, B=1, H=2, n_max=1024)
    assert isinstance(box, ipywidgets.VBox)
    out = capsys.readouterr().out
    assert "N=1024: v2 reads" in out  # the static copy's summary line
    assert plt.get_fignums() == []  # figures are closed after display
    with pytest.raises(ValueError, match="n_max"):
        widgets.traffic_widget(display_static=False, n_max=1000)


def test_live_output_draws_on_change_only_unless_asked():
    calls = []
    slider = ipywidgets.IntSlider(value=1)
    out = widgets.live_output(lambda **kw: calls.append(kw), {"x": slider}, draw_now=False, y=7)
    assert isinstance(out, ipywidgets.Output) and calls == []
    slider.value = 3
    assert calls == [{"x": 3, "y": 7}]
    widgets.live_output(lambda **kw: calls.append(kw), {"x": slider}, draw_now=True)
    assert calls[-1] == {"x": 3}
