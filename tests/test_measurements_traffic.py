"""The 'traffic_measured' measurement and the model-against-counters helpers of flashattn.traffic.

Everything here runs without a GPU or ncu: the ncu runs are replaced by launches built from the model.
The last test checks the recorded H200 entry when it exists (and says so when it does not).
"""

from __future__ import annotations

import math

import pytest

from flashattn import plots, profile, recorded, traffic, traffic_counters
from flashattn.exercises import ExerciseFailed
from flashattn.exercises.traffic import check_l2_request_bytes, check_l2_served_fraction
from flashattn.kernels import launch_tiles, registry
from flashattn.measure.measurements import traffic as mt

PROBLEM = dict(B=2, H=3, N=333, D=48, dtype_bytes=2)  # N not a multiple of any block


def fake_launches(cfg: dict, l2_scale: float = 1.0, dram_scale: float = 0.5) -> list[dict]:
    """What ncu would report if the L2 requests were ``l2_scale`` × the model (per kernel)."""
    nums = mt.model_numbers(cfg)
    per_kernel = nums.get("model_per_kernel") or {registry.kernel_names(cfg["variant"])[0]: nums["model_kernels"]}
    return [{"kernel": f"{name}_0d1d2d", "grid": "(1, 1, 1)", "block": "(128, 1, 1)", "units": {},
             "metrics": {"lts__t_sectors_srcunit_tex_op_read.sum": l2_scale * model["read"] / 32,
                         "lts__t_sectors_srcunit_tex_op_write.sum": l2_scale * model["write"] / 32,
                         "dram__bytes_read.sum": dram_scale * model["read"], "dram__bytes_write.sum": 0.0,
                         "lts__t_bytes.sum": 2.0 * model["read"], "gpu__time_duration.sum": 1000.0,
                         "sm__warps_active.avg.pct_of_peak_sustained_active": 25.0}}
            for name, model in per_kernel.items()]


# --- the model's side ---------------------------------------------------------------------------------


@pytest.mark.parametrize("variant", ["v1", "v2", "v2_kt_view", "v2_padded", "naive"])
def test_kernel_bytes_equal_the_model_without_host_copies(variant):
    blocks = dict(block_m=64, block_n=32)
    assert traffic.kernel_hbm_bytes(variant, **PROBLEM, **blocks) == traffic.hbm_bytes(variant, **PROBLEM, **blocks)


def test_kernel_bytes_of_v2_kt_leave_out_the_host_transpose():
    blocks = dict(block_m=128, block_n=64)
    full = traffic.hbm_bytes("v2_kt", **PROBLEM, **blocks)
    kernel = traffic.kernel_hbm_bytes("v2_kt", **PROBLEM, **blocks)
    x = PROBLEM["B"] * PROBLEM["H"] * PROBLEM["N"] * PROBLEM["D"] * PROBLEM["dtype_bytes"]
    assert full["read"] - kernel["read"] == x and full["write"] - kernel["write"] == x
    assert kernel == traffic.hbm_bytes("v2", **PROBLEM, **blocks)


def test_naive_bytes_per_kernel_add_up_and_follow_the_kernels():
    blocks = dict(block_m=64, block_n=32)
    per = traffic.naive_kernel_bytes(**PROBLEM, **blocks)
    total = traffic.hbm_bytes("naive", **PROBLEM, **blocks)
    assert list(per) == list(registry.kernel_names("naive"))
    assert sum(p["read"] for p in per.values()) == total["read"]
    assert sum(p["write"] for p in per.values()) == total["write"]
    bh, N = PROBLEM["B"] * PROBLEM["H"], PROBLEM["N"]
    s = bh * N * N * 4
    assert per["softmax_kernel"] == {"read": 3 * s, "write": bh * N * N * 2}  # three passes over S, P written
    assert per["scores_kernel"]["write"] == s


def test_compulsory_bytes():
    bh, N, D, e = PROBLEM["B"] * PROBLEM["H"], PROBLEM["N"], PROBLEM["D"], PROBLEM["dtype_bytes"]
    x, stat = bh * N * D * e, bh * N * 4
    assert traffic.compulsory_bytes("v2", **PROBLEM) == {"read": 3 * x, "write": x}
    assert traffic.compulsory_bytes("v2_kt", **PROBLEM) == {"read": 3 * x, "write": x}
    assert traffic.compulsory_bytes("v1", **PROBLEM) == {"read": 4 * x + 2 * stat, "write": x + 2 * stat}
    sp = bh * N * N * (4 + e)
    assert traffic.compulsory_bytes("naive", **PROBLEM) == {"read": 3 * x + sp, "write": sp + x}
    # the request count can never be below the compulsory bytes
    for variant in ("naive", "v1", "v2", "v2_padded"):
        model = traffic.kernel_hbm_bytes(variant, **PROBLEM, block_m=64, block_n=64)
        comp = traffic.compulsory_bytes(variant, **PROBLEM)
        assert model["read"] >= comp["read"] and model["write"] >= comp["write"], variant
    with pytest.raises(ValueError, match="unknown variant"):
        traffic.compulsory_bytes("v3", **PROBLEM)


def test_measured_bytes_reads_plain_and_wrapped_values():
    m = traffic_counters.measured_bytes({"dram__bytes_read.sum": 100.0,
                                         "dram__bytes_write.sum": {"value": 7, "unit": "byte"},
                                         "lts__t_sectors_srcunit_tex_op_read.sum": 3.0})
    assert m == {"dram_read": 100.0, "dram_write": 7.0, "l2_read": 96.0, "l2_write": None, "l2_all": None}


# --- configurations and rows --------------------------------------------------------------------------


def test_configs_cover_every_variant_at_both_sizes():
    cfgs = mt.configs()
    assert {(c["size"], c["variant"]) for c in cfgs} == {
        (s, v) for s in mt.SIZES for v in ("naive",) + mt.FAMILY}
    for c in cfgs:
        assert c["options"] == launch_tiles(c["variant"], c["dtype"], c["D"])
        if c["variant"] == "naive":
            assert (c["B"], c["H"]) == (mt.SIZES[c["size"]]["naive"]["B"], mt.SIZES[c["size"]]["naive"]["H"])
    by = {(c["size"], c["variant"]): c for c in cfgs}
    assert by[("large", "v2")]["options"]["block_m"] == 128  # fp16 GPU defaults, not the interpreter's


def test_sizes_straddle_the_l2_cache():
    """The large working sets are several times an H200's L2, the small ones fit (uses the recorded L2 size)."""
    try:
        l2 = recorded.get("device")["properties"]["l2_cache_bytes"]
    except (KeyError, FileNotFoundError):
        pytest.skip("no recorded 'device' entry with the L2 size")
    for c in mt.configs():
        ws = mt.model_numbers(c)["working_set_bytes"]
        if c["size"] == "large":
            assert ws > 3 * l2, (c["variant"], ws, l2)
        else:
            assert ws < l2, (c["variant"], ws, l2)


def test_build_row_matches_the_model_when_the_counters_do():
    for cfg in mt.configs()[:3]:
        row = mt.build_row(cfg, fake_launches(cfg))
        assert "error" not in row
        c = traffic_counters.compare_with_model(row)
        assert math.isclose(c["l2_over_model"]["total"], 1.0) and math.isclose(c["dram_over_model"]["read"], 0.5)
        assert len(row["kernels"]) == len(registry.kernel_names(cfg["variant"]))
        assert row["block_m"] == cfg["options"]["block_m"] and row["size"] == cfg["size"]
        # additive metrics are summed over kernels, averages are not
        assert "sm__warps_active.avg.pct_of_peak_sustained_active" not in row["metrics"]
        assert row["metrics"]["gpu__time_duration.sum"] == 1000.0 * len(row["kernels"])


def test_build_row_refuses_the_wrong_kernels():
    cfg = next(c for c in mt.configs() if c["variant"] == "naive")
    launches = fake_launches(cfg)
    row = mt.build_row(cfg, launches[::-1])
    assert "expected kernels" in row["error"] and row["variant"] == "naive"
    assert "expected kernels" in mt.build_row(cfg, launches[:2])["error"]


def test_summary_and_table():
    rows = [mt.build_row(c, fake_launches(c, l2_scale=1.3 if c["variant"] == "v2_padded" else 1.02,
                                          dram_scale=0.8 if c["variant"] == "v1" else 0.02))
            for c in mt.configs() if c["size"] == "large"]
    s = traffic_counters.measured_summary(rows, "large")
    assert s["within_tolerance"] == {"naive": True, "v1": True, "v2": True, "v2_kt": True, "v2_padded": False}
    v1 = next(r for r in rows if r["variant"] == "v1")
    v2 = next(r for r in rows if r["variant"] == "v2")
    expected = 0.02 * v2["model_kernels"]["read"] / (0.8 * v1["model_kernels"]["read"])
    assert math.isclose(s["v2_over_v1_dram_read"], expected)
    assert "outside ±15%" in s["text"] and "v2_padded" in s["text"]
    rows.append(mt.error_row(mt.configs()[0], RuntimeError("boom")))
    table = traffic_counters.format_measured_table(rows)
    assert "error: RuntimeError: boom" in table and len(table.splitlines()) == 1 + 2 * 5 + 1
    assert traffic_counters.measured_summary(rows, "small")["v2_over_v1_dram_read"] is None


def test_plot_measured_traffic():
    import matplotlib.pyplot as plt

    rows = [mt.build_row(c, fake_launches(c)) for c in mt.configs() if c["size"] == "small"]
    fig = plots.plot_measured_traffic(rows, "small", caption_text="synthetic")
    assert len(fig.axes) == 2 and fig.axes[0].get_yscale() == "log"
    assert [t.get_text().split("\n")[0] for t in fig.axes[0].get_xticklabels()] == [r["variant"] for r in rows]
    plt.close(fig)
    with pytest.raises(ValueError, match="no measured rows"):
        plots.plot_measured_traffic(rows, "large")


# --- the measurement with ncu replaced ----------------------------------------------------------------


def test_profile_group_retries_without_refused_metrics(monkeypatch):
    group = [c for c in mt.configs() if c["variant"] in ("v1", "v2")]
    calls = []

    def fake_ncu_profile(targets, metrics, kernel_regex, timeout):
        calls.append(list(metrics))
        if len(calls) == 1:
            raise profile.NcuUnavailable("ncu failed (exit 1): ==ERROR== Failed to find metric smsp__x")
        assert kernel_regex == "attn_kernel_v1|attn_kernel_v2" and "size" not in targets[0]
        return [fake_launches(c) for c in group]

    monkeypatch.setattr(mt, "ncu_profile", fake_ncu_profile)
    rows, note = mt._profile_group(group, mt.time.perf_counter())
    assert calls == [mt.ALL_METRICS, profile.TRAFFIC_METRICS] and "traffic metrics only" in note
    assert all("error" not in r for r in rows)


def test_profile_group_permission_refused_gives_error_rows(monkeypatch):
    group = [c for c in mt.configs() if c["variant"] == "naive"]

    def refused(*args, **kwargs):
        raise profile.NcuUnavailable("ncu may not read the GPU performance counters here (ERR_NVGPUCTRPERM)")

    monkeypatch.setattr(mt, "ncu_profile", refused)
    rows, note = mt._profile_group(group, mt.time.perf_counter())
    assert note is None and len(rows) == len(group) and all("ERR_NVGPUCTRPERM" in r["error"] for r in rows)


def test_traffic_measured_end_to_end_with_fakes(monkeypatch):
    groups = []

    def fake_ncu_profile(targets, metrics, kernel_regex, timeout):
        groups.append(kernel_regex)
        return [fake_launches(dict(t, size="?")) for t in targets]

    failing = ("small", "v2_padded")
    monkeypatch.setattr(mt, "find_ncu", lambda: "/fake/ncu")
    monkeypatch.setattr(mt, "ncu_version", lambda: "fake 1.0")
    monkeypatch.setattr(mt, "ncu_profile", fake_ncu_profile)
    monkeypatch.setattr(mt, "_precheck", lambda c: "OutOfResources: shared" if (c["size"], c["variant"]) == failing
                        else None)
    monkeypatch.setattr(mt, "device_properties", lambda: {"l2_cache_bytes": 123})
    result = mt.traffic_measured()
    assert groups == ["attn_kernel_v1|attn_kernel_v2", "pv_kernel|scores_kernel|softmax_kernel"]  # two ncu runs
    cfgs = mt.configs()
    assert [(r["size"], r["variant"]) for r in result["rows"]] == [(c["size"], c["variant"]) for c in cfgs]
    errors = [(r["size"], r["variant"]) for r in result["rows"] if "error" in r]
    assert errors == [failing]
    assert result["l2_cache_bytes"] == 123 and result["ncu_version"] == "fake 1.0"
    assert "flashattn.measure.profile" in result["example_command"]


def test_traffic_measured_without_ncu(monkeypatch):
    monkeypatch.setattr(mt, "find_ncu", lambda: None)
    monkeypatch.setattr(mt, "ncu_version", lambda: None)
    monkeypatch.setattr(mt, "device_properties", lambda: {"l2_cache_bytes": 1})
    result = mt.traffic_measured()
    assert result["error"] == "ncu not found" and all("not installed" in r["error"] for r in result["rows"])


# --- the recorded entry ----------------------------------------------------------------------------------


def test_recorded_entry_is_consistent():
    """The recorded H200 run: its models match today's model, and the course's two claims hold."""
    try:
        entry = recorded.get("traffic_measured")
    except (KeyError, FileNotFoundError):
        pytest.skip("'traffic_measured' not recorded yet (run `python -m flashattn.record --only traffic_measured`)")
    ok = [r for r in entry["rows"] if "error" not in r]
    assert ok, "every recorded row is an error"
    for row in ok:
        cfg = {"variant": row["variant"], "dtype": row["dtype"], "causal": row["causal"],
               **{k: row[k] for k in ("B", "H", "N", "D")},
               "options": {k: row[k] for k in ("block_m", "block_n", "num_warps", "num_stages")}}
        nums = mt.model_numbers(cfg)
        assert row["model_kernels"] == nums["model_kernels"] and row["compulsory"] == nums["compulsory"]
    summary = traffic_counters.measured_summary(entry["rows"], "large")
    if summary["v2_over_v1_dram_read"] is not None:
        assert summary["v2_over_v1_dram_read"] <= 0.10


# --- the exercises of notebook 09 -------------------------------------------------------------------------


def test_l2_served_fraction():
    assert traffic.l2_served_fraction(100.0, 1000.0, 100.0) == 1.0  # only the compulsory reads reached DRAM
    assert traffic.l2_served_fraction(1000.0, 1000.0, 100.0) == 0.0  # every request went to DRAM
    assert math.isclose(traffic.l2_served_fraction(325.0, 1000.0, 100.0), 0.75)
    assert traffic.l2_served_fraction(5.0, 100.0, 100.0) is None


def _stub(*args):
    raise NotImplementedError


def test_check_l2_request_bytes(capsys):
    right = lambda m: {"read": 32 * m["lts__t_sectors_srcunit_tex_op_read.sum"],  # noqa: E731
                       "write": 32 * m["lts__t_sectors_srcunit_tex_op_write.sum"]}
    assert check_l2_request_bytes(right) is True
    assert check_l2_request_bytes(_stub) is False and "not attempted" in capsys.readouterr().out
    wrong = {
        "a sector is 32 bytes": lambda m: {"read": m["lts__t_sectors_srcunit_tex_op_read.sum"],
                                           "write": m["lts__t_sectors_srcunit_tex_op_write.sum"]},
        "you returned DRAM bytes": lambda m: {"read": m["dram__bytes_read.sum"], "write": m["dram__bytes_write.sum"]},
        "swapped": lambda m: {"read": right(m)["write"], "write": right(m)["read"]},
        "every L2 lookup": lambda m: {"read": m["lts__t_bytes.sum"], "write": m["lts__t_bytes.sum"]},
        "keys 'read' and 'write'": lambda m: (1, 2),
    }
    for message, fn in wrong.items():
        with pytest.raises(ExerciseFailed, match=message):
            check_l2_request_bytes(fn)


def test_check_l2_served_fraction(capsys):
    assert check_l2_served_fraction(traffic.l2_served_fraction) is True
    assert check_l2_served_fraction(_stub) is False
    wrong = {
        "DRAM ÷ model": lambda d, m, c: d / m,
        "compulsory reads can never be served": lambda d, m, c: 1 - d / m,
        "from DRAM only": lambda d, m, c: 1 - (d - c) / m,
        "percentage": lambda d, m, c: 100 * traffic.l2_served_fraction(d, m, c),
        "expected": lambda d, m, c: 0.5,
        "one number": lambda d, m, c: "0.9",
    }
    for message, fn in wrong.items():
        with pytest.raises(ExerciseFailed, match=message):
            check_l2_served_fraction(fn)
