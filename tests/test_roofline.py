"""flashattn.roofline: the hardware numbers, arithmetic intensity, the roofline and its figures."""

import matplotlib
import numpy as np
import pytest
import torch

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402

from flashattn import bench, recorded, roofline, runtime, traffic  # noqa: E402
from flashattn.kernels import naive as naive_module  # noqa: E402

# --- arithmetic intensity, worked by hand --------------------------------------------------------


def test_matmul_flops_bytes_intensity_by_hand():
    # 3×7 times 7×5: 105 multiply-adds = 210 FLOP; A 21, B 35, C 15 elements of 4 bytes = 284 bytes
    assert roofline.matmul_flops(3, 5, 7) == 210
    assert roofline.matmul_bytes(3, 5, 7, 4) == 284
    assert roofline.matmul_intensity(3, 5, 7, 4) == pytest.approx(210 / 284)


def test_square_matmul_intensity_is_n_over_3_in_fp16():
    # 2n³ FLOP over 3n² elements × 2 bytes = n/3
    for n in (48, 4096, 8193):
        assert roofline.matmul_intensity(n, n, n, 2) == pytest.approx(n / 3)


def test_intensity_rejects_zero_bytes():
    with pytest.raises(ValueError, match="bytes_moved"):
        roofline.intensity(1.0, 0)


def test_roofline_is_min_of_the_two_roofs():
    assert roofline.roofline(10.0, 660.0, 4.25) == pytest.approx(42.5)  # memory-bound
    assert roofline.roofline(1000.0, 660.0, 4.25) == pytest.approx(660.0)  # compute-bound
    out = roofline.roofline(np.array([1.0, 100.0, 1e4]), 50.0, 2.0)
    np.testing.assert_allclose(out, [2.0, 50.0, 50.0])
    assert isinstance(roofline.roofline(3.0, 50.0, 2.0), float)


def test_ridge_point_and_bound():
    assert roofline.ridge_point(660.0, 4.4) == pytest.approx(150.0)
    assert roofline.bound(149.0, 660.0, 4.4) == "memory"
    assert roofline.bound(150.0, 660.0, 4.4) == "compute"


def test_minimum_attention_intensity_is_n_over_dtype_bytes():
    # 4·B·H·N²·D FLOP over 4 tensors of B·H·N·D·b bytes = N / b
    for B, H, N, D, b in ((1, 1, 8, 4, 2), (2, 3, 1000, 64, 4), (1, 16, 4096, 128, 2)):
        assert roofline.attention_intensity("minimum", B=B, H=H, N=N, D=D, dtype_bytes=b) == pytest.approx(N / b)
    causal = roofline.attention_intensity("minimum", B=1, H=1, N=8, D=4, dtype_bytes=2, causal=True)
    assert causal == pytest.approx(2.0)  # half the FLOP, same bytes


def test_v2_attention_bytes_and_intensity_by_hand():
    # B=2 H=3 N=256 D=64 fp16, blocks 128×64: X = 196608; Tr = 2; read = X + 2·(X + X), write = X
    X = 2 * 3 * 256 * 64 * 2
    got = roofline.attention_bytes("v2", B=2, H=3, N=256, D=64, dtype_bytes=2, block_m=128, block_n=64)
    assert got == 6 * X
    flops = 4 * 2 * 3 * 256**2 * 64
    assert roofline.attention_intensity("v2", B=2, H=3, N=256, D=64, dtype_bytes=2, block_m=128,
                                        block_n=64) == pytest.approx(flops / (6 * X))


def test_naive_attention_bytes_by_hand():
    # B=H=1 N=64 D=16 float32, blocks 32×32: X = 4096, Tr = Tc = 2, S = P = 64²·4 = 16384
    # read = Tc·X (Q) + Tr·X (K) + Tr·X (V) + 3·S + P ; write = S + P + X
    X, S, P = 4096, 16384, 16384
    expected = (2 * X + 2 * X + 2 * X + 3 * S + P) + (S + P + X)
    assert roofline.attention_bytes("naive", B=1, H=1, N=64, D=16, dtype_bytes=4, block_m=32, block_n=32) == expected


def test_attention_bytes_defaults_to_the_gpu_block_sizes():
    for variant in ("naive", "v1", "v2"):
        bm, bn = roofline.gpu_default_blocks(variant, "float16", 64)
        counts = traffic.hbm_bytes(variant, B=2, H=2, N=300, D=64, dtype_bytes=2, block_m=bm, block_n=bn)
        got = roofline.attention_bytes(variant, B=2, H=2, N=300, D=64, dtype_bytes=2)
        assert got == counts["read"] + counts["write"]


def test_gpu_default_blocks_ask_for_the_gpu_choice():
    from flashattn.kernels import default_options

    assert roofline.gpu_default_blocks("v2", "float16", 64) == (128, 64)
    assert roofline.gpu_default_blocks("v2_padded", "float16", 64) == (64, 64)
    assert default_options("v2", torch.float16, 64, mode="interpreter")["block_m"] == 64
    assert default_options("v1", torch.float32, 64, mode="gpu")["num_warps"] == 8
    with pytest.raises(ValueError, match="unknown variant"):
        roofline.gpu_default_blocks("v9")


def test_fused_attention_has_higher_intensity_than_naive():
    kw = dict(B=4, H=16, N=4096, D=64, dtype_bytes=2)
    naive, v2, minimum = (roofline.attention_intensity(v, **kw) for v in ("naive", "v2", "minimum"))
    assert naive < v2 < minimum


# --- hardware numbers --------------------------------------------------------------------------


def test_hardware_numbers_recorded_reads_the_recorded_file():
    entry = recorded.get("device")
    hw = roofline.hardware_numbers("recorded")
    props = entry["properties"]
    assert hw["source"] == "recorded"
    assert hw["label"] == recorded.label(entry)
    assert hw["name"] == props["name"]
    for key in ("multiprocessors", "l2_cache_bytes", "shared_memory_per_sm_bytes",
                "shared_memory_per_block_optin_bytes", "registers_per_sm", "total_memory_bytes"):
        assert hw[key] == props[key]
    assert hw["register_bytes_per_sm"] == 4 * props["registers_per_sm"]
    assert hw["max_sm_clock_mhz"] == float(props["max_sm_clock_mhz"])
    assert hw["copy_bandwidth_gbps"] == entry["copy_bandwidth_gbps"]
    assert hw["matmul_tflops"] == {k: v["tflops"] for k, v in entry["matmul"].items()}
    assert hw["matmul_shape"] == next(iter(entry["matmul"].values()))["shape"]


@pytest.mark.skipif(runtime.MODE == "gpu", reason="the interpreter-mode default")
def test_hardware_numbers_default_and_live_in_interpreter_mode():
    assert roofline.hardware_numbers()["source"] == "recorded"
    with pytest.raises(RuntimeError, match="GPU mode"):
        roofline.hardware_numbers("live")


def test_hardware_numbers_rejects_an_unknown_source():
    with pytest.raises(ValueError, match="source"):
        roofline.hardware_numbers("guess")


def _toy_hardware(clock=1000.0):
    return {"name": "Toy GPU", "label": "toy numbers", "multiprocessors": 2, "l2_cache_bytes": 4096,
            "shared_memory_per_sm_bytes": 1024, "registers_per_sm": 100, "register_bytes_per_sm": 400,
            "total_memory_bytes": 3 * 2**30, "max_sm_clock_mhz": clock, "copy_bandwidth_gbps": 2000.0,
            "matmul_tflops": {"float16": 100.0, "float32_ieee": 10.0, "bfloat16": None}}


def test_hierarchy_rows_by_hand():
    rows = roofline.hierarchy_rows(_toy_hardware())
    assert [r["level"].split()[0] for r in rows] == ["HBM", "L2", "shared", "registers"]
    hbm, l2, smem, regs = rows
    assert hbm["total"] == 3 * 2**30 and hbm["bandwidth_gbps"] == 2000.0
    assert l2["total"] == 4096 and l2["bandwidth_gbps"] is None
    assert smem["per_sm"] == 1024 and smem["total"] == 2048
    assert smem["bandwidth_gbps"] == pytest.approx(128 * 2 * 1000e6 / 1e9)  # 128 B/clock/SM × 2 SMs × 1 GHz
    assert regs["per_sm"] == 400 and regs["total"] == 800
    assert roofline.hierarchy_rows(_toy_hardware(clock=None))[2]["bandwidth_gbps"] is None
    unknown = {**_toy_hardware(), "shared_memory_per_sm_bytes": None, "register_bytes_per_sm": None}
    assert [r["total"] for r in roofline.hierarchy_rows(unknown)[2:]] == [None, None]
    assert "| — | — |" in roofline.hierarchy_markdown(unknown)


def test_hierarchy_markdown_has_a_row_per_level():
    text = roofline.hierarchy_markdown(_toy_hardware())
    lines = text.splitlines()
    assert len(lines) == 2 + 4
    assert "2.0 TB/s" in lines[2] and "3.0 GiB" in lines[2]


def test_format_bytes():
    assert roofline.format_bytes(512) == "512 B"
    assert roofline.format_bytes(232448) == "227.0 KiB"
    assert roofline.format_bytes(60 * 2**20) == "60.0 MiB"
    assert roofline.format_bytes(None) == "—"


# --- naive attention's memory --------------------------------------------------------------------


def test_naive_intermediate_bytes_by_hand():
    assert roofline.naive_intermediate_bytes(2, 3, 5, 2) == {"S": 600, "P": 300, "total": 900}


def test_naive_intermediate_bytes_match_the_kernels_buffers():
    B, H, N, D = 1, 2, 33, 16
    q, k, v = runtime.random_qkv(B, H, N, D, dtype=torch.float16, seed_value=3)
    _, S, P = naive_module.naive_attention(q, k, v, return_intermediates=True)
    got = roofline.naive_intermediate_bytes(B, H, N, 2)
    assert got["S"] == S.numel() * S.element_size()
    assert got["P"] == P.numel() * P.element_size()


def test_naive_oom_n_by_hand():
    # B=H=D=1, 4-byte elements: q, k, v, o take 16·N bytes, S + P take 8·N²
    fits_64 = 16 * 64 + 8 * 64**2
    assert roofline.naive_oom_n(fits_64, 1, 1, 1, 4) == 128
    assert roofline.naive_oom_n(fits_64 - 1, 1, 1, 1, 4) == 64


def test_naive_oom_n_matches_the_recorded_out_of_memory_point():
    m = recorded.get("memory_vs_n")
    ooms = [r["N"] for r in m["rows"] if r["variant"] == "naive" and "oom" in r]
    memory = recorded.get("device")["properties"]["total_memory_bytes"]
    dtype_bytes = torch.empty(0, dtype=getattr(torch, m["dtype"])).element_size()
    assert roofline.naive_oom_n(memory, m["B"], m["H"], m["D"], dtype_bytes) == min(ooms)


def test_measure_memory_vs_n_stops_a_variant_after_out_of_memory(monkeypatch):
    shapes = []

    def fake_peak(fn):
        shapes.append(tuple(fn().shape))  # the real kernel runs (through the interpreter here)
        return 123

    def fake_time(fn):
        return 1.5

    original = roofline._measure_call

    def measure(fn, q, k, v):
        if fn is roofline.bench.sdpa and q.shape[2] >= 32:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate a lot\nsecond line")
        return original(fn, q, k, v)

    monkeypatch.setattr(bench, "peak_memory", fake_peak)
    monkeypatch.setattr(bench, "time_ms", fake_time)
    monkeypatch.setattr(roofline, "_measure_call", measure)
    m = roofline.measure_memory_vs_n((16, 32, 48), ("sdpa", "naive"), B=1, H=2, D=16, dtype=torch.float32)
    assert (m["B"], m["H"], m["D"], m["dtype"], m["causal"]) == (1, 2, 16, "float32", False)
    rows = [(r["variant"], r["N"], r.get("oom", r.get("ms"))) for r in m["rows"]]
    assert rows == [("sdpa", 16, 1.5), ("naive", 16, 1.5),
                    ("sdpa", 32, "CUDA out of memory. Tried to allocate a lot"), ("naive", 32, 1.5),
                    ("naive", 48, 1.5)]
    assert all(r["input_bytes"] == 3 * r["output_bytes"] == 3 * 2 * r["N"] * 16 * 4 for r in m["rows"])
    assert m["rows"][0]["peak_bytes_above_inputs"] == 123
    assert shapes == [(1, 2, n, 16) for n in (16, 16, 32, 48)]
    with pytest.raises(ValueError, match="unknown variant"):
        roofline.measure_memory_vs_n((16,), ("v9",), B=1, H=1, D=16)


# --- figures -------------------------------------------------------------------------------------


def _points():
    return [{"label": "matmul", "intensity": 500.0, "tflops": 80.0},
            {"label": "naive", "intensity": 5.0},
            {"label": "fp32 thing", "intensity": 2.0, "roof": "float32_ieee"}]


def test_plot_roofline_draws_the_roofs_and_the_points():
    hw = _toy_hardware()
    fig = roofline.plot_roofline(_points(), hw)
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
    hw = roofline.hardware_numbers("recorded")
    fig = roofline.plot_roofline(_points(), hw)
    assert hw["name"] in fig.axes[0].get_title()
    plt.close(fig)
    with pytest.raises(ValueError, match="roofs"):
        roofline.plot_roofline(_points(), _toy_hardware(), roofs=("bfloat16",))


def test_plot_memory_vs_n_from_the_recorded_rows():
    m = recorded.get("memory_vs_n")
    memory = recorded.get("device")["properties"]["total_memory_bytes"]
    fig = roofline.plot_memory_vs_n(m, memory_bytes=memory, label=recorded.label(m))
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
    fig = roofline.plot_memory_vs_n({"B": 1, "H": 1, "D": 16, "dtype": "float16", "rows": rows})
    ax_mem = fig.axes[0]
    cross = [line for line in ax_mem.get_lines() if line.get_marker() == "x"]
    assert len(cross) == 1
    assert cross[0].get_xdata()[0] == 256
    assert cross[0].get_ydata()[0] == roofline.naive_intermediate_bytes(1, 1, 256, 2)["total"]
    assert not any(line.get_label() == "GPU memory" for line in ax_mem.get_lines())
    plt.close(fig)
