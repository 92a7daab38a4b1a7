"""flashattn.plots: the course's colours and labels (from the variant registry) and its charts."""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from helpers import toy_hardware  # noqa: E402

from flashattn import hardware, plots, recorded, roofline  # noqa: E402
from flashattn.kernels import registry  # noqa: E402


def test_every_variant_has_its_own_colour_and_sdpa_is_black():
    colors = plots.colors()
    assert set(colors) == {*registry.names(), "sdpa"} and colors["sdpa"] == plots.SDPA_COLOR
    assert len(set(colors.values())) == len(colors)
    assert plots.color("v2") == registry.get("v2").color and plots.color("not a variant") == plots.DEFAULT_COLOR
    assert plots.legend_label("v2_kt") == "v2_kt" and plots.legend_label("sdpa") == "sdpa"


def test_save_writes_the_same_bytes_twice(tmp_path):
    fig, ax = plt.subplots()
    ax.plot([1, 2, 3], [3, 1, 2], color=plots.color("v1"))
    first = plots.save(fig, tmp_path / "a.png").read_bytes()
    second = plots.save(fig, tmp_path / "sub" / "b.png").read_bytes()
    assert first == second and first.startswith(b"\x89PNG")
    plt.close(fig)


def _points():
    return [{"label": "matmul", "intensity": 500.0, "tflops": 80.0},
            {"label": "naive", "intensity": 5.0},
            {"label": "fp32 thing", "intensity": 2.0, "roof": "float32_ieee"}]


def test_plot_roofline_draws_the_roofs_and_the_points():
    hw = toy_hardware()
    fig = plots.plot_roofline(_points(), hw)
    ax = fig.axes[0]
    assert ax.get_xscale() == "log" and ax.get_yscale() == "log"
    lines = ax.get_lines()
    assert len(lines) == 1 + 2 + 3  # memory roof, two compute roofs, three points
    memory, *roofs = lines[:3]
    x, y = memory.get_data()
    np.testing.assert_allclose(y, np.minimum(x * 2.0, 100.0))  # 2000 GB/s = 2 TB/s, capped at the top roof
    assert sorted(line.get_ydata()[0] for line in roofs) == [10.0, 100.0]
    points = lines[3:]
    assert points[0].get_ydata()[0] == 80.0  # measured: drawn where it was measured
    assert points[1].get_ydata()[0] == pytest.approx(10.0)  # on the fp16 roof: min(100, 5 × 2)
    assert points[2].get_ydata()[0] == pytest.approx(4.0)  # on the fp32 roof: min(10, 2 × 2)
    assert points[1].get_markerfacecolor() == "white"  # predicted points are hollow
    assert [t.get_text() for t in ax.texts if t.get_text() in ("matmul", "naive", "fp32 thing")] == [
        "matmul", "naive", "fp32 thing"]
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert "memory roof: HBM copy 2.00 TB/s" in legend
    assert any("toy numbers" in t.get_text() for t in ax.texts)  # the provenance caption
    plt.close(fig)


def test_plot_roofline_with_the_recorded_hardware_and_no_usable_roof():
    hw = hardware.hardware_numbers("recorded")
    fig = plots.plot_roofline(_points(), hw)
    assert hw["name"] in fig.axes[0].get_title()
    plt.close(fig)
    with pytest.raises(ValueError, match="roofs"):
        plots.plot_roofline(_points(), toy_hardware(), roofs=("bfloat16",))


def test_plot_memory_vs_n_from_the_recorded_rows():
    m = recorded.get("memory_vs_n")
    memory = recorded.get("device")["properties"]["total_memory_bytes"]
    fig = plots.plot_memory_vs_n(m, memory_bytes=memory, label=recorded.label(m))
    ax_mem, ax_time = fig.axes
    for ax in (ax_mem, ax_time):
        assert ax.get_xscale() == "log" and ax.get_yscale() == "log"
    mem_labels = [line.get_label() for line in ax_mem.get_lines()]
    assert {"naive", "v2", "sdpa", "S + P (computed)", "GPU memory"} <= set(mem_labels)
    oom_n = min(r["N"] for r in m["rows"] if r["variant"] == "naive" and "oom" in r)
    assert any(t.get_text() == f"naive: out of memory at N={oom_n}" for t in ax_mem.texts)
    slope = next(line for line in ax_time.get_lines() if line.get_label() == "slope N²")
    x, y = (np.asarray(a, dtype=float) for a in slope.get_data())
    assert np.diff(np.log(y)) / np.diff(np.log(x)) == pytest.approx(2.0)
    naive = next(line for line in ax_time.get_lines() if line.get_label() == "naive")
    assert y[-1] == pytest.approx(naive.get_ydata()[-1])  # the slope goes through naive's last point
    plt.close(fig)


def test_plot_memory_vs_n_marks_the_oom_point_at_the_computed_bytes():
    rows = [{"variant": "naive", "N": n, "ms": n * n * 1e-6, "peak_bytes_above_inputs": 6 * n * n}
            for n in (64, 128)]
    rows.append({"variant": "naive", "N": 256, "oom": "CUDA out of memory"})
    rows.append({"variant": "v2", "N": 256, "ms": 0.1, "peak_bytes_above_inputs": 1000})
    fig = plots.plot_memory_vs_n({"B": 1, "H": 1, "D": 16, "dtype": "float16", "rows": rows})
    ax_mem = fig.axes[0]
    cross = [line for line in ax_mem.get_lines() if line.get_marker() == "x"]
    assert len(cross) == 1
    assert cross[0].get_xdata()[0] == 256
    assert cross[0].get_ydata()[0] == roofline.naive_intermediate_bytes(1, 1, 256, 2)["total"]
    assert not any(line.get_label() == "GPU memory" for line in ax_mem.get_lines())
    plt.close(fig)
