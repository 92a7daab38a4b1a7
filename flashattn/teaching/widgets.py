"""ipywidgets front ends: thin layers over plain, tested functions of the package.

Each widget wires sliders and dropdowns to a pure function (``continuous_update=False``) and
displays the figure for its default settings as a plain output, which readers without a live
kernel (a static render on GitHub, a headless run) also see. A notebook follows every widget with
a cell that calls the same pure function with ``*_defaults()`` and checks the result, because a
widget's callback swallows exceptions.

Sections: one per widget, in course order. Importing this module needs no display.
"""

from __future__ import annotations

import ipywidgets as widgets

from flashattn import runtime
from flashattn.models import traffic


def live_output(show, controls: dict, *, draw_now: bool, **fixed) -> widgets.Output:
    """An ``Output`` that calls ``show(**values, **fixed)`` again whenever a control changes.

    Unlike ``ipywidgets.interactive_output`` it draws nothing into the ``Output`` at creation
    unless ``draw_now``: the widgets here show their first figure as the cell's own output
    instead. Headless runs (nbclient, which nbmake uses) answer every change of an ``Output``
    widget's contents with a message back to the kernel, and that exchange can deadlock
    (jupyter/nbclient#312; we saw it hang a notebook on a GPU machine). With nothing drawn
    into the ``Output`` until a reader moves a control, there is no such exchange.
    """
    from IPython.display import clear_output

    output = widgets.Output()

    def redraw(_change=None):
        with output:
            clear_output(wait=True)
            show(**{name: control.value for name, control in controls.items()}, **fixed)

    for control in controls.values():
        control.observe(redraw, names="value")
    if draw_now:
        redraw()
    return output

# --- HBM traffic model (notebooks 02, 04, 05) -------------------------------------------------

TRAFFIC_VARIANTS = ("naive", "v1", "v2")
TRAFFIC_DTYPES = (("float32", 4), ("float16 / bfloat16", 2))
TRAFFIC_BLOCKS = (16, 32, 64, 128)
TRAFFIC_HEAD_DIMS = (32, 64, 128)
TRAFFIC_N_MIN = 128


def traffic_defaults() -> dict:
    """Default widget settings: the course's full (GPU) problem sizes, float32, 64×64 blocks.

    The model is arithmetic, so GPU-scale sizes cost nothing even in interpreter mode.
    """
    full = runtime.SIZES_BY_NAME["full"]
    return dict(n_max=max(full.N_sweep), D=full.D, dtype_bytes=4, block_m=64, block_n=64,
                causal=False, B=full.B, H=full.H)


def traffic_view(n_max, D, dtype_bytes, block_m, block_n, causal, B, H, variants=TRAFFIC_VARIANTS):
    """The pure computation behind :func:`traffic_widget`: ``(figure, summary at N = n_max)``."""
    problem = dict(D=D, dtype_bytes=dtype_bytes, block_m=block_m, block_n=block_n, B=B, H=H, causal=causal)
    fig = traffic.plot_traffic(traffic.n_sweep(n_max, TRAFFIC_N_MIN), variants=variants, **problem)
    summary = traffic.traffic_summary(N=max(traffic.n_sweep(n_max, TRAFFIC_N_MIN)), **problem)
    return fig, summary


def _show_traffic(**settings) -> None:
    import matplotlib.pyplot as plt
    from IPython.display import display

    fig, summary = traffic_view(**settings)
    display(fig)
    plt.close(fig)
    print(summary["text"])


def traffic_widget(*, display_static: bool = True, **overrides) -> widgets.VBox:
    """Sliders and dropdowns (N max, D, dtype, block_m, block_n, causal) over :func:`traffic_view`.

    ``overrides`` change the defaults of :func:`traffic_defaults` (e.g. ``B=1``). With
    ``display_static`` the default figure is also displayed as a plain output, so the notebook reads
    sensibly where widgets cannot run. Returns the widget box (the notebook cell displays it).
    """
    settings = {**traffic_defaults(), **overrides}
    n_options = traffic.n_sweep(4 * settings["n_max"], 2 * TRAFFIC_N_MIN)  # up to 4× the default
    if settings["n_max"] not in n_options:
        raise ValueError(f"n_max must be a power of two >= {2 * TRAFFIC_N_MIN}, got {settings['n_max']}")
    controls = {
        "n_max": widgets.SelectionSlider(options=n_options, value=settings["n_max"], description="N max",
                                         continuous_update=False),
        "D": widgets.Dropdown(options=TRAFFIC_HEAD_DIMS, value=settings["D"], description="D"),
        "dtype_bytes": widgets.Dropdown(options=TRAFFIC_DTYPES, value=settings["dtype_bytes"], description="dtype"),
        "block_m": widgets.Dropdown(options=TRAFFIC_BLOCKS, value=settings["block_m"], description="block_m"),
        "block_n": widgets.Dropdown(options=TRAFFIC_BLOCKS, value=settings["block_n"], description="block_n"),
        "causal": widgets.Checkbox(value=settings["causal"], description="causal"),
    }
    if display_static:
        _show_traffic(**settings)
    output = live_output(_show_traffic, controls, draw_now=not display_static, B=settings["B"], H=settings["H"])
    ui = widgets.VBox([
        widgets.HBox([controls["n_max"], controls["dtype_bytes"], controls["causal"]]),
        widgets.HBox([controls["D"], controls["block_m"], controls["block_n"]]),
    ])
    return widgets.VBox([ui, output])


# --- shared-memory bank conflicts (notebook 06) -----------------------------------------------

from flashattn.models import banks  # noqa: E402  (this section's own import, kept with the section)

BANK_HEAD_DIMS = (16, 32, 64, 128)
BANK_DTYPES = {"float32": 4, "float16": 2}
BANK_ACCESS = (("4 bytes (32-bit load)", 4), ("8 bytes (64-bit load)", 8), ("16 bytes (128-bit load)", 16))
BANK_LAYOUTS = (("K row-major, as v2 stores it", "row"), ("K transposed, as v2_kt stores it", "col"))
BANK_PADDING = (("none", 0), ("+1 word", 1), ("+2 words", 2), ("+4 words", 4), ("+8 words (the post's skew)", 8),
                ("doubled (compute_padded_headdim)", "double"))
BANK_SWIZZLE = (("off", 1), ("XOR, period 2", 2), ("XOR, period 4", 4), ("XOR, period 8", 8))
BANK_BLOCK_N = 64  # rows of the K tile: v2's default BLOCK_N


def bank_defaults() -> dict:
    """Default widget settings: the post's case, a float32 K tile with D = 32 read column-wise, 4-byte loads."""
    return dict(D=32, dtype="float32", access_bytes=4, layout="row", padding=0, swizzle=1)


def bank_layout(D, dtype, layout, padding, swizzle, block_n=BANK_BLOCK_N) -> banks.TileLayout:
    """The (block_n, D) K tile of the widget's settings as a :class:`flashattn.banks.TileLayout`."""
    if dtype not in BANK_DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(BANK_DTYPES)}, got {dtype!r}")
    if layout not in ("row", "col"):
        raise ValueError(f"layout must be 'row' (v2) or 'col' (v2_kt), got {layout!r}")
    element_bytes = BANK_DTYPES[dtype]
    line = D if layout == "row" else block_n  # a stored line: a row of K, or a column for Kᵀ
    if padding == "double":
        stride = banks.compute_padded_headdim(line)
    else:
        stride = line + banks.pad_elements(padding, element_bytes)
    return banks.TileLayout(block_n, D, element_bytes, layout, stride, swizzle_period=swizzle)


def bank_view(D, dtype, access_bytes, layout, padding, swizzle, block_n=BANK_BLOCK_N):
    """The pure computation behind :func:`bank_widget`: ``(figure, summary)``.

    One warp reads column 0 of the K tile (lane i reads key row i, or 4 keys per lane with 16-byte
    loads of the transposed tile); the figure colours the tile by bank and outlines what is read.
    ``summary``: ``wavefronts``, ``ideal``, ``conflict_ways``, ``layout`` and ``read`` (descriptions),
    ``text`` (one line). Raises ValueError for settings that cannot be (e.g. a misaligned vector load).
    """
    tile = bank_layout(D, dtype, layout, padding, swizzle, block_n)
    read = banks.column_read(tile, 0, 0, access_bytes)
    req = read.analyze()
    fig = banks.plot_request(read)
    summary = {
        "wavefronts": req.wavefronts, "ideal": req.ideal, "conflict_ways": req.conflict_ways,
        "layout": tile.name, "read": read.description,
        "text": f"{tile.name}; {read.description}: {req.describe()}",
    }
    return fig, summary


def _show_banks(**settings) -> None:
    import matplotlib.pyplot as plt
    from IPython.display import display

    try:
        fig, summary = bank_view(**settings)
    except ValueError as err:  # settings that cannot be: say why instead of failing silently
        print(f"not possible: {err}")
        return
    display(fig)
    plt.close(fig)
    print(summary["text"])


def bank_widget(*, display_static: bool = True, **overrides) -> widgets.VBox:
    """Dropdowns (D, dtype, access width, layout, padding, swizzle) over :func:`bank_view`.

    With ``display_static`` the default figure is displayed as a plain output, and the widget's own
    output area fills when a control changes.
    """
    settings = {**bank_defaults(), **overrides}
    controls = {
        "D": widgets.Dropdown(options=BANK_HEAD_DIMS, value=settings["D"], description="D"),
        "dtype": widgets.Dropdown(options=tuple(BANK_DTYPES), value=settings["dtype"], description="dtype"),
        "access_bytes": widgets.Dropdown(options=BANK_ACCESS, value=settings["access_bytes"], description="access"),
        "layout": widgets.Dropdown(options=BANK_LAYOUTS, value=settings["layout"], description="layout"),
        "padding": widgets.Dropdown(options=BANK_PADDING, value=settings["padding"], description="padding"),
        "swizzle": widgets.Dropdown(options=BANK_SWIZZLE, value=settings["swizzle"], description="swizzle"),
    }
    for control in controls.values():
        control.continuous_update = False
    if display_static:
        _show_banks(**settings)
    output = live_output(_show_banks, controls, draw_now=not display_static)
    ui = widgets.VBox([
        widgets.HBox([controls["D"], controls["dtype"], controls["access_bytes"]]),
        widgets.HBox([controls["layout"], controls["padding"], controls["swizzle"]]),
    ])
    return widgets.VBox([ui, output])
