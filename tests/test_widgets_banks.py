"""The bank-conflict widget: its pure function, its layouts, and that the widget builds and reacts."""

import html

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


def _controls(box):
    return {c.description: c for hbox in box.children if isinstance(hbox, ipywidgets.HBox) for c in hbox.children}


def _summary_text(box):
    fig, summary = widgets.bank_view(**box.settings())
    plt.close(fig)
    return summary["text"]


def test_bank_widget_shows_one_figure_the_current_one():
    box = widgets.bank_widget()
    assert isinstance(box, widgets.FigureWidget)
    controls = _controls(box)
    assert set(controls) == {"D", "dtype", "access", "layout", "padding", "swizzle"}
    assert all(c.continuous_update is False for c in controls.values())
    assert [type(c) for c in box.children if not isinstance(c, ipywidgets.HBox)] == [ipywidgets.Image,
                                                                                    ipywidgets.HTML]
    default_png = bytes(box.image.value)
    assert "32-way conflict" in box.text and box.summary.value == html.escape(box.text)
    controls["padding"].value = 1
    assert box.settings() == {**widgets.bank_defaults(), "padding": 1}
    assert bytes(box.image.value) != default_png and "32-way" not in box.text
    assert box.text == _summary_text(box)
    controls["layout"].value = "col"
    assert box.text == _summary_text(box)
    assert plt.get_fignums() == []


def test_bank_widget_explains_impossible_settings_and_hides_the_figure():
    box = widgets.bank_widget(D=64)
    assert "64×64 row-major" in box.text
    controls = _controls(box)
    controls["padding"].value = 1
    controls["access"].value = 16  # a padded row is no longer 16-byte aligned
    assert box.text.startswith("not possible: lane 1") and box.image.layout.display == "none"
    data = box._repr_mimebundle_()
    assert "image/png" not in data and data["text/plain"].startswith("not possible")  # no stale figure
    controls["padding"].value = 4
    assert box.image.layout.display is None and "line stride 68" in box.text
    assert "image/png" in box._repr_mimebundle_()


def test_bank_widget_rejects_bad_settings():
    with pytest.raises(ValueError, match="D must be one of"):
        widgets.bank_widget(D=48)
    with pytest.raises(ValueError, match="padding must be one of"):
        widgets.bank_widget(padding=3)
    with pytest.raises(TypeError, match="unknown settings"):
        widgets.bank_widget(swizle=2)
    with pytest.raises(ValueError, match="not aligned"):  # defaults that cannot be drawn fail at once
        widgets.bank_widget(padding=1, access_bytes=16)
