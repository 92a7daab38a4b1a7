"""The bank-conflict widget: its pure function, its layouts, and that the widget builds and reacts."""

import ipywidgets
import matplotlib.pyplot as plt
import pytest

from flashattn import banks, widgets


def test_bank_defaults_are_valid_options():
    d = widgets.bank_defaults()
    assert d["D"] in widgets.BANK_HEAD_DIMS and d["dtype"] in widgets.BANK_DTYPES
    assert d["access_bytes"] in [v for _, v in widgets.BANK_ACCESS]
    assert d["layout"] in [v for _, v in widgets.BANK_LAYOUTS]
    assert d["padding"] in [v for _, v in widgets.BANK_PADDING]
    assert d["swizzle"] in [v for _, v in widgets.BANK_SWIZZLE]


def test_bank_view_with_defaults():
    fig, summary = widgets.bank_view(**widgets.bank_defaults())
    try:
        assert summary["wavefronts"] == 32 and summary["ideal"] == 1 and summary["conflict_ways"] == 32
        assert summary["layout"] == "64×32 row-major, 4-byte elements"
        assert "lane i reads row i, column 0" in summary["read"] and "32-way conflict" in summary["text"]
        assert len(fig.axes) == 3 and fig.axes[0].images[0].get_array().shape == (32, 32)
    finally:
        plt.close(fig)


@pytest.mark.parametrize("change, wavefronts, ideal", [
    (dict(layout="col"), 1, 1),
    (dict(padding=1), 1, 1),
    (dict(padding=8), 8, 1),
    (dict(padding="double"), 32, 1),
    (dict(access_bytes=16), 32, 4),
    (dict(access_bytes=16, padding=4), 4, 4),
    (dict(access_bytes=16, swizzle=8), 4, 4),
    (dict(swizzle=8), 4, 1),
    (dict(access_bytes=8, padding=2), 2, 2),
    (dict(dtype="float16"), 16, 1),  # 64-byte rows: two rows per turn of the banks
    (dict(dtype="float16", D=64), 32, 1),
    (dict(D=128, layout="col", access_bytes=16), 4, 4),
    (dict(D=16), 16, 1),
])
def test_bank_view_settings(change, wavefronts, ideal):
    settings = {**widgets.bank_defaults(), **change}
    fig, summary = widgets.bank_view(**settings)
    plt.close(fig)
    assert (summary["wavefronts"], summary["ideal"]) == (wavefronts, ideal)
    tile = widgets.bank_layout(settings["D"], settings["dtype"], settings["layout"], settings["padding"],
                               settings["swizzle"])
    read = banks.column_read(tile, 0, 0, settings["access_bytes"])
    assert read.wavefronts == wavefronts  # the widget shows exactly the simulator's answer


def test_bank_layout_strides():
    assert widgets.bank_layout(32, "float32", "row", 0, 1).line_stride == 32
    assert widgets.bank_layout(32, "float32", "row", 1, 1).line_stride == 33
    assert widgets.bank_layout(32, "float16", "row", 1, 1).line_stride == 34
    assert widgets.bank_layout(32, "float32", "row", "double", 1).line_stride == 64
    transposed = widgets.bank_layout(32, "float32", "col", "double", 1)
    assert transposed.order == "col" and transposed.line_stride == 128  # a stored column: 64 keys, doubled
    assert widgets.bank_layout(64, "float32", "row", 0, 8).swizzle_period == 8


@pytest.mark.parametrize("change, match", [
    (dict(dtype="bfloat16"), "dtype"),
    (dict(layout="diagonal"), "layout"),
    (dict(padding=1, access_bytes=16), "not aligned"),
    (dict(D=16, dtype="float16", swizzle=8), "XOR swizzle"),
])
def test_bank_view_rejects(change, match):
    with pytest.raises(ValueError, match=match):
        widgets.bank_view(**{**widgets.bank_defaults(), **change})
    plt.close("all")


def test_bank_widget_builds_and_reacts(monkeypatch):
    calls = []
    monkeypatch.setattr(widgets, "_show_banks", lambda **settings: calls.append(settings))
    box = widgets.bank_widget(display_static=True)
    assert isinstance(box, ipywidgets.VBox)
    controls = {c.description: c for hbox in box.children[0].children for c in hbox.children}
    assert set(controls) == {"D", "dtype", "access", "layout", "padding", "swizzle"}
    assert all(c.continuous_update is False for c in controls.values())
    assert isinstance(box.children[1], ipywidgets.Output)
    assert calls == [widgets.bank_defaults()]  # the static figure only: the Output fills on a change
    controls["padding"].value = 1
    assert calls[-1]["padding"] == 1 and calls[-1]["D"] == 32
    controls["layout"].value = "col"
    assert calls[-1]["layout"] == "col"


def test_bank_widget_renders_and_explains_impossible_settings(capsys):
    box = widgets.bank_widget(display_static=True, D=64)
    assert isinstance(box, ipywidgets.VBox)
    assert "64×64 row-major" in capsys.readouterr().out
    assert plt.get_fignums() == []
    widgets._show_banks(**{**widgets.bank_defaults(), "padding": 1, "access_bytes": 16})
    assert capsys.readouterr().out.startswith("not possible: lane 1")
    with pytest.raises(Exception):  # noqa: B017 - an option the dropdown does not offer
        widgets.bank_widget(display_static=False, D=48)
