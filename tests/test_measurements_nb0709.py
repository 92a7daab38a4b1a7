"""The measurement code behind notebooks 07-09 that runs without a GPU: which Nsight Compute metrics are asked
for, what the autotuner's pick is timed against, and the torch.profiler recording's registration."""

from flashattn import record
from flashattn.measure.measurements import compiled as mc
from flashattn.measure.measurements import tuning as mt
from flashattn.measure.profile import WARP_METRICS


def query_listing(base_names):
    lines = ['"Metric Name","Metric Type","Metric Unit","Metric Description"']
    lines += [f'"{name}","Counter","","made up"' for name in base_names]
    lines += [f'"unrelated__metric_{i}","Counter","",""' for i in range(60)]
    return "\n".join(lines)


def test_metrics_ncu_knows_drops_unlisted_names_but_never_the_known_ones():
    listed = [m.split(".")[0] for m in mc.EXP2_METRICS if "gmma" not in m and "stalled" not in m]
    keep, dropped = mc.metrics_ncu_knows(mc.EXP2_METRICS, query_listing(listed))
    assert "sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active" in dropped
    assert set(WARP_METRICS) <= set(keep)  # recorded before with this ncu: kept even where the listing lacks them
    assert "smsp__average_warps_issue_stalled_drain_per_issue_active.ratio" in dropped
    assert sorted(keep + dropped) == sorted(mc.EXP2_METRICS)


def test_metrics_ncu_knows_keeps_everything_when_the_query_says_nothing():
    assert mc.metrics_ncu_knows(mc.EXP2_METRICS, "") == (list(mc.EXP2_METRICS), [])


def test_the_counters_cover_the_speedup_identity():
    from flashattn.measure import issue_counters as ic

    for name in (ic.INSTRUCTIONS, ic.LATENCY, ic.WARPS, ic.CLOCK, ic.DURATION):
        assert name in mc.EXP2_METRICS


def test_comparison_configs_time_the_pick_against_the_alternatives_once_each():
    pick = dict(block_m=64, block_n=64, num_warps=4, num_stages=3)
    default = dict(block_m=128, block_n=64, num_warps=8, num_stages=3)
    timings = [dict(pick, ms=1.0), dict(default, ms=1.1), dict(block_m=64, block_n=32, num_warps=4, num_stages=2,
                                                                ms=None), dict(block_m=64, block_n=32, num_warps=4,
                                                                               num_stages=3, ms=1.2)]
    sweep_best = dict(pick, tflops=434.0, ms=1.27, registers_per_thread=200)
    configs = mt.comparison_configs(pick, timings, default, sweep_best)
    assert list(configs) == ["picked, launched directly", "tuner's #2", "tuner's #3"]
    assert configs["tuner's #2"] == default and configs["tuner's #3"]["num_stages"] == 3
    assert all(set(c) == {"block_m", "block_n", "num_warps", "num_stages"} for c in configs.values())
    other_best = dict(block_m=128, block_n=128, num_warps=8, num_stages=2, tflops=1.0)
    configs = mt.comparison_configs(pick, timings[:1], default, other_best)
    assert list(configs) == ["picked, launched directly", "v2 default", "sweep's best"]


def test_the_new_recordings_are_registered():
    registered = record.load_measurements()
    assert {"normalization_exp2", "torch_profile_table", "autotune_v2_d64", "autotune_v2_d128"} <= set(registered)
    assert mt.COMPARE_ROUNDS >= 3 and mc.ROUNDS >= 3


def test_recorded_timings_of_one_configuration_come_from_every_measurement_that_ran_it():
    from flashattn import bench
    from flashattn.measure import autotune, recorded

    entry = recorded.get("autotune_v2_d128")
    rows = autotune.recorded_timings(entry["best"], 128)
    whats = {r["what"] for r in rows}
    assert "the sweep" in whats and "the autotuner's own timing, while tuning" in whats
    assert "the tuned kernel, timed after tuning" in whats
    for r in rows:
        assert r["tflops"] == bench.tflops(entry["B"], entry["H"], entry["N"], 128, r["ms"])
    default_rows = autotune.recorded_timings(entry["default"], 128)
    assert {"compiled_facts", "normalization_exp2"} <= {r["measurement"] for r in default_rows}
    assert autotune.recorded_timings(dict(block_m=16, block_n=16, num_warps=1, num_stages=9), 128) == []


def test_measured_traffic_plot_marks_zero_bytes_instead_of_dropping_them():
    import copy

    import matplotlib.pyplot as plt

    from flashattn import plots, recorded

    rows = copy.deepcopy([r for r in recorded.get("traffic_measured")["rows"] if "error" not in r])
    small = [r for r in rows if r["size"] == "small"]
    for r in small:  # what a size that fits in L2 shows: the output never reaches DRAM while the kernel runs
        r["measured"]["dram_write"] = 0.0
    small[0]["measured"]["l2_write"] = None  # not collected: left blank, not marked
    fig = plots.plot_measured_traffic(rows, "small")
    reads, writes = fig.axes
    assert [t.get_text() for t in writes.texts].count("0") == len(small)
    assert "0 = zero bytes" in writes.get_title()
    plt.close(fig)
    for r in rows:
        r["measured"]["dram_write"] = r["measured"]["dram_write"] or 1.0
    fig = plots.plot_measured_traffic(rows, "large")
    assert not any(t.get_text() == "0" for ax in fig.axes for t in ax.texts)
    assert not any("0 = zero bytes" in ax.get_title() for ax in fig.axes)
    plt.close(fig)


def test_profile_table_shows_a_labels_whole_gpu_time():
    from flashattn import profile

    rows = [{"name": "v2", "kind": "label", "calls": 3, "cpu_ms": 1.0, "self_cpu_ms": 0.5, "device_ms": 4.5,
             "self_device_ms": 0.0},
            {"name": "attn_kernel_v2", "kind": "kernel", "calls": 3, "cpu_ms": 0.0, "self_cpu_ms": 0.0,
             "device_ms": 4.5, "self_device_ms": 4.25}]
    label_line, kernel_line = profile.format_profile_table(rows).splitlines()[1:]
    assert label_line.split()[-1] == "4.500" and kernel_line.split()[-1] == "4.250"


def test_interleaved_comparison_times_every_candidate_in_rounds_and_keeps_failures(monkeypatch):
    calls = []

    def fake_v2(q, k, v, **opts):
        if opts["block_n"] == 128:
            raise RuntimeError("out of shared memory")
        calls.append(("v2", opts["block_m"]))

    def fake_rounds(fns, rounds):
        return {name: [1.0 + 0.1 * i for i in range(rounds)] for name in fns}

    monkeypatch.setattr(mt, "VARIANTS", {"v2": fake_v2})
    monkeypatch.setattr(mt, "time_rounds", fake_rounds)
    monkeypatch.setattr(mt.autotune, "run_autotuned_v2", lambda tuned, q, k, v: calls.append(("autotuned", 0)))

    class Tuned:
        class best_config:  # noqa: N801 - stands in for a triton.Config
            kwargs = {"BLOCK_M": 64, "BLOCK_N": 64}
            num_warps, num_stages = 4, 3

    configs = {"picked, launched directly": dict(block_m=64, block_n=64, num_warps=4, num_stages=3),
               "sweep's best": dict(block_m=64, block_n=128, num_warps=4, num_stages=3)}
    p = {"B": 4, "H": 16, "N": 4096, "options": {}}
    out = mt._interleaved(Tuned, None, None, None, configs, p, 64)
    assert out["rounds"] == mt.COMPARE_ROUNDS
    rows = {r["label"]: r for r in out["rows"]}
    assert "error" in rows["sweep's best"] and "ms" not in rows["sweep's best"]
    auto = rows["autotuned"]
    assert auto["config"] == configs["picked, launched directly"] and len(auto["ms_rounds"]) == mt.COMPARE_ROUNDS
    assert auto["spread"] == max(auto["ms_rounds"]) / min(auto["ms_rounds"]) - 1
    assert ("autotuned", 0) in calls and ("v2", 64) in calls  # each ran once before the rounds


def test_exp2_counters_profile_the_four_ablations_of_each_fp16_head_dimension(monkeypatch):
    from flashattn import tuning
    from flashattn.measure.profile import NcuUnavailable

    seen = {}

    def fake_profile(targets, metrics, kernel_regex):
        seen.setdefault("metrics", []).append(list(metrics))
        if len(seen["metrics"]) == 1 and "made_up__metric.sum" in metrics:
            raise NcuUnavailable("ncu failed (exit 1): Failed to find metric made_up__metric.sum")
        seen["targets"] = targets
        assert kernel_regex == "attn_kernel_v2"
        return [[{"kernel": "attn_kernel_v2", "grid": "(32, 64, 1)", "block": "(128, 1, 1)",
                  "metrics": {"smsp__inst_executed.sum": 1.0}}] for _ in targets]

    monkeypatch.setattr(mc, "ncu_profile", fake_profile)
    monkeypatch.setattr(mc, "find_ncu", lambda: "/usr/bin/ncu")
    monkeypatch.setattr(mc, "ncu_version", lambda: "made up")
    monkeypatch.setattr(mc, "_query_metrics", lambda: "")
    out = mc._exp2_counters()
    Ds = tuning.PATHS["fp16_tc"]["Ds"]
    assert len(out["rows"]) == 4 * len(Ds) and out["dropped"] == []
    assert {(r["D"], r["deferred_norm"], r["use_exp2"]) for r in out["rows"]} == {
        (D, a["deferred_norm"], a["use_exp2"]) for D in Ds for a in mc.ABLATIONS}
    assert all(t["options"]["use_exp2"] in (True, False) and t["dtype"] == "float16" for t in seen["targets"])
    # a metric this ncu does not know: once more with the known ones, and the entry says what was dropped
    monkeypatch.setattr(mc, "EXP2_METRICS", [*mc.EXP2_METRICS, "made_up__metric.sum"])
    seen.clear()
    out = mc._exp2_counters()
    assert len(seen["metrics"]) == 2 and "made_up__metric.sum" in out["dropped"]
    assert set(out["metrics"]) <= mc.KNOWN_METRICS | {"smsp__inst_executed.sum"} and out["rows"]
