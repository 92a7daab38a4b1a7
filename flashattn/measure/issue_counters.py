"""Why one kernel is faster than another, from the warp schedulers' counters (notebook 07, measurement
'normalization_exp2', its ``ncu`` part).

Every SM has four schedulers; each issues at most one warp instruction per cycle. Over a kernel, a
scheduler is busy for about

    cycles = (instructions it issues) × (cycles a warp waits between two of its instructions)
             ÷ (warps it holds),

which is how Nsight Compute defines ``smsp__average_warp_latency_per_inst_issued`` (the total of the warps'
resident cycles over the instructions issued). A speed-up between two kernels therefore splits into
factors: fewer instructions, fewer cycles of waiting per instruction (split again by stall reason), more
warps to switch between, a faster clock; whatever the product leaves over (idle schedulers at the end of
the grid, for instance) is the rest.
"""

from __future__ import annotations

from flashattn.measure import recorded

INSTRUCTIONS = "smsp__inst_executed.sum"
LATENCY = "smsp__average_warp_latency_per_inst_issued.ratio"
WARPS = "smsp__warps_active.avg.per_cycle_active"
CLOCK = "sm__cycles_elapsed.avg.per_second"
DURATION = "gpu__time_duration.sum"
STALL_PREFIX, STALL_SUFFIX = "smsp__average_warps_issue_stalled_", "_per_issue_active.ratio"


def counter_row(entry: dict, D: int, *, deferred_norm: bool, use_exp2: bool) -> dict | None:
    """The Nsight Compute metrics of one ablation in a recorded 'normalization_exp2' entry, or None
    (no counters recorded, or not this configuration)."""
    for row in (entry.get("ncu") or {}).get("rows", []):
        if (row["D"], row["deferred_norm"], row["use_exp2"]) == (D, deferred_norm, use_exp2):
            return row["metrics"]
    return None


def stall_cycles(metrics: dict) -> dict[str, float]:
    """Cycles per issued instruction a warp spent stalled, by reason (largest first), with ``"other"`` for
    what the listed reasons leave of the total latency (reasons not collected)."""
    stalls = {}
    for name, value in metrics.items():
        number = recorded.number(value)
        if name.startswith(STALL_PREFIX) and name.endswith(STALL_SUFFIX) and number is not None:
            stalls[name[len(STALL_PREFIX):-len(STALL_SUFFIX)]] = number
    total = recorded.number(metrics.get(LATENCY))
    out = dict(sorted(stalls.items(), key=lambda kv: -kv[1]))
    if total is not None:
        out["other"] = max(0.0, total - sum(stalls.values()))
    return out


def speedup_factors(before: dict, after: dict) -> dict:
    """The speed-up from ``before`` to ``after`` (two kernels' metrics) and the factors it splits into.

    Returns ``{"measured", "instructions", "latency", "warps", "clock", "product", "rest"}``: each a ratio
    above 1 when it favours ``after`` (``measured`` = time before ÷ time after; ``instructions`` =
    instructions before ÷ after; ``latency`` = cycles per instruction before ÷ after; ``warps`` = warps per
    scheduler after ÷ before; ``clock`` = clock after ÷ before). ``product`` multiplies the four factors;
    ``rest`` = measured ÷ product. A factor whose metric was not collected is None and counts as 1 in the
    product.
    """
    def ratio(name, invert=False):
        a, b = recorded.number(before.get(name)), recorded.number(after.get(name))
        if a is None or b is None or a <= 0 or b <= 0:
            return None
        return b / a if invert else a / b

    factors = {"measured": ratio(DURATION), "instructions": ratio(INSTRUCTIONS), "latency": ratio(LATENCY),
               "warps": ratio(WARPS, invert=True), "clock": ratio(CLOCK, invert=True)}
    product = 1.0
    for key in ("instructions", "latency", "warps", "clock"):
        product *= factors[key] if factors[key] is not None else 1.0
    factors["product"] = product
    factors["rest"] = None if factors["measured"] is None else factors["measured"] / product
    return factors


def stall_changes(before: dict, after: dict, top: int = 5) -> list[tuple[str, float, float]]:
    """``(reason, cycles per instruction before, after)`` for the reasons that changed most (absolute)."""
    a, b = stall_cycles(before), stall_cycles(after)
    reasons = sorted(set(a) | set(b), key=lambda r: -abs(a.get(r, 0.0) - b.get(r, 0.0)))
    return [(r, a.get(r, 0.0), b.get(r, 0.0)) for r in reasons[:top]]
