"""The source post's own numbers, labelled as the post's, and the search for the problem shape behind them.

The post ("Reimplementing FlashAttention for performance and giggles", RTX 2070, float32, as summarised
in the course's seed) reports traffic, counters and timings without the problem shape it measured.
``POST_REPORTED`` holds every number the course quotes from it, grouped by unit; show them only with
``POST_LABEL``. :func:`fit_source_problem` searches for shapes under which the traffic model
(``flashattn.traffic.hbm_bytes``) gives the post's four traffic numbers; :func:`post_derived` reads its
shared-memory counters, :func:`post_time_ratios` its timings, and :func:`shared_bandwidth_check` puts its
shared-memory bandwidth next to 32 banks × 4 bytes per clock.
"""

from __future__ import annotations

import itertools
import math
import numbers
from dataclasses import dataclass, field

from flashattn.models.roofline import SHARED_BYTES_PER_CLOCK_PER_SM
from flashattn.models.traffic import STAT_BYTES, format_bytes

POST_LABEL = "as reported by the post (RTX 2070, float32)"
POST_REPORTED = {  # show only with POST_LABEL
    # HBM bytes (SI units, as printed by the post)
    "traffic_bytes": {"v1_read": 11.58e9, "v1_write": 5.54e9, "v2_read": 412.18e6, "v2_write": 80e6},  # "~80 MB"
    # Nsight Compute shared-memory counters of v2 (K read row-major)
    "shared_memory": {"shared_load_requests": 293_601_280, "bank_conflicts": 1_174_579_308,
                      "wavefronts": 1_845_667_948},
    "time_ms": {"v1": 166.47, "v2": 177.25, "v2_kt": 34.00},  # v2_kt: K transposed on the host
    "occupancy": {"v1": 0.25, "v2": 0.63},  # achieved, fraction of the SM's warps
    "conflict_ways": {"v2": 6.3, "v2_padded": 3.4},  # average ways of a conflicting shared load
    "mio_throttle_v2_kt": {"stall_share": 0.4397, "cycles_per_warp": 6.7},  # what stalled after the transpose
    # the speed-ups the summary quotes, in per cent: "+6 %" for v2 over v1, "+145 %" for the transposed K
    "quoted_gain_pct": {"v2_over_v1": 6, "v2_kt": 145},
    # its shared-memory bandwidth: "1-2 TB/s per SM", and "100+ TB/s" for the A100's 108 SMs together
    "shared_bandwidth_bytes_per_s": {"per_sm_low": 1e12, "per_sm_high": 2e12, "a100_whole_gpu": 100e12},
    "a100": {"multiprocessors": 108},
}
QUANTITIES = tuple(POST_REPORTED["traffic_bytes"])  # what fit_source_problem fits


def post_derived() -> dict:
    """What follows from the post's three shared-memory counters: average wavefronts per request, conflict share."""
    r = POST_REPORTED["shared_memory"]
    return {
        "wavefronts_per_request": r["wavefronts"] / r["shared_load_requests"],
        "conflict_share": r["bank_conflicts"] / r["wavefronts"],
        "conflict_free_per_request": (r["wavefronts"] - r["bank_conflicts"]) / r["shared_load_requests"],
    }


def post_time_ratios() -> dict:
    """Ratios of the post's three timings (shape-free, so they compare with ours): v2 ÷ v1, v2 ÷ v2_kt, v1 ÷ v2_kt."""
    t = POST_REPORTED["time_ms"]
    return {"v2_over_v1": t["v2"] / t["v1"], "v2_over_v2_kt": t["v2"] / t["v2_kt"],
            "v1_over_v2_kt": t["v1"] / t["v2_kt"]}


def post_mio_cycles_between_instructions() -> float:
    """The post's v2_kt: 6.7 cycles of MIO-throttle stall are 43.97 % of the cycles a warp waits between two
    instructions (Nsight Compute's wording), so it waited about 15 cycles in all."""
    m = POST_REPORTED["mio_throttle_v2_kt"]
    return m["cycles_per_warp"] / m["stall_share"]


def shared_bandwidth_check(multiprocessors: int, max_sm_clock_mhz: float) -> dict:
    """The post's shared-memory bandwidth against 32 banks × 4 bytes per clock per SM at a GPU's clock.

    Returns ``per_sm_gbps`` and ``whole_gpu_gbps`` (derived), ``claim_over_derived`` (the post's per-SM
    range divided by the derived per-SM bandwidth, low and high), ``clock_needed_ghz`` (the clock at which
    128 bytes per clock would give the post's per-SM range) and ``a100_whole_gpu_gbps`` (the A100's 108 SMs
    at this clock, for the post's "100+ TB/s").
    """
    for name, value in (("multiprocessors", multiprocessors), ("max_sm_clock_mhz", max_sm_clock_mhz)):
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or not value > 0:
            raise ValueError(f"{name} must be a positive number, got {value!r}")
    claim = POST_REPORTED["shared_bandwidth_bytes_per_s"]
    per_sm = SHARED_BYTES_PER_CLOCK_PER_SM * max_sm_clock_mhz * 1e6  # bytes per second
    return {
        "bytes_per_clock_per_sm": SHARED_BYTES_PER_CLOCK_PER_SM,
        "per_sm_gbps": per_sm / 1e9,
        "whole_gpu_gbps": per_sm * multiprocessors / 1e9,
        "claim_over_derived": (claim["per_sm_low"] / per_sm, claim["per_sm_high"] / per_sm),
        "clock_needed_ghz": (claim["per_sm_low"] / SHARED_BYTES_PER_CLOCK_PER_SM / 1e9,
                             claim["per_sm_high"] / SHARED_BYTES_PER_CLOCK_PER_SM / 1e9),
        "a100_whole_gpu_gbps": per_sm * POST_REPORTED["a100"]["multiprocessors"] / 1e9,
    }


@dataclass(frozen=True)
class ShapeFit:
    """One problem shape, the model's four numbers for it and their errors against the reported ones."""

    shape: dict  # B, H, N, D, dtype_bytes, block_m, block_n (one representative of the ties)
    model: dict  # quantity -> bytes from hbm_bytes
    reported: dict  # quantity -> reported bytes
    rel_error: dict  # quantity -> model / reported - 1 (signed)
    bh_pairs: tuple = ()  # every (B, H) of the grid with this B·H
    ties: int = 1  # shapes of the grid that fit equally well (B·H split differently, other blocks, ...)
    alternatives: tuple = ()  # up to 5 other tied shapes as dicts of B·H, N, D, block_m, block_n

    @property
    def worst(self) -> tuple[str, float]:
        """The quantity with the largest relative error, and that error."""
        name = max(self.rel_error, key=lambda k: abs(self.rel_error[k]))
        return name, self.rel_error[name]

    def describe(self) -> str:
        s = self.shape
        pairs = ", ".join(f"{b}×{h}" for b, h in self.bh_pairs)
        lines = [f"B·H={s['B'] * s['H']} (B×H: {pairs}) N={s['N']} D={s['D']} "
                 f"block_m={s['block_m']} block_n={s['block_n']}"]
        if self.ties > 1:
            others = "; ".join(f"B·H={a['BH']} N={a['N']} D={a['D']} {a['block_m']}×{a['block_n']}"
                               for a in self.alternatives)
            lines.append(f"  {self.ties} shapes of the grid fit equally well" + (f", e.g. {others}" if others else ""))
        for q in self.model:
            lines.append(f"  {q:<9} model {format_bytes(self.model[q]):>10}  reported "
                         f"{format_bytes(self.reported[q]):>10}  ({self.rel_error[q] * 100:+.1f} %)")
        return "\n".join(lines)


@dataclass(frozen=True)
class SourceFit:
    """Result of :func:`fit_source_problem`; ``print(fit.summary())`` in a notebook."""

    reported: dict
    tolerance: float
    searched: int  # number of (B, H, N, D, block_m, block_n) shapes tried
    all_fit: bool  # one shape reproduces every reported number within tolerance
    best: ShapeFit  # the shape whose largest error is smallest
    leave_one_out: dict  # quantity -> the best shape for the *other* three numbers
    misfit: str  # the number that fits worst: leaving it out lowers the others' largest error most
    seed_estimate: dict = field(default_factory=dict)  # the seed's back-of-envelope at leave_one_out[misfit]
    # the reported v2 read in units of O at that shape, against the model (1 + 2·Tr) and Q+K+V (3)
    v2_read_check: dict = field(default_factory=dict)
    reported_read_saving: float = float("nan")  # 1 - v2_read / v1_read from the reported numbers

    @property
    def fitting_without_misfit(self) -> bool:
        """Whether the other three numbers all fit one shape within tolerance."""
        return max(abs(e) for q, e in self.leave_one_out[self.misfit].rel_error.items()
                   if q != self.misfit) <= self.tolerance

    def summary(self) -> str:
        e = self.seed_estimate
        lines = [
            f"Numbers {POST_LABEL}: " + ", ".join(f"{q} {format_bytes(v)}" for q, v in self.reported.items()),
            f"Searched {self.searched} shapes (non-causal, dtype_bytes={self.best.shape['dtype_bytes']}); "
            f"tolerance {self.tolerance * 100:g} %.",
            f"One shape fits all four numbers: {'yes' if self.all_fit else 'no'}. Closest shape for all four:",
            self.best.describe(),
            f"The number that fits worst is {self.misfit}. Best shape for the other three "
            f"({'they fit' if self.fitting_without_misfit else 'they do not all fit'}):",
            self.leave_one_out[self.misfit].describe(),
        ]
        if e:
            lines.append(f"The seed's back-of-envelope at that shape: O = {format_bytes(e['O'])}, "
                         f"{e['blocks']} K/V blocks, read ≈ blocks·(Q+O) = {format_bytes(e['read'])}, "
                         f"write ≈ blocks·O = {format_bytes(e['write'])} (no K, V, l, m terms).")
        c = self.v2_read_check
        if c:
            lines.append(f"There the reported v2 read is {c['reported_over_O']:.2f}×O; the model (no cache reuse) "
                         f"gives {c['model_over_O']:.0f}×O, reading Q, K and V once would be 3×O. Under the "
                         f"model, v2's read/write ratio implies {c['implied_query_blocks']:.2f} query blocks.")
        lines.append(f"From the reported numbers, v2 reads {self.reported_read_saving * 100:.1f} % less than v1.")
        return "\n".join(lines)


def fit_source_problem(reported: dict | None = None, *, tolerance: float = 0.05,
                       B_values=(1, 2, 4, 8, 16, 32, 64), H_values=tuple(range(1, 33)),
                       N_values=tuple(1 << k for k in range(7, 16)) + tuple(3 << k for k in range(7, 14)),
                       D_values=(32, 64, 128), block_values=(16, 32, 64, 128),
                       dtype_bytes: int = 4) -> SourceFit:
    """Search problem shapes for one under which :func:`hbm_bytes` gives the post's four numbers.

    ``reported`` maps ``v1_read``, ``v1_write``, ``v2_read`` and ``v2_write`` to bytes (default
    ``POST_REPORTED["traffic_bytes"]``, the numbers as reported by the post, RTX 2070, float32). Every shape of
    the grid (non-causal, v1 and v2 at the same block sizes) is scored by its largest relative error.
    Ties on that are broken by the summed relative error, then by plausibility (equal blocks, N a
    power of two, blocks near 64). The result holds the best shape for all four numbers, the best
    shape for each three of them (``leave_one_out``) and the number whose omission helps the others
    most (``misfit``). The model
    depends on B and H only through B·H, so every B·H of the grid is evaluated once (vectorised).
    """
    import numpy as np

    reported = dict(POST_REPORTED["traffic_bytes"] if reported is None else reported)
    if set(reported) != set(QUANTITIES):
        raise ValueError(f"reported must have the keys {list(QUANTITIES)}, got {sorted(reported)}")
    if not all(isinstance(v, numbers.Real) and v > 0 for v in reported.values()):
        raise ValueError(f"reported values must be positive byte counts, got {reported}")
    if not 0 < tolerance < 1:
        raise ValueError(f"tolerance must be a fraction in (0, 1), got {tolerance}")

    pairs_by_bh: dict[int, list] = {}
    for b, h in itertools.product(B_values, H_values):
        pairs_by_bh.setdefault(b * h, []).append((b, h))
    bh_list = sorted(pairs_by_bh)
    n_pairs = np.array([len(pairs_by_bh[v]) for v in bh_list])

    # axes: (B·H, N, D, block_m, block_n); everything in float64 (exact below 2**53)
    bh = np.array(bh_list, dtype=np.float64)[:, None, None, None, None]
    n = np.array(N_values, dtype=np.float64)[None, :, None, None, None]
    d = np.array(D_values, dtype=np.float64)[None, None, :, None, None]
    bm = np.array(block_values, dtype=np.float64)[None, None, None, :, None]
    bn = np.array(block_values, dtype=np.float64)[None, None, None, None, :]
    x = bh * n * d * dtype_bytes
    stat = bh * n * STAT_BYTES
    tr, tc = np.ceil(n / bm), np.ceil(n / bn)
    shape = np.broadcast_shapes(x.shape, tr.shape, tc.shape)
    model = {  # the non-causal formulas of hbm_bytes (checked against it in the tests)
        "v1_read": np.broadcast_to(2 * x + tc * (2 * x + 2 * stat), shape),
        "v1_write": np.broadcast_to(tc * (x + 2 * stat), shape),
        "v2_read": np.broadcast_to(x + 2 * tr * x, shape),
        "v2_write": np.broadcast_to(x, shape),
    }
    errors = {q: np.abs(model[q] / reported[q] - 1) for q in QUANTITIES}
    weight = np.broadcast_to(n_pairs[:, None, None, None, None], shape)  # (B, H) pairs per B·H

    def plausibility(idx):  # tie-break: equal blocks, N a power of two, blocks near 64
        _, i_n, _, i_m, i_b = idx
        nv, mv, bv = N_values[i_n], block_values[i_m], block_values[i_b]
        return (mv != bv, nv & (nv - 1) != 0, abs(math.log2(bv / 64)), abs(math.log2(mv / 64)), idx)

    def best_for(qs) -> tuple[float, ShapeFit]:
        stacked = np.stack([errors[q] for q in qs])
        score, total = stacked.max(axis=0), stacked.sum(axis=0)
        low = score.min()
        near = score <= low * (1 + 1e-9) + 1e-15  # shapes as good on the largest error...
        low_total = total[near].min()  # ...then the smallest summed error among them
        near &= total <= low_total * (1 + 1e-9) + 1e-15
        tied = [tuple(int(i) for i in idx) for idx in np.argwhere(near)]
        tied.sort(key=plausibility)
        i_bh, i_n, i_d, i_m, i_b = tied[0]
        b, h = pairs_by_bh[bh_list[i_bh]][0]
        chosen = dict(B=b, H=h, N=int(N_values[i_n]), D=int(D_values[i_d]), dtype_bytes=dtype_bytes,
                      block_m=int(block_values[i_m]), block_n=int(block_values[i_b]))
        values = {q: int(model[q][tied[0]]) for q in QUANTITIES}
        alternatives = tuple(
            dict(BH=bh_list[t[0]], N=int(N_values[t[1]]), D=int(D_values[t[2]]),
                 block_m=int(block_values[t[3]]), block_n=int(block_values[t[4]]))
            for t in tied[1:] if t[3] == t[4])[:5]  # equal-block alternatives are the telling ones
        fit = ShapeFit(shape=chosen, model=values, reported=reported,
                       rel_error={q: values[q] / reported[q] - 1 for q in QUANTITIES},
                       bh_pairs=tuple(pairs_by_bh[bh_list[i_bh]]),
                       ties=int(sum(weight[t] for t in tied)), alternatives=alternatives)
        return float(low), fit

    best_score, best = best_for(QUANTITIES)
    loo = {q: best_for(tuple(o for o in QUANTITIES if o != q)) for q in QUANTITIES}
    misfit = min(QUANTITIES, key=lambda q: loo[q][0])
    s = loo[misfit][1].shape
    o_bytes = s["B"] * s["H"] * s["N"] * s["D"] * s["dtype_bytes"]
    blocks = -(-s["N"] // s["block_n"])
    v2_model = loo[misfit][1].model["v2_read"]
    v2_read_check = {
        "reported_over_O": reported["v2_read"] / o_bytes,
        "model_over_O": v2_model / o_bytes,
        "implied_query_blocks": (reported["v2_read"] / reported["v2_write"] - 1) / 2,  # read = (1 + 2·Tr)·O
    }
    return SourceFit(
        reported=reported, tolerance=tolerance, searched=int(weight.sum()),
        all_fit=best_score <= tolerance, best=best, leave_one_out={q: f for q, (_, f) in loo.items()},
        misfit=misfit,
        seed_estimate={"O": o_bytes, "blocks": blocks, "read": blocks * 2 * o_bytes, "write": blocks * o_bytes},
        v2_read_check=v2_read_check, reported_read_saving=1 - reported["v2_read"] / reported["v1_read"],
    )
