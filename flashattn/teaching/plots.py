"""The course's figures: one style, one colour and label per variant, and the charts the notebooks draw.

Every plotting function returns a matplotlib Figure (or draws on the axes it is given). Colours and
labels come from the variant registry (``flashattn.kernels.registry``), so a variant keeps its colour
from notebook to notebook, and a newly registered one has its own. ``save(fig, path)`` writes a PNG
without timestamps or version strings; the committed figures in ``figures/`` are written by
``python -m flashattn.teaching.figures`` (``make figures``), never by the notebooks.
"""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib.colors as mcolors
import matplotlib.pyplot as plt
import numpy as np
import torch

from flashattn.kernels import registry
from flashattn.models import roofline, traffic, tuning

SDPA_COLOR = "#000000"  # PyTorch's scaled_dot_product_attention, the baseline in every comparison
DEFAULT_COLOR = "#8c564b"

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


def colors() -> dict[str, str]:
    """Every registered variant's colour, and SDPA's."""
    return {**{name: registry.get(name).color for name in registry.names()}, "sdpa": SDPA_COLOR}


def color(name: str, default: str = DEFAULT_COLOR) -> str:
    """The colour of a variant (or "sdpa"); ``default`` for any other name."""
    return colors().get(name, default)


def legend_label(name: str) -> str:
    """The legend text of a variant (its registered label), or ``name`` itself."""
    return registry.get(name).label if name in registry.REGISTRY else name


def save(fig, path: Path) -> Path:
    """Write ``fig`` as a PNG at ``path`` with no varying metadata (same figure, same bytes)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png", metadata={"Software": None}, bbox_inches="tight")
    return path


def caption(ax, text: str) -> None:
    """A small grey provenance line under the axes (e.g. ``recorded.label(entry)``)."""
    ax.annotate(text, xy=(0, -0.16), xycoords="axes fraction", fontsize=7, color="#666666",
                ha="left", va="top")


use_style()


# --- traffic (notebooks 04, 05, 09) ----------------------------------------------------------------


def plot_traffic(N_values, D, dtype_bytes, block_m, block_n, B, H, causal=False,
                 variants=("naive", "v1", "v2")):
    """Bytes read (left) and written (right) per variant against N, both axes logarithmic.

    Returns a matplotlib Figure with one line per variant on each axis, labelled by :func:`legend_label`.
    """
    N_values = list(N_values)
    if not N_values:
        raise ValueError("N_values is empty")
    use_style()
    fig, (ax_read, ax_write) = plt.subplots(1, 2, figsize=(10, 4), sharex=True)
    problem = dict(D=D, dtype_bytes=dtype_bytes, block_m=block_m, block_n=block_n, B=B, H=H, causal=causal)
    for variant in variants:
        counts = [traffic.hbm_bytes(variant, N=n, **problem) for n in N_values]
        style = dict(color=color(variant), marker="o", markersize=3, label=legend_label(variant))
        ax_read.plot(N_values, [c["read"] for c in counts], **style)
        ax_write.plot(N_values, [c["write"] for c in counts], **style)
    for ax, what in ((ax_read, "read"), (ax_write, "written")):
        ax.set_xscale("log", base=2)
        ax.set_xticks(N_values, [str(n) for n in N_values], rotation=45 if len(N_values) > 6 else 0)
        ax.minorticks_off()
        ax.set_yscale("log")
        ax.set_xlabel("sequence length N")
        ax.set_ylabel(f"bytes {what} (model, no cache reuse)")
        ax.set_title(f"HBM bytes {what}")
    ax_read.legend()
    fig.suptitle(f"B={B} H={H} D={D}, {dtype_bytes}-byte elements, blocks {block_m}×{block_n}"
                 + (", causal" if causal else ""), fontsize=10)
    fig.tight_layout()
    return fig


def plot_measured_traffic(rows: list[dict], size: str = "large", caption_text: str | None = None):
    """Bars per variant (reads left, writes right): model request, L2 requests, DRAM, compulsory.

    Log scale; error rows are left out. A value of zero bytes has no bar on a log axis: a "0" at the
    bottom of the axis marks its place (a value that was not collected is left blank). Returns a
    matplotlib Figure.
    """
    from matplotlib.transforms import blended_transform_factory

    ok = [r for r in rows if r.get("size") == size and "error" not in r]
    if not ok:
        raise ValueError(f"no measured rows of size {size!r} without errors")
    use_style()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    series = (("model (request)", "model_kernels", None, "#c7c7c7"), ("L2 requests", "measured", "l2_", "#6baed6"),
              ("DRAM", "measured", "dram_", "#08519c"), ("compulsory", "compulsory", None, "#fdae6b"))
    width = 0.2
    for ax, op in zip(axes, ("read", "write"), strict=True):
        zeros = []
        for i, row in enumerate(ok):
            for j, (label, key, prefix, colour) in enumerate(series):
                value = row[key][prefix + op] if prefix else row[key][op]
                if value:
                    ax.bar(i + (j - 1.5) * width, value, width, color=colour, edgecolor="black", linewidth=0.5,
                           label=label if i == 0 else None)
                elif value == 0:
                    zeros.append((i + (j - 1.5) * width, colour))
        x_data_y_axes = blended_transform_factory(ax.transData, ax.transAxes)
        for x, colour in zeros:
            ax.text(x, 0.01, "0", transform=x_data_y_axes, ha="center", va="bottom", fontsize=8, fontweight="bold",
                    color=colour)
        ax.set_xticks(range(len(ok)), [f"{r['variant']}\nB={r['B']} H={r['H']}" for r in ok], fontsize=8)
        ax.set_yscale("log")
        ax.set_title(f"bytes {'read' if op == 'read' else 'written'} ({size} size, N={ok[0]['N']})"
                     + ("\n0 = zero bytes (no bar on a log axis)" if zeros else ""))
        ax.set_ylabel("bytes")
    axes[0].legend(fontsize=8)
    if caption_text:
        caption(axes[0], caption_text)
    fig.tight_layout()
    return fig


# --- the roofline and memory against N (notebooks 00, 02, 10) ------------------------------------

# Colours for roofline points that are not a variant of the course (the variants keep their own).
_OTHER_COLORS = ("#8c564b", "#e377c2", "#bcbd22", "#6b6ecf", "#ad494a")
_POINT_MARKERS = ("o", "s", "^", "D", "v", "P", "X")


def plot_roofline(points, hardware: dict, *, roofs=("float16", "float32_ieee"), ax=None, labels="annotate"):
    """A log-log roofline from the measured ceilings in ``hardware`` (``flashattn.hardware.hardware_numbers``).

    ``points``: dicts with ``label``, ``intensity`` (FLOP per byte of DRAM traffic), and optionally ``tflops``
    (a measured throughput, drawn filled), ``roof`` (a key of ``hardware["matmul_tflops"]``; a point without
    ``tflops`` is drawn hollow on that roof: the best the roofline allows), ``variant`` (its colour),
    ``marker`` and ``requested_intensity`` (FLOP per byte *requested*, counting no reuse: a dotted line is
    drawn from there to the point, the way the L2 cache moves it; ``flashattn.measure.dram`` makes such
    points). ``roofs``: which matmul rates to draw as compute roofs, each in its own line style, the memory
    roof solid. ``labels``: "annotate" (text next to each point) or "legend" (a legend of the points, right
    of the axes: for points that sit close together). Points at the same intensity
    are drawn side by side, each 10 % right of the one before. Returns the Figure.
    """
    if labels not in ("annotate", "legend"):
        raise ValueError(f"labels must be 'annotate' or 'legend', got {labels!r}")
    use_style()
    fig, ax = plt.subplots(figsize=(7.5, 4.5)) if ax is None else (ax.figure, ax)
    bw_tbps = hardware["copy_bandwidth_gbps"] / 1000
    peaks = {r: hardware["matmul_tflops"][r] for r in roofs if hardware["matmul_tflops"].get(r)}
    if not peaks:
        raise ValueError(f"none of the roofs {roofs} has a measured rate in hardware['matmul_tflops']")
    xs = [p["intensity"] for p in points] + [p["requested_intensity"] for p in points if p.get("requested_intensity")]
    xs += [roofline.ridge_point(v, bw_tbps) for v in peaks.values()]
    x_lo, x_hi = 10 ** math.floor(math.log10(min(xs) / 2)), 10 ** math.ceil(math.log10(max(xs) * 2))
    x = np.logspace(math.log10(x_lo), math.log10(x_hi), 200)

    top = max(peaks.values())
    x_mem = np.append(x[x < top / bw_tbps], top / bw_tbps)  # the sloped roof, up to the highest compute roof
    roof_lines = ax.plot(x_mem, np.minimum(x_mem * bw_tbps, top), color="#000000", lw=2.0, ls="-",
                         label=f"memory roof: HBM copy {bw_tbps:.2f} TB/s")
    for i, (name, peak) in enumerate(sorted(peaks.items(), key=lambda kv: -kv[1])):
        ridge = roofline.ridge_point(peak, bw_tbps)
        roof_lines += ax.plot([ridge, x_hi], [peak, peak], lw=1.5, ls=("--", ":", "-.")[i % 3], color="#555555",
                              label=f"compute roof: {roofline.ROOF_LABELS.get(name, name)} {peak:.0f} TFLOP/s "
                                    f"(ridge {ridge:.0f} FLOP/byte)")

    rank = {id(p): r for r, p in enumerate(sorted(points, key=lambda p: p["intensity"]))}
    point_lines, requested_line, drawn_at = [], None, []
    for i, p in enumerate(points):
        # points at the same intensity (within 2 %) are drawn side by side, 10 % apart, so that none hides another
        ties = sum(abs(math.log(p["intensity"] / other)) < 0.02 for other in drawn_at)
        drawn_at.append(p["intensity"])
        x_p = p["intensity"] * 1.1 ** ties
        colour = color(p.get("variant", p["label"]), default=_OTHER_COLORS[i % len(_OTHER_COLORS)])
        roof = p.get("roof", roofs[0])
        if p.get("tflops") is not None:
            y, style = p["tflops"], dict(color=colour)
        else:
            y = roofline.roofline(p["intensity"], hardware["matmul_tflops"][roof], bw_tbps)
            style = dict(markerfacecolor="white", markeredgecolor=colour)
        marker = p.get("marker", "o" if labels == "annotate" else _POINT_MARKERS[i % len(_POINT_MARKERS)])
        point_lines += ax.plot([x_p], [y], ls="none", marker=marker, markersize=7, label=p["label"], **style)
        if p.get("requested_intensity"):
            requested_line = ax.plot([p["requested_intensity"], x_p], [y, y], ls=":", lw=1, color=colour,
                                     marker="|", markevery=[0], markersize=8,
                                     label="by requested bytes (no reuse) → by DRAM bytes")[0]
        if labels == "annotate":
            below = rank[id(p)] % 2 == 0  # neighbours along the x axis get their labels on opposite sides
            ax.annotate(p["label"], (x_p, y), textcoords="offset points",
                        xytext=(6, -12) if below else (-6, 6), ha="left" if below else "right",
                        fontsize=8, color=colour)

    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(x_lo, x_hi)
    ax.set_ylim(top=top * 2)
    ax.set_xlabel("arithmetic intensity (FLOP per byte of DRAM traffic)")
    ax.set_ylabel("TFLOP/s")
    ax.set_title(f"Roofline of {hardware['name']}")
    extra = [requested_line] if requested_line is not None else []
    if labels == "legend":
        ax.add_artist(ax.legend(handles=roof_lines, loc="lower right", fontsize=8))
        ax.legend(handles=point_lines + extra, loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=8)
    else:
        ax.legend(handles=roof_lines + extra, loc="lower right", fontsize=8)
    caption(ax, hardware["label"])
    return fig


_MARKERS = {"naive": "o", "v1": "D", "v2": "s", "sdpa": "^"}


def plot_memory_vs_n(measurement: dict, *, variants=("naive", "v2", "sdpa"), memory_bytes: int | None = None,
                     label: str | None = None):
    """Peak memory (left) and time (right) against N, log-log, from a 'memory_vs_n' measurement.

    ``measurement`` has ``B``, ``H``, ``D``, ``dtype`` and ``rows`` (``variant``, ``N``, ``ms``,
    ``peak_bytes_above_inputs``, or ``oom``), as recorded or as ``flashattn.bench.memory_vs_n`` returns.
    Draws S + P as computed (dashed), an N² slope through naive's times, an ✕ where a variant ran out
    of memory, and ``memory_bytes`` (the GPU's memory) as a horizontal line. Returns the Figure.
    """
    use_style()
    B, H = measurement["B"], measurement["H"]
    dtype_bytes = getattr(torch, measurement["dtype"]).itemsize
    fig, (ax_mem, ax_time) = plt.subplots(1, 2, figsize=(11, 4.2))
    rows = [r for r in measurement["rows"] if r["variant"] in variants]
    all_n = sorted({r["N"] for r in rows})

    n_line = np.array(all_n, dtype=float)
    ax_mem.plot(n_line, [roofline.naive_intermediate_bytes(B, H, int(n), dtype_bytes)["total"] for n in n_line],
                ls="--", color="#999999", label="S + P (computed)")
    for name in variants:
        done = sorted((r for r in rows if r["variant"] == name and "oom" not in r), key=lambda r: r["N"])
        style = dict(color=color(name), marker=_MARKERS.get(name, "o"), markersize=5, label=legend_label(name),
                     ls="--" if name == "v2" else "-")
        if done:
            ax_mem.plot([r["N"] for r in done], [r["peak_bytes_above_inputs"] for r in done], **style)
            ax_time.plot([r["N"] for r in done], [r["ms"] for r in done], **style)
        for r in rows:
            if r["variant"] == name and "oom" in r:
                need = roofline.naive_intermediate_bytes(B, H, r["N"], dtype_bytes)["total"]
                ax_mem.plot([r["N"]], [need], marker="x", markersize=10, mew=2, ls="none", color=style["color"])
                ax_mem.annotate(f"{name}: out of memory at N={r['N']}", (r["N"], need), textcoords="offset points",
                                xytext=(-12, 0), ha="right", va="center", fontsize=8, color=style["color"])

    naive_done = sorted((r for r in rows if r["variant"] == "naive" and "oom" not in r), key=lambda r: r["N"])
    if len(naive_done) >= 2:
        last = naive_done[-1]
        ns = np.array([r["N"] for r in naive_done], dtype=float)
        ax_time.plot(ns, last["ms"] * (ns / last["N"]) ** 2, ls=":", color="#999999", label="slope N²")
    if memory_bytes:
        ax_mem.axhline(memory_bytes, color="#d62728", lw=1, ls="-.", label="GPU memory")

    for ax, ylabel, title in ((ax_mem, "bytes", "peak memory above the inputs"), (ax_time, "ms", "time")):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("sequence length N")
        ax.set_ylabel(ylabel)
        if ax is ax_mem:
            ax.set_ylim(top=ax.get_ylim()[1] * 100)  # headroom for the legend above the lines
        ax.set_title(title)
        ax.legend(fontsize=8, loc="upper left" if ax is ax_mem else "lower right")
    fig.suptitle(f"attention against N: B={B} H={H} D={measurement['D']} {measurement['dtype']}", fontsize=10)
    if label:
        caption(ax_mem, label)
    fig.tight_layout()
    return fig


# --- block sweeps (notebook 08) --------------------------------------------------------------------


def plot_sweep_heatmap(ax, rows: list[dict], title: str, value: str = "tflops", fmt: str = "{:.0f}"):
    """Draw ``flashattn.tuning.heatmap_table(rows)`` on ``ax``; failed cells are grey, 'smem' = out of shared memory."""
    table = tuning.heatmap_table(rows, value)
    data = np.array([[np.nan if v is None else v for v in line] for line in table["values"]], dtype=float)
    cmap = mcolors.LinearSegmentedColormap.from_list("tflops", ["#f7fbff", "#6baed6", "#08306b"]).with_extremes(
        bad="#d9d9d9")
    finite = data[np.isfinite(data)]
    vmax = float(finite.max()) if finite.size else 1.0
    image = ax.imshow(np.ma.masked_invalid(data), cmap=cmap, vmin=0, vmax=vmax, aspect="auto")
    best = tuning.best_row(rows)
    for i, line in enumerate(table["status"]):
        for j, st in enumerate(line):
            if st == "ok" and np.isfinite(data[i, j]):
                dark = data[i, j] > 0.6 * vmax
                is_best = best is not None and (best["block_m"], best["block_n"]) == table["tiles"][i] and \
                    (best["num_warps"], best["num_stages"]) == table["launch"][j]
                ax.text(j, i, fmt.format(data[i, j]) + ("★" if is_best else ""), ha="center", va="center",
                        fontsize=7, color="white" if dark else "black", fontweight="bold" if is_best else None)
            elif st:
                ax.text(j, i, "smem" if st == "smem" else "×", ha="center", va="center", fontsize=7, color="#b2182b")
    ax.set_xticks(range(len(table["col_labels"])), table["col_labels"], rotation=60, fontsize=7)
    ax.set_yticks(range(len(table["row_labels"])), table["row_labels"], fontsize=8)
    ax.set_xlabel("warps / pipeline stages")
    ax.set_ylabel("BLOCK_M × BLOCK_N")
    ax.set_title(title, fontsize=9)
    ax.grid(False)
    return image


def plot_block_sweeps(entries: dict, caption_text: str = ""):
    """The recorded block sweeps (``{name: entry}``) as heatmaps, two per row. Returns the Figure."""
    use_style()
    rows = math.ceil(len(entries) / 2)
    fig, axes = plt.subplots(rows, 2, figsize=(12, 4.5 * rows), squeeze=False)
    for ax, entry in zip(axes.flat, entries.values(), strict=False):
        r0 = entry["rows"][0]
        path = f"{r0['dtype']}{' ieee' if r0['dtype'] == 'float32' else ''}"
        image = plot_sweep_heatmap(ax, entry["rows"], f"{path}, D={r0['D']}, N={r0['N']}: TFLOP/s")
        fig.colorbar(image, ax=ax, shrink=0.8)
    for ax in list(axes.flat)[len(entries):]:
        ax.set_visible(False)
    fig.suptitle("v2 over block sizes, warps and stages" + (f" · {caption_text}" if caption_text else ""),
                 fontsize=8)
    fig.tight_layout()
    return fig


# --- the fast kernel against SDPA (notebook 10) ----------------------------------------------------


def plot_fast_vs_sdpa(table: dict, caption_text: str = ""):
    """TFLOP/s against N of SDPA and each benchmarked variant, one panel per (dtype, D, causal), from a
    ``fast_vs_sdpa`` measurement (``bench.compare`` rows and its ``variants``). Returns the Figure."""
    use_style()
    panels = sorted({(r["dtype"], r["D"], r["causal"]) for r in table["rows"]},
                    key=lambda p: (p[0] != "float16", p[1], p[2]))
    cols = 4
    fig, axes = plt.subplots(math.ceil(len(panels) / cols), cols, figsize=(14, 3 * math.ceil(len(panels) / cols)),
                             sharex=True, squeeze=False)
    for ax, (dtype, D, causal) in zip(axes.flat, panels, strict=False):
        rows = sorted((r for r in table["rows"] if (r["dtype"], r["D"], r["causal"]) == (dtype, D, causal)),
                      key=lambda r: r["N"])
        for name in ("sdpa", *table["variants"]):
            ax.plot([r["N"] for r in rows], [r["tflops"][name] for r in rows], marker="o", markersize=3,
                    label=legend_label(name), color=color(name))
        ax.set_xscale("log", base=2)
        ax.set_title(f"{dtype} D={D}{' causal' if causal else ''}", fontsize=9)
        ax.set_ylim(bottom=0)
    for ax in axes[-1]:
        ax.set_xlabel("N (B·N fixed)")
    for ax in axes[:, 0]:
        ax.set_ylabel("TFLOP/s")
    axes[0, 0].legend(fontsize=8)
    fig.suptitle(", ".join(table["variants"]) + " and PyTorch SDPA" + (f"; {caption_text}" if caption_text else ""),
                 fontsize=9)
    fig.tight_layout()
    return fig
