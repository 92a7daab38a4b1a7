"""The GPU's numbers, arithmetic intensity and the roofline.

* :func:`hardware_numbers` — the GPU's memory hierarchy sizes and its measured ceilings (copy
  bandwidth, matrix-multiply rates): measured live on a GPU, or read from the recorded GPU file.
* arithmetic intensity (FLOP per byte of HBM traffic) of a matrix multiply and of attention.
* :func:`roofline` — attainable throughput ``min(peak, intensity · bandwidth)``.
* figures: :func:`plot_roofline` and :func:`plot_memory_vs_n` (naive attention's O(N²) memory).

Units: bandwidth in GB/s and throughput in TFLOP/s where the names say so (``*_gbps``,
``*_tflops``); :func:`roofline` itself works in any consistent pair (FLOP/s with bytes/s, or
TFLOP/s with TB/s).
"""

from __future__ import annotations

import math

import numpy as np
import torch

from flashattn import bench, runtime
from flashattn.measure import recorded

# One register is 32 bits; a shared-memory bank serves 4 bytes per clock, and an SM has 32 banks.
REGISTER_BYTES = 4
SHARED_BYTES_PER_CLOCK_PER_SM = 32 * 4

# Which matrix-multiply rate is the compute roof for which input dtype of attention.
ROOF_FOR_DTYPE = {"float16": "float16", "bfloat16": "bfloat16", "float32": "float32_ieee"}
ROOF_LABELS = {
    "float16": "fp16 tensor cores",
    "bfloat16": "bf16 tensor cores",
    "float32_tf32": "fp32 via TF32 tensor cores",
    "float32_ieee": "fp32 on CUDA cores (IEEE)",
}


# --- the GPU's numbers ------------------------------------------------------------------------


def hardware_numbers(source: str | None = None, *, gpu: str | None = None) -> dict:
    """The memory hierarchy and the measured ceilings of the GPU in use, or of the recorded one.

    ``source``: ``"live"`` (measure now; needs GPU mode), ``"recorded"`` (read
    ``flashattn.recorded.get("device")``), or None: live in GPU mode, recorded otherwise.
    ``gpu`` picks a recorded file. The live numbers come from the same function that
    ``python -m flashattn.record`` runs (``flashattn.measurements.device``).

    Returns a dict with ``name``, ``source``, ``label`` (where the numbers come from),
    ``multiprocessors``, ``l2_cache_bytes``, ``shared_memory_per_sm_bytes``,
    ``shared_memory_per_block_optin_bytes``, ``registers_per_sm``, ``register_bytes_per_sm``,
    ``max_threads_per_sm``, ``total_memory_bytes``, ``max_sm_clock_mhz`` (or None),
    ``copy_bandwidth_gbps`` (bytes read + written per second by a device-to-device copy, in GB/s),
    ``matmul_tflops`` (``{"float16", "bfloat16", "float32_tf32", "float32_ieee"}`` → TFLOP/s, None
    where the GPU could not run it) and ``matmul_shape``.
    """
    if source is None:
        source = "live" if runtime.MODE == "gpu" else "recorded"
    if source == "recorded":
        return _recorded_numbers(gpu)
    if source == "live":
        if runtime.MODE != "gpu":
            raise RuntimeError("hardware_numbers('live') needs GPU mode; in interpreter mode use "
                               "source='recorded' (the recorded GPU results)")
        from flashattn.measure.measurements.core import device

        entry = device()
        return _hardware_dict(entry["properties"], entry["copy_bandwidth_gbps"], entry["matmul"], source="live",
                              label=f"measured live on {entry['properties']['name']} (torch {torch.__version__})")
    raise ValueError(f"source must be 'live', 'recorded' or None, got {source!r}")


def _as_number(value):
    """Recorded clocks come from nvidia-smi as strings ('1980'); None or '[N/A]' stay None."""
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _hardware_dict(props: dict, copy_gbps: float, matmul: dict, *, source: str, label: str) -> dict:
    regs = props.get("registers_per_sm")
    return {
        "name": props.get("name"),
        "source": source,
        "label": label,
        "multiprocessors": props.get("multiprocessors"),
        "l2_cache_bytes": props.get("l2_cache_bytes"),
        "shared_memory_per_sm_bytes": props.get("shared_memory_per_sm_bytes"),
        "shared_memory_per_block_optin_bytes": props.get("shared_memory_per_block_optin_bytes"),
        "registers_per_sm": regs,
        "register_bytes_per_sm": None if regs is None else regs * REGISTER_BYTES,
        "max_threads_per_sm": props.get("max_threads_per_sm"),
        "total_memory_bytes": props.get("total_memory_bytes"),
        "max_sm_clock_mhz": _as_number(props.get("max_sm_clock_mhz")),
        "copy_bandwidth_gbps": copy_gbps,
        "matmul_tflops": {name: (m or {}).get("tflops") for name, m in matmul.items()},
        "matmul_shape": next((m["shape"] for m in matmul.values() if m and "shape" in m), None),
    }


def _recorded_numbers(gpu: str | None) -> dict:
    entry = recorded.get("device", gpu)
    return _hardware_dict(entry["properties"], entry["copy_bandwidth_gbps"], entry["matmul"],
                          source="recorded", label=recorded.label(entry))


def hierarchy_rows(hw: dict) -> list[dict]:
    """The memory hierarchy, slowest and largest first, from :func:`hardware_numbers`.

    Each row: ``level``, ``per_sm`` and ``total`` (bytes, None where it does not apply),
    ``bandwidth_gbps`` (None where not known) and ``note`` (how the bandwidth was obtained).
    Shared-memory bandwidth is derived, not measured: 32 banks × 4 bytes per clock per SM at the
    maximum SM clock.
    """
    sms = hw["multiprocessors"]
    smem = hw["shared_memory_per_sm_bytes"]
    regs = hw["register_bytes_per_sm"]
    clock = hw.get("max_sm_clock_mhz")
    smem_gbps = None if clock is None else SHARED_BYTES_PER_CLOCK_PER_SM * sms * clock * 1e6 / 1e9

    def whole_gpu(per_sm):  # an older torch may not report a property: leave it unknown
        return None if per_sm is None else per_sm * sms

    return [
        {"level": "HBM (global memory)", "per_sm": None, "total": hw["total_memory_bytes"],
         "bandwidth_gbps": hw["copy_bandwidth_gbps"], "note": "measured: device-to-device copy"},
        {"level": "L2 cache", "per_sm": None, "total": hw["l2_cache_bytes"],
         "bandwidth_gbps": None, "note": "shared by all SMs; not measured here"},
        {"level": "shared memory (part of each SM's L1)", "per_sm": smem, "total": whole_gpu(smem),
         "bandwidth_gbps": smem_gbps,
         "note": "derived: 32 banks × 4 B per clock per SM × SMs × max clock" if clock else "no clock known"},
        {"level": "registers", "per_sm": regs, "total": whole_gpu(regs), "bandwidth_gbps": None,
         "note": f"{hw['registers_per_sm']} 32-bit registers per SM; operands of every instruction"},
    ]


def format_bytes(n) -> str:
    """Binary units for capacities: ``232448 -> '227.0 KiB'``; None -> '—'."""
    if n is None:
        return "—"
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def hierarchy_markdown(hw: dict) -> str:
    """:func:`hierarchy_rows` as a Markdown table (for ``IPython.display.Markdown``)."""
    lines = ["| level | per SM | whole GPU | bandwidth | how we know the bandwidth |",
             "| --- | --- | --- | --- | --- |"]
    for r in hierarchy_rows(hw):
        bw = "—" if r["bandwidth_gbps"] is None else f"{r['bandwidth_gbps'] / 1000:.1f} TB/s"
        lines.append(f"| {r['level']} | {format_bytes(r['per_sm'])} | {format_bytes(r['total'])} | {bw} "
                     f"| {r['note']} |")
    return "\n".join(lines)


# --- arithmetic intensity ---------------------------------------------------------------------


def intensity(flops: float, bytes_moved: float) -> float:
    """Arithmetic intensity: FLOP per byte of memory traffic."""
    if bytes_moved <= 0:
        raise ValueError(f"bytes_moved must be positive, got {bytes_moved}")
    return flops / bytes_moved


def matmul_flops(M: int, N: int, K: int) -> float:
    """C (M×N) = A (M×K) · B (K×N): M·N·K multiply-adds, 2 FLOP each."""
    return 2.0 * M * N * K


def matmul_bytes(M: int, N: int, K: int, dtype_bytes: int) -> float:
    """The least HBM traffic of a matmul: read A and B once, write C once."""
    return float(M * K + K * N + M * N) * dtype_bytes


def matmul_intensity(M: int, N: int, K: int, dtype_bytes: int) -> float:
    return intensity(matmul_flops(M, N, K), matmul_bytes(M, N, K, dtype_bytes))


def gpu_default_blocks(variant: str, dtype: str = "float16", D: int = 64) -> tuple[int, int]:
    """(block_m, block_n) that ``variant`` uses on a GPU by default, read from its kernel module.

    The kernels' ``default_options`` choose smaller blocks in interpreter mode; a roofline is about a
    GPU, so this asks for the GPU choice whatever the current mode.
    """
    from flashattn.kernels import launch_tiles

    tiles = launch_tiles(variant, dtype, D)
    return tiles["block_m"], tiles["block_n"]


def attention_bytes(variant: str, *, B: int, H: int, N: int, D: int, dtype_bytes: int,
                    block_m: int | None = None, block_n: int | None = None, causal: bool = False) -> int:
    """HBM bytes (read + written) of one attention forward pass.

    ``variant``: ``"minimum"`` (read Q, K, V once and write O once: no kernel can do less) or a
    kernel of the course (``naive``, ``v1``, ``v2``, ...), counted by ``flashattn.traffic.hbm_bytes``
    at ``block_m``/``block_n`` (default: the variant's GPU block sizes).
    """
    if variant == "minimum":
        return 4 * B * H * N * D * dtype_bytes
    from flashattn.models import traffic

    if block_m is None or block_n is None:
        dtype = {2: "float16", 4: "float32"}.get(dtype_bytes, "float16")
        default_m, default_n = gpu_default_blocks(variant, dtype, D)
        block_m, block_n = block_m or default_m, block_n or default_n
    counts = traffic.hbm_bytes(variant, B=B, H=H, N=N, D=D, dtype_bytes=dtype_bytes,
                               block_m=block_m, block_n=block_n, causal=causal)
    return counts["read"] + counts["write"]


def attention_intensity(variant: str, *, B: int, H: int, N: int, D: int, dtype_bytes: int,
                        block_m: int | None = None, block_n: int | None = None, causal: bool = False) -> float:
    """FLOP per HBM byte of attention: ``bench.attention_flops`` over :func:`attention_bytes`."""
    flops = bench.attention_flops(B, H, N, D, causal)
    return intensity(flops, attention_bytes(variant, B=B, H=H, N=N, D=D, dtype_bytes=dtype_bytes,
                                            block_m=block_m, block_n=block_n, causal=causal))


# --- the roofline -----------------------------------------------------------------------------


def roofline(intensity, peak_flops, bandwidth):
    """Attainable throughput: ``min(peak_flops, intensity · bandwidth)`` (scalar or array).

    Units must agree: TFLOP/s with TB/s gives TFLOP/s; FLOP/s with bytes/s gives FLOP/s.
    """
    attainable = np.minimum(peak_flops, np.asarray(intensity, dtype=float) * bandwidth)
    return float(attainable) if np.ndim(attainable) == 0 else attainable


def ridge_point(peak_flops, bandwidth) -> float:
    """The intensity (FLOP/byte) where the memory roof meets the compute roof."""
    return peak_flops / bandwidth


def bound(intensity, peak_flops, bandwidth) -> str:
    """``"memory"`` left of the ridge point, ``"compute"`` at or right of it."""
    return "memory" if intensity < ridge_point(peak_flops, bandwidth) else "compute"


# Colours for points that are not a variant of the course (those keep plots.COLORS).
_OTHER_COLORS = ("#8c564b", "#e377c2", "#bcbd22", "#6b6ecf", "#ad494a")


def plot_roofline(points, hardware: dict, *, roofs=("float16", "float32_ieee"), ax=None):
    """A log-log roofline from the measured ceilings in ``hardware`` (:func:`hardware_numbers`).

    ``points``: dicts with ``label``, ``intensity`` (FLOP/byte), and optionally ``tflops`` (a
    measured throughput, drawn filled) and ``roof`` (a key of ``hardware["matmul_tflops"]``; a
    point without ``tflops`` is drawn hollow on that roof: the best the roofline allows).
    ``roofs``: which matmul rates to draw as compute roofs. Returns the Figure.
    """
    import matplotlib.pyplot as plt

    from flashattn.teaching import plots

    plots.use_style()
    fig, ax = plt.subplots(figsize=(7.5, 4.5)) if ax is None else (ax.figure, ax)
    bw_tbps = hardware["copy_bandwidth_gbps"] / 1000
    peaks = {r: hardware["matmul_tflops"][r] for r in roofs if hardware["matmul_tflops"].get(r)}
    if not peaks:
        raise ValueError(f"none of the roofs {roofs} has a measured rate in hardware['matmul_tflops']")
    xs = [p["intensity"] for p in points] + [ridge_point(v, bw_tbps) for v in peaks.values()]
    x_lo, x_hi = 10 ** math.floor(math.log10(min(xs) / 2)), 10 ** math.ceil(math.log10(max(xs) * 2))
    x = np.logspace(math.log10(x_lo), math.log10(x_hi), 200)

    top = max(peaks.values())
    ax.plot(x, np.minimum(x * bw_tbps, top), color="#444444", lw=1.5,
            label=f"memory roof: HBM copy {bw_tbps:.2f} TB/s")
    for i, (name, peak) in enumerate(sorted(peaks.items(), key=lambda kv: -kv[1])):
        ridge = ridge_point(peak, bw_tbps)
        ax.plot([ridge, x_hi], [peak, peak], lw=1.5, ls=("-", "--", ":", "-.")[i % 4], color="#444444",
                label=f"compute roof: {ROOF_LABELS.get(name, name)} {peak:.0f} TFLOP/s")

    rank = {id(p): r for r, p in enumerate(sorted(points, key=lambda p: p["intensity"]))}
    for i, p in enumerate(points):
        below = rank[id(p)] % 2 == 0  # neighbours along the x axis get their labels on opposite sides
        colour = plots.color(p["label"]) if p["label"] in plots.COLORS else _OTHER_COLORS[i % len(_OTHER_COLORS)]
        roof = p.get("roof", roofs[0])
        if p.get("tflops") is not None:
            y, style = p["tflops"], dict(color=colour, marker="o")
        else:
            y = roofline(p["intensity"], hardware["matmul_tflops"][roof], bw_tbps)
            style = dict(markerfacecolor="white", markeredgecolor=colour, marker="o")
        ax.plot([p["intensity"]], [y], ls="none", markersize=7, **style)
        ax.annotate(p["label"], (p["intensity"], y), textcoords="offset points",
                    xytext=(6, -12) if below else (-6, 6), ha="left" if below else "right",
                    fontsize=8, color=colour)

    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(x_lo, x_hi)
    ax.set_ylim(top=top * 2)
    ax.set_xlabel("arithmetic intensity (FLOP per byte of HBM traffic)")
    ax.set_ylabel("TFLOP/s")
    ax.set_title(f"Roofline of {hardware['name']}")
    ax.legend(loc="lower right", fontsize=8)
    plots.caption(ax, hardware["label"])
    return fig


# --- naive attention's O(N²) memory -----------------------------------------------------------


def naive_intermediate_bytes(B: int, H: int, N: int, dtype_bytes: int) -> dict:
    """Bytes of the naive kernels' N×N buffers: S in float32, P in the input dtype."""
    s = B * H * N * N * 4
    p = B * H * N * N * dtype_bytes
    return {"S": s, "P": p, "total": s + p}


def naive_oom_n(memory_bytes: int, B: int, H: int, D: int, dtype_bytes: int) -> int:
    """The smallest power-of-two N at which q, k, v, o, S and P no longer fit in ``memory_bytes``."""
    n = 1
    while 4 * B * H * n * D * dtype_bytes + naive_intermediate_bytes(B, H, n, dtype_bytes)["total"] <= memory_bytes:
        n *= 2
    return n


def _measure_call(fn, q, k, v) -> dict:
    def run():
        return fn(q, k, v, causal=False)

    return {"peak_bytes_above_inputs": bench.peak_memory(run), "ms": bench.time_ms(run)}


def measure_memory_vs_n(N_values, variants=("naive", "v2", "sdpa"), *, B: int, H: int, D: int,
                        dtype=torch.float16) -> dict:
    """Time and peak memory of each variant against N, live on the GPU (recorded 'memory_vs_n' format).

    Peak memory is ``bench.peak_memory`` (above the inputs), time is ``bench.time_ms``. A variant that
    runs out of memory gets a row with ``"oom"`` and is not run at larger N.
    """
    from flashattn.kernels import VARIANTS

    rows, stopped = [], set()
    for N in N_values:
        q, k, v = runtime.random_qkv(B, H, N, D, dtype=dtype, seed_value=N)
        for name in variants:
            if name in stopped:
                continue
            if name != "sdpa" and name not in VARIANTS:
                raise ValueError(f"unknown variant {name!r}; accepted: sdpa, {', '.join(VARIANTS)}")
            fn = bench.sdpa if name == "sdpa" else VARIANTS[name]
            row = {"variant": name, "N": N, "input_bytes": 3 * q.numel() * q.element_size(),
                   "output_bytes": q.numel() * q.element_size()}
            try:
                row.update(_measure_call(fn, q, k, v))
            except torch.cuda.OutOfMemoryError as err:
                row["oom"] = str(err).splitlines()[0]
                stopped.add(name)
            torch.cuda.empty_cache()
            rows.append(row)
    return {"B": B, "H": H, "D": D, "dtype": str(dtype).replace("torch.", ""), "causal": False, "rows": rows}


_MARKERS = {"naive": "o", "v1": "D", "v2": "s", "sdpa": "^"}


def plot_memory_vs_n(measurement: dict, *, variants=("naive", "v2", "sdpa"), memory_bytes: int | None = None,
                     label: str | None = None):
    """Peak memory (left) and time (right) against N, log-log, from a 'memory_vs_n' measurement.

    ``measurement`` has ``B``, ``H``, ``D``, ``dtype`` and ``rows`` (``variant``, ``N``, ``ms``,
    ``peak_bytes_above_inputs``, or ``oom``), as recorded or as :func:`measure_memory_vs_n` returns.
    Draws S + P as computed (dashed), an N² slope through naive's times, an ✕ where a variant ran out
    of memory, and ``memory_bytes`` (the GPU's memory) as a horizontal line. Returns the Figure.
    """
    import matplotlib.pyplot as plt

    from flashattn.teaching import plots

    plots.use_style()
    B, H = measurement["B"], measurement["H"]
    dtype_bytes = torch.empty(0, dtype=getattr(torch, measurement["dtype"])).element_size()
    fig, (ax_mem, ax_time) = plt.subplots(1, 2, figsize=(11, 4.2))
    rows = [r for r in measurement["rows"] if r["variant"] in variants]
    all_n = sorted({r["N"] for r in rows})

    n_line = np.array(all_n, dtype=float)
    ax_mem.plot(n_line, [naive_intermediate_bytes(B, H, int(n), dtype_bytes)["total"] for n in n_line],
                ls="--", color="#999999", label="S + P (computed)")
    for name in variants:
        done = sorted((r for r in rows if r["variant"] == name and "oom" not in r), key=lambda r: r["N"])
        style = dict(color=plots.color(name), marker=_MARKERS.get(name, "o"), markersize=5, label=name,
                     ls="--" if name == "v2" else "-")
        if done:
            ax_mem.plot([r["N"] for r in done], [r["peak_bytes_above_inputs"] for r in done], **style)
            ax_time.plot([r["N"] for r in done], [r["ms"] for r in done], **style)
        for r in rows:
            if r["variant"] == name and "oom" in r:
                need = naive_intermediate_bytes(B, H, r["N"], dtype_bytes)["total"]
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
        plots.caption(ax_mem, label)
    fig.tight_layout()
    return fig
