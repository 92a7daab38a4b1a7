"""flashattn.measure.dram: kernels placed on the roofline by the bytes that reach DRAM (notebooks 00 and 10);
the roofline plot's points, requested-byte lines and legends; the roofline_dram measurement's set-up."""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from flashattn import hardware, plots, recorded, roofline, traffic  # noqa: E402
from flashattn.measure import dram  # noqa: E402
from flashattn.measure.measurements import roofline as roofline_measurement  # noqa: E402

FULL = dict(B=4, H=16, N=4096, D=64)


def test_three_counts_by_hand():
    X = 4 * 16 * 4096 * 64 * 2  # one of Q, K, V, O in fp16
    c = dram.attention_traffic("v2", **FULL, block_m=128, block_n=64, gpu="no such gpu")
    assert c["compulsory"] == 4 * X  # read Q, K, V once, write O once
    assert c["requested"] == X + 32 * 2 * X + X  # Q, K and V once per 128-row Q tile (32 of them), O
    assert c["dram"] == c["compulsory"] and c["dram_source"].startswith("compulsory")
    naive = dram.attention_traffic("naive", **FULL, gpu="no such gpu")
    s, p = 4 * 16 * 4096**2 * 4, 4 * 16 * 4096**2 * 2  # S (float32) and P, each written and read back once
    assert naive["compulsory"] == 4 * X + 2 * (s + p)
    assert naive["requested"] == roofline.attention_bytes("naive", **FULL, dtype_bytes=2)


def test_fast_and_sdpa_follow_v2s_formula():
    assert dram.model_variant("fast") == dram.model_variant("sdpa") == "v2" and dram.model_variant("v1") == "v1"
    fast = dram.attention_traffic("fast", **FULL, block_m=192, block_n=128, gpu="no such gpu")
    assert fast["requested"] == roofline.attention_bytes("v2", **FULL, dtype_bytes=2, block_m=192, block_n=128)
    sdpa = dram.attention_traffic("sdpa", **FULL, gpu="no such gpu")
    assert sdpa["requested"] is None and sdpa["compulsory"] == fast["compulsory"]
    with pytest.raises(ValueError, match="dtype"):
        dram.attention_traffic("v2", **FULL, dtype="float8")


def test_measured_dram_bytes_are_used_where_recorded():
    rows = [r for r in recorded.get("traffic_measured")["rows"] if "error" not in r and r["variant"] == "v2"]
    r = rows[0]
    problem = dict(B=r["B"], H=r["H"], N=r["N"], D=r["D"])
    got = dram.recorded_dram_bytes("v2", **problem)
    assert got["read"] == r["measured"]["dram_read"] and got["write"] == r["measured"]["dram_write"]
    c = dram.attention_traffic("v2", **problem)
    assert c["dram"] == got["read"] + got["write"] and "Nsight Compute" in c["dram_source"]
    assert dram.recorded_dram_bytes("v2", **problem, causal=True) is None
    assert dram.recorded_dram_bytes("v2", **problem, gpu="no such gpu") is None


def test_v2_reaches_dram_with_about_its_compulsory_bytes():
    """The recorded reason for placing by DRAM bytes: v2 requests many times what reaches DRAM."""
    r = next(r for r in recorded.get("traffic_measured")["rows"] if r["variant"] == "v2" and r["size"] == "large")
    problem = dict(B=r["B"], H=r["H"], N=r["N"], D=r["D"], dtype_bytes=2)
    measured = r["measured"]["dram_read"] + r["measured"]["dram_write"]
    compulsory = sum(traffic.compulsory_bytes("v2", **problem).values())
    assert 0.8 < measured / compulsory < 1.2
    assert (r["model_kernels"]["read"] + r["model_kernels"]["write"]) > 10 * measured


def test_roofline_point():
    p = dram.roofline_point("fast D=64", "fast", tflops=400.0, **FULL, block_m=192, block_n=128, gpu="no such gpu")
    flops = roofline.attention_flops(4, 16, 4096, 64)
    assert p["intensity"] == pytest.approx(flops / p["bytes"]["dram"])
    assert p["intensity"] == pytest.approx(4096 / 2)  # N / dtype bytes
    assert p["requested_intensity"] == pytest.approx(flops / p["bytes"]["requested"])
    assert p["requested_intensity"] < p["intensity"]
    assert p["variant"] == "fast" and p["tflops"] == 400.0


def test_plot_roofline_legend_mode_ties_and_requested_lines():
    hw = hardware.hardware_numbers("recorded")
    # compulsory bytes (no recording for this GPU), so that fast D=64 and SDPA D=64 tie on intensity
    points = [dram.roofline_point(f"fast D={D}", "fast", tflops=t, **{**FULL, "D": D}, block_m=128, block_n=128,
                                  gpu="no such gpu") for D, t in ((64, 450.0), (128, 590.0))]
    points.append(dram.roofline_point("SDPA D=64", "sdpa", tflops=440.0, **FULL, gpu="no such gpu"))
    fig = plots.plot_roofline(points, hw, roofs=("float16",), labels="legend")
    ax = fig.axes[0]
    markers = [line for line in ax.get_lines() if line.get_label() in ("fast D=64", "fast D=128", "SDPA D=64")]
    xs = [line.get_xdata()[0] for line in markers]
    assert len(set(xs)) == 3 and xs == sorted(xs)  # same intensity: drawn side by side, 10 % apart
    assert xs[1] == pytest.approx(1.1 * xs[0])
    dotted = [line for line in ax.get_lines() if line.get_linestyle() == ":"]
    assert len(dotted) == 2  # fast's requested bytes; SDPA's tiles are unknown
    texts = [t.get_text() for t in ax.get_legend().get_texts()]
    assert "fast D=64" in texts and any("requested bytes" in t for t in texts)
    memory = ax.get_lines()[0]
    assert memory.get_linestyle() == "-" and ax.get_lines()[1].get_linestyle() == "--"  # one style per roof
    assert max(memory.get_ydata()) == pytest.approx(hw["matmul_tflops"]["float16"])  # the slope stops at the roof
    plt.close(fig)
    with pytest.raises(ValueError, match="labels"):
        plots.plot_roofline(points, hw, labels="above")


def test_roofline_measurement_configurations():
    table = recorded.get("fast_vs_sdpa")
    cfgs = roofline_measurement.configs(table)
    assert [(c["variant"], c["D"]) for c in cfgs] == roofline_measurement.CONFIGS
    for c in cfgs:
        assert (c["B"], c["H"], c["N"], c["dtype"], c["causal"]) == (4, 16, 4096, "float16", False)
        if c["variant"] == "fast":  # the recorded pick: explicit tiles, so nothing autotunes under the profiler
            pick = next(r["fast_config"] for r in table["rows"] if (r["D"], r["N"], r["B"], r["causal"], r["dtype"])
                        == (c["D"], 4096, 4, False, "float16"))
            assert c["options"] == pick and "block_m" in c["options"]
        else:
            assert c["options"] == {}
    assert roofline_measurement.configs(None)[3]["options"] == {}
    assert roofline_measurement.kernel_regex("naive").count("|") == 2
    assert "sdpa" in roofline_measurement.kernel_regex("sdpa")


def _ncu_csv(kernels, dram_read):
    from flashattn.measure.profile import TRAFFIC_METRICS

    head = ('"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size",'
            '"Device","CC",' + ",".join(f'"{m}"' for m in TRAFFIC_METRICS))
    units = ",".join(['""'] * 11 + ['"byte"', '"byte"', '"sector"', '"sector"', '"byte"', '"ns"'])
    lines = ["==PROF== Connected", head, units]
    for i, kernel in enumerate(kernels):
        values = [dram_read * (i + 1), 10, 20, 30, 40, 50]  # the second call's launches count double
        lines.append(f'"{i}","1","python","h","{kernel}","1","7","(128, 1, 1)","(8, 2, 1)","0","9.0",'
                     + ",".join(f'"{v}"' for v in values))
    return "\n".join(lines) + "\n"


def test_roofline_measurement_keeps_the_second_call(monkeypatch):
    import subprocess

    calls = []

    def fake_run(command, **kwargs):
        calls.append(command)
        return subprocess.CompletedProcess(command, 0, stdout=_ncu_csv(["k1", "k2", "k1", "k2"], 1000), stderr="")

    monkeypatch.setattr(roofline_measurement.subprocess, "run", fake_run)
    cfg = {"variant": "sdpa", "D": 64, "B": 1, "H": 1, "N": 64, "dtype": "float16", "causal": False, "options": {}}
    got = roofline_measurement._profile(cfg, "ncu", timeout=5)
    assert got["kernels"] == ["k1", "k2"]  # the second of the two calls
    assert got["measured"]["dram_read"] == 3000 + 4000 and got["measured"]["l2_read"] == 2 * 20 * 32
    assert f"regex:{roofline_measurement.SDPA_KERNELS}" in calls[0]
    one_launch = _ncu_csv(["k1"], 1)
    monkeypatch.setattr(roofline_measurement.subprocess, "run",
                        lambda command, **kw: subprocess.CompletedProcess(command, 0, stdout=one_launch, stderr=""))
    with pytest.raises(Exception, match="same kernels in both calls"):
        roofline_measurement._profile(cfg, "ncu", timeout=5)


def test_a_recorded_roofline_dram_row_places_the_kernel(tmp_path, monkeypatch):
    doc = {"provenance": {"gpu": "Toy GPU"}, "measurements": {"roofline_dram": {"rows": [
        {"variant": "fast", "B": 4, "H": 16, "N": 4096, "D": 64, "dtype": "float16", "causal": False,
         "measured": {"dram_read": 3.0e8, "dram_write": 1.0e8}},
        {"variant": "sdpa", "B": 4, "H": 16, "N": 4096, "D": 64, "dtype": "float16", "causal": False,
         "error": "ncu failed"}]}}}
    (tmp_path / "toy.json").write_text(__import__("json").dumps(doc))
    monkeypatch.setattr(recorded, "DATA_DIR", tmp_path)
    p = dram.roofline_point("fast", "fast", tflops=1.0, **FULL)
    assert p["bytes"]["dram"] == 4.0e8 and "roofline_dram" in p["dram_source"]
    assert p["intensity"] == pytest.approx(roofline.attention_flops(4, 16, 4096, 64) / 4.0e8)
    sdpa = dram.roofline_point("sdpa", "sdpa", tflops=1.0, **FULL)  # an error row is no measurement
    assert sdpa["dram_source"].startswith("compulsory")
