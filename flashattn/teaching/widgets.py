"""ipywidgets front ends: thin layers over plain, tested functions of the package.

Each widget is a :class:`FigureWidget`: controls (``continuous_update=False``) over one figure that
the widget draws itself, as PNG bytes in an ``ipywidgets.Image``, with a one-line summary under it.
Moving a control replaces that figure, so the reader sees one figure: the current one.

Displayed, a widget is one MIME bundle: the live widget view (JupyterLab renders it), the current
figure as ``image/png`` and its summary as ``text/plain``. Readers without a widget manager (a
static render on GitHub, the course's HTML book, a notebook opened without its kernel) see the
default figure instead of an empty box.

Why an ``Image`` and not an ``Output`` capturing ``display(fig)``: headless runs (nbclient, which
nbmake uses) answer every change of an ``Output`` widget's contents with a message back to the
kernel, and that exchange can deadlock (jupyter/nbclient#312; we saw it hang a notebook on a GPU
machine). An ``Image`` is plain widget state: nothing is captured, nothing is answered.

A notebook follows every widget with a cell that calls the same pure function with ``*_defaults()``
and checks the result, because a widget's callbacks run where errors are easy to miss.

Sections: the widget class, then one section per widget in course order. Importing this module
needs no display.
"""

from __future__ import annotations

import base64
import html
import io
from collections.abc import Callable

import ipywidgets as widgets

from flashattn import runtime
from flashattn.models import traffic
from flashattn.teaching.plots import plot_traffic


def figure_png(fig) -> bytes:
    """``fig`` as PNG bytes (no varying metadata, tight bounding box, as ``plots.save`` writes), then closed."""
    import matplotlib.pyplot as plt

    buffer = io.BytesIO()
    try:
        fig.savefig(buffer, format="png", metadata={"Software": None}, bbox_inches="tight")
    finally:
        plt.close(fig)
    return buffer.getvalue()


class FigureWidget(widgets.VBox):
    """Rows of controls over one figure: ``view(**settings) -> (Figure, summary dict with "text")``.

    ``controls`` maps each keyword of ``view`` that the reader can change to its control; ``fixed``
    holds the others. The figure is drawn at once (a ValueError from ``view`` propagates: bad
    defaults are the caller's mistake) and again whenever a control changes. Settings that cannot
    be (``view`` raises ValueError) hide the figure and say why in the summary line, so the reader
    never sees a figure that does not match the controls.
    """

    def __init__(self, view: Callable, controls: dict, rows: list[list[str]], **fixed):
        self.view, self.controls, self.fixed = view, controls, fixed
        self.image = widgets.Image(format="png", layout=widgets.Layout(max_width="100%", height="auto"))
        self.summary = widgets.HTML(layout=widgets.Layout(width="100%"))  # a Label would cut a long line
        self.text = ""  # the summary line as plain text
        self.error = None  # the ValueError of the current settings, if they cannot be drawn
        png, text = self._draw()
        self.image.value = png
        self._say(text)
        rows = [widgets.HBox([controls[name] for name in row]) for row in rows]
        super().__init__([*rows, self.image, self.summary])
        self.add_class("flashattn-figure-widget")
        for control in controls.values():
            control.observe(self.redraw, names="value")

    def settings(self) -> dict:
        """The current settings: the controls' values and the fixed keywords."""
        return {**{name: control.value for name, control in self.controls.items()}, **self.fixed}

    def _draw(self) -> tuple[bytes, str]:
        fig, summary = self.view(**self.settings())
        return figure_png(fig), summary["text"]

    def _say(self, text: str) -> None:
        self.text = text
        self.summary.value = html.escape(text)

    def redraw(self, _change=None) -> None:
        """Draw the figure of the current settings in place of the old one (called on every change)."""
        try:
            png, text = self._draw()
        except ValueError as err:  # settings that cannot be: say why instead of showing a stale figure
            self.error = err
            self.image.layout.display = "none"
            self._say(f"not possible: {err}")
            return
        self.error = None
        self.image.value = png
        self._say(text)
        self.image.layout.display = None

    def _repr_mimebundle_(self, **kwargs) -> dict:
        bundle = super()._repr_mimebundle_(**kwargs)  # text/plain (a repr) and the widget view
        if self.error is None:
            bundle["image/png"] = base64.b64encode(self.image.value).decode("ascii")
        bundle["text/plain"] = self.text
        return bundle


def _settings(defaults: dict, overrides: dict, widget: str) -> dict:
    unknown = sorted(set(overrides) - set(defaults))
    if unknown:
        raise TypeError(f"{widget} got unknown settings {unknown}; it accepts {sorted(defaults)}")
    return {**defaults, **overrides}


def _dropdown(options, value, description: str) -> widgets.Dropdown:
    """A dropdown over ``options`` (values, or (label, value) pairs) that refuses a value it does not offer."""
    values = [option[1] if isinstance(option, tuple) else option for option in options]
    if value not in values:
        raise ValueError(f"{description} must be one of {values}, got {value!r}")
    return widgets.Dropdown(options=options, value=value, description=description)


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
    fig = plot_traffic(traffic.n_sweep(n_max, TRAFFIC_N_MIN), variants=variants, **problem)
    summary = traffic.traffic_summary(N=max(traffic.n_sweep(n_max, TRAFFIC_N_MIN)), **problem)
    return fig, summary


def traffic_widget(**overrides) -> FigureWidget:
    """Sliders and dropdowns (N max, D, dtype, block_m, block_n, causal) over :func:`traffic_view`.

    ``overrides`` change the defaults of :func:`traffic_defaults` (e.g. ``B=1``); B and H stay fixed.
    """
    settings = _settings(traffic_defaults(), overrides, "traffic_widget")
    n_options = traffic.n_sweep(4 * settings["n_max"], 2 * TRAFFIC_N_MIN)  # up to 4× the default
    if settings["n_max"] not in n_options:
        raise ValueError(f"n_max must be a power of two >= {2 * TRAFFIC_N_MIN}, got {settings['n_max']}")
    controls = {
        "n_max": widgets.SelectionSlider(options=n_options, value=settings["n_max"], description="N max",
                                         continuous_update=False),
        "D": _dropdown(TRAFFIC_HEAD_DIMS, settings["D"], "D"),
        "dtype_bytes": _dropdown(TRAFFIC_DTYPES, settings["dtype_bytes"], "dtype"),
        "block_m": _dropdown(TRAFFIC_BLOCKS, settings["block_m"], "block_m"),
        "block_n": _dropdown(TRAFFIC_BLOCKS, settings["block_n"], "block_n"),
        "causal": widgets.Checkbox(value=settings["causal"], description="causal"),
    }
    rows = [["n_max", "dtype_bytes", "causal"], ["D", "block_m", "block_n"]]
    return FigureWidget(traffic_view, controls, rows, B=settings["B"], H=settings["H"])


# --- shared-memory bank conflicts (notebook 06) -----------------------------------------------

# this section's own imports, kept with the section
from flashattn.kernels.v2 import compute_padded_headdim  # noqa: E402
from flashattn.models.banks import column_read  # noqa: E402
from flashattn.models.layouts import TileLayout, pad_elements  # noqa: E402
from flashattn.teaching.bank_plots import plot_request  # noqa: E402

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


def bank_layout(D, dtype, layout, padding, swizzle, block_n=BANK_BLOCK_N) -> TileLayout:
    """The (block_n, D) K tile of the widget's settings as a :class:`flashattn.models.layouts.TileLayout`."""
    if dtype not in BANK_DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(BANK_DTYPES)}, got {dtype!r}")
    if layout not in ("row", "col"):
        raise ValueError(f"layout must be 'row' (v2) or 'col' (v2_kt), got {layout!r}")
    element_bytes = BANK_DTYPES[dtype]
    line = D if layout == "row" else block_n  # a stored line: a row of K, or a column for Kᵀ
    if padding == "double":
        stride = compute_padded_headdim(line)
    else:
        stride = line + pad_elements(padding, element_bytes)
    return TileLayout(block_n, D, element_bytes, layout, stride, swizzle_period=swizzle)


def bank_view(D, dtype, access_bytes, layout, padding, swizzle, block_n=BANK_BLOCK_N):
    """The pure computation behind :func:`bank_widget`: ``(figure, summary)``.

    One warp reads column 0 of the K tile (lane i reads key row i, or 4 keys per lane with 16-byte
    loads of the transposed tile); the figure colours the tile by bank and outlines what is read.
    ``summary``: ``wavefronts``, ``ideal``, ``conflict_ways``, ``layout`` and ``read`` (descriptions),
    ``text`` (one line). Raises ValueError for settings that cannot be (e.g. a misaligned vector load).
    """
    tile = bank_layout(D, dtype, layout, padding, swizzle, block_n)
    read = column_read(tile, 0, 0, access_bytes)
    req = read.analyze()
    fig = plot_request(read)
    summary = {
        "wavefronts": req.wavefronts, "ideal": req.ideal, "conflict_ways": req.conflict_ways,
        "layout": tile.name, "read": read.description,
        "text": f"{tile.name}; {read.description}: {req.describe()}",
    }
    return fig, summary


def bank_widget(**overrides) -> FigureWidget:
    """Dropdowns (D, dtype, access width, layout, padding, swizzle) over :func:`bank_view`.

    ``overrides`` change the defaults of :func:`bank_defaults`; a value no dropdown offers raises.
    """
    settings = _settings(bank_defaults(), overrides, "bank_widget")
    controls = {
        "D": _dropdown(BANK_HEAD_DIMS, settings["D"], "D"),
        "dtype": _dropdown(tuple(BANK_DTYPES), settings["dtype"], "dtype"),
        "access_bytes": _dropdown(BANK_ACCESS, settings["access_bytes"], "access"),
        "layout": _dropdown(BANK_LAYOUTS, settings["layout"], "layout"),
        "padding": _dropdown(BANK_PADDING, settings["padding"], "padding"),
        "swizzle": _dropdown(BANK_SWIZZLE, settings["swizzle"], "swizzle"),
    }
    for control in controls.values():
        control.continuous_update = False
    rows = [["D", "dtype", "access_bytes"], ["layout", "padding", "swizzle"]]
    return FigureWidget(bank_view, controls, rows)


# --- ring attention: the work per rank (notebook 16) ------------------------------------------

# this section's own imports, kept with the section
from flashattn.distributed import layouts as ring_layouts  # noqa: E402
from flashattn.teaching.ring_plots import plot_ownership, plot_work  # noqa: E402

RING_WORLD_SIZES = (2, 3, 4, 8)


def ring_work_defaults() -> dict:
    """Default widget settings: 4 ranks, the contiguous layout, causal, 8192 positions per rank, 128×128 tiles."""
    return dict(world_size=4, layout="contiguous", causal=True, n_local=8192, block=128)


def ring_work_view(world_size, layout, causal, n_local=8192, block=128):
    """The pure computation behind :func:`ring_work_widget`: ``(figure, summary)``. ``summary``: ``blocks`` (per
    rank), ``imbalance`` (the busiest rank's blocks / the mean: the ring waits for the busiest), ``text``."""
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(9.4, 4.0))
    plot_ownership(world_size, layout, ax=left)
    plot_work(world_size, layout, causal, n_local, block, ax=right)
    fig.tight_layout()
    blocks = [sum(row) for row in ring_layouts.work(world_size, layout, causal, n_local, block, block)]
    imbalance = max(blocks) / (sum(blocks) / len(blocks))
    text = (f"{layout}, W={world_size}, {'causal' if causal else 'no mask'}: key blocks per rank "
            f"{', '.join(map(str, blocks))}; the busiest rank does {imbalance:.2f}× the mean")
    return fig, {"blocks": blocks, "imbalance": imbalance, "text": text}


def ring_work_widget(**overrides) -> FigureWidget:
    """Dropdowns (ranks, layout) and a causal checkbox over :func:`ring_work_view`."""
    settings = _settings(ring_work_defaults(), overrides, "ring_work_widget")
    controls = {
        "world_size": _dropdown(RING_WORLD_SIZES, settings["world_size"], "ranks W"),
        "layout": _dropdown(ring_layouts.LAYOUTS, settings["layout"], "layout"),
        "causal": widgets.Checkbox(value=settings["causal"], description="causal"),
    }
    return FigureWidget(ring_work_view, controls, [["world_size", "layout", "causal"]], n_local=settings["n_local"],
                        block=settings["block"])


# --- the tiles a mask skips (notebook 14) -------------------------------------------------------

from flashattn.models import mask_tiles  # noqa: E402
from flashattn.teaching.schedule_plots import plot_tile_kinds  # noqa: E402

MASK_N = (512, 1024, 2048, 4096)
MASK_BLOCKS = (16, 32, 64, 128)
MASK_WINDOWS = (64, 128, 256, 512, 1024)
MASK_DOCUMENTS = (2, 3, 4, 6, 8, 16)
MASK_VALID = (0.25, 0.5, 0.6, 0.75, 0.9)


def mask_defaults() -> dict:
    """A sliding window of 256 keys at N = 2048 with fast's 128 × 64 tiles."""
    return dict(mask="sliding window", N=2048, block_m=128, block_n=64, window=256, documents=4, valid=0.6)


def mask_view(mask, N, block_m, block_n, window, documents, valid):
    """The pure computation behind :func:`mask_widget`: ``(figure, summary)``, the summary that of
    ``mask_tiles.tiles`` with a one-line ``text``."""
    kinds, found = mask_tiles.tiles(mask, N, block_m, block_n, window=window, documents=documents, valid=valid)
    fig = plot_tile_kinds(kinds, f"{mask}, N = {N}", block_m=block_m, block_n=block_n)
    text = (f"{mask}, N={N}, tiles {block_m}×{block_n}: {found['computed']} of {found['tiles']} tiles computed "
            f"({found['vs_dense']:.1%} of dense, {found['vs_causal']:.0%} of causal's), {found['partial']} of them "
            f"masked")
    if mask == "documents":
        text += f"; attention_varlen (blocks start at each document): {found['varlen_computed']} tiles"
    return fig, {**found, "text": text}


def mask_widget(**overrides) -> FigureWidget:
    """Dropdowns (mask, N, block_m, block_n, window, documents, valid fraction) over :func:`mask_view`."""
    s = _settings(mask_defaults(), overrides, "mask_widget")
    controls = {
        "mask": _dropdown(mask_tiles.MASKS, s["mask"], "mask"),
        "N": widgets.SelectionSlider(options=MASK_N, value=s["N"], description="N", continuous_update=False),
        "block_m": _dropdown(MASK_BLOCKS, s["block_m"], "block_m"),
        "block_n": _dropdown(MASK_BLOCKS, s["block_n"], "block_n"),
        "window": _dropdown(MASK_WINDOWS, s["window"], "window"),
        "documents": _dropdown(MASK_DOCUMENTS, s["documents"], "documents"),
        "valid": _dropdown(MASK_VALID, s["valid"], "valid keys"),
    }
    for control in controls.values():
        control.continuous_update = False
    rows = [["mask", "N"], ["block_m", "block_n"], ["window", "documents", "valid"]]
    return FigureWidget(mask_view, controls, rows)
