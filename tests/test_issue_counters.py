"""flashattn.measure.issue_counters: a speed-up split into instructions, cycles per instruction, warps and clock
(notebook 07's exp -> exp2), on made-up counters that obey the scheduler identity."""

import pytest

from flashattn.measure import issue_counters as ic


def kernel_metrics(instructions, latency, warps, clock_hz, *, stalls, idle=1.0, schedulers=132 * 4):
    """Counters of a made-up kernel: busy cycles per scheduler = instructions per scheduler × latency ÷ warps;
    ``idle`` >= 1 stretches the duration beyond the busy cycles (a partial last wave)."""
    cycles = instructions / schedulers * latency / warps
    metrics = {ic.INSTRUCTIONS: instructions, ic.LATENCY: latency, ic.WARPS: warps, ic.CLOCK: clock_hz,
               ic.DURATION: cycles / clock_hz * 1e9 * idle}
    metrics.update({f"{ic.STALL_PREFIX}{name}{ic.STALL_SUFFIX}": value for name, value in stalls.items()})
    return metrics


def test_the_factors_multiply_to_the_measured_speedup():
    before = kernel_metrics(3.0e9, 6.0, 2.0, 1.7e9, stalls={"wait": 2.5, "short_scoreboard": 1.5, "selected": 1.0})
    after = kernel_metrics(2.0e9, 4.5, 2.0, 1.8e9, stalls={"wait": 1.2, "short_scoreboard": 1.5, "selected": 1.0})
    f = ic.speedup_factors(before, after)
    assert f["instructions"] == pytest.approx(1.5) and f["latency"] == pytest.approx(6.0 / 4.5)
    assert f["warps"] == pytest.approx(1.0) and f["clock"] == pytest.approx(1.8 / 1.7)
    assert f["product"] == pytest.approx(f["instructions"] * f["latency"] * f["clock"])
    assert f["measured"] == pytest.approx(f["product"]) and f["rest"] == pytest.approx(1.0)


def test_what_the_factors_leave_is_the_rest():
    before = kernel_metrics(1e9, 5.0, 2.0, 1.5e9, stalls={}, idle=1.2)
    after = kernel_metrics(1e9, 5.0, 4.0, 1.5e9, stalls={})
    f = ic.speedup_factors(before, after)
    assert f["warps"] == pytest.approx(2.0) and f["measured"] == pytest.approx(2.4)
    assert f["rest"] == pytest.approx(1.2)


def test_a_missing_counter_is_none_and_counts_as_one():
    before = kernel_metrics(2e9, 5.0, 2.0, 1.5e9, stalls={})
    after = kernel_metrics(1e9, 5.0, 2.0, 1.5e9, stalls={})
    del before[ic.WARPS], after[ic.CLOCK]
    f = ic.speedup_factors(before, after)
    assert f["warps"] is None and f["clock"] is None
    assert f["product"] == pytest.approx(2.0) and f["rest"] == pytest.approx(1.0)


def test_stall_cycles_sorted_with_the_unlisted_remainder():
    m = kernel_metrics(1e9, 5.0, 2.0, 1.5e9, stalls={"selected": 1.0, "wait": 2.0, "barrier": 0.5})
    assert ic.stall_cycles(m) == {"wait": 2.0, "selected": 1.0, "barrier": 0.5, "other": pytest.approx(1.5)}
    before = kernel_metrics(1e9, 5.0, 2.0, 1.5e9, stalls={"wait": 3.0, "selected": 1.0})
    after = kernel_metrics(1e9, 3.0, 2.0, 1.5e9, stalls={"wait": 1.0, "selected": 1.0})
    assert ic.stall_changes(before, after, top=1) == [("wait", 3.0, 1.0)]


def test_counter_row_finds_an_ablation_or_none():
    entry = {"ncu": {"rows": [{"D": 64, "deferred_norm": True, "use_exp2": True, "metrics": {"x": 1}}]}}
    assert ic.counter_row(entry, 64, deferred_norm=True, use_exp2=True) == {"x": 1}
    assert ic.counter_row(entry, 64, deferred_norm=True, use_exp2=False) is None
    assert ic.counter_row({"rows": []}, 64, deferred_norm=True, use_exp2=True) is None
