"""HBM traffic model: the global-memory bytes each kernel of the course asks for.

The model counts what the kernels in ``flashattn/kernels/`` request from global memory *as written*,
with no cache reuse: every ``tl.load`` of a row is a read of that row, every ``tl.store`` a write.
A real GPU serves some of those requests from L2, so a profiler's DRAM counters can read less; the
model is what the loop order asks of the memory system, which is the thing the loop order controls.
One consequence worth seeing: at equal block sizes v2 *requests* about as many bytes as v1 (it
re-reads K and V once per Q block where v1 re-reads Q and O once per K block); what it saves is the
writes (O once instead of once per K/V block) and v1's l/m traffic. A profiler's DRAM bytes for v2
are far lower because the Q-block programs that run together share K/V blocks through L2.

Notation (one (batch, head) pair is a "bh"):

* ``Tr = ceil(N / block_m)`` query blocks, ``Tc = ceil(N / block_n)`` key/value blocks;
* ``X = B·H·N·D·dtype_bytes``: the bytes of one of Q, K, V, O;
* ``L = B·H·N·4``: the bytes of one float32 row statistic (v1's running sum l or running max m).

Rows past N in the last block are masked in the kernels and never fetched, so the model counts only
the real rows of each block; for N a multiple of the block sizes the counts reduce to the formulas
in the docstring of :func:`hbm_bytes`.
"""

from __future__ import annotations

import itertools
import math
import numbers
from dataclasses import dataclass, field

VARIANTS = ("naive", "v1", "v2", "v2_kt", "v2_kt_view", "v2_padded")
STAT_BYTES = 4  # l and m (v1) and the scores S (naive) are float32 whatever the input dtype

_INT_ARGS = ("B", "H", "N", "D", "dtype_bytes", "block_m", "block_n")


# --- validation -------------------------------------------------------------------------------


def _check_variant(variant) -> str:
    if not isinstance(variant, str):
        raise TypeError(f"variant must be a str, got {type(variant).__name__} {variant!r}; "
                        f"accepted: {', '.join(VARIANTS)}")
    if variant not in VARIANTS:
        raise ValueError(f"unknown variant {variant!r}; accepted: {', '.join(VARIANTS)}")
    return variant


def _check_problem(problem: dict, causal) -> dict:
    checked = {}
    for name in _INT_ARGS:
        value = problem[name]
        if isinstance(value, bool) or not isinstance(value, numbers.Integral):
            raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
        if value <= 0:
            raise ValueError(f"{name} must be a positive int, got {value}")
        checked[name] = int(value)
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be True or False, got {type(causal).__name__} {causal!r}")
    return checked


# --- the model --------------------------------------------------------------------------------


def _block_rows(n: int, block: int) -> list[int]:
    """Real (unmasked) rows of each block: ``min(block, n - start)``."""
    return [min(block, n - start) for start in range(0, n, block)]


def _v1_visit_rows(N: int, bm: int, bn: int, causal: bool) -> int:
    """Sum over the (Q block i, K block j) pairs the v1 kernel visits of the real rows of block i.

    Causal: K block j visits Q block i iff ``j·bn <= i·bm + bm - 1`` (the kernel starts its inner
    loop at ``lo = (j·bn // bm)·bm``), i.e. Q block i is visited by ``(i·bm + bm - 1) // bn + 1``
    K blocks, capped at Tc.
    """
    tc = math.ceil(N / bn)
    rows = _block_rows(N, bm)
    if not causal:
        return tc * N
    return sum(r * min(tc, (i * bm + bm - 1) // bn + 1) for i, r in enumerate(rows))


def _v2_kv_rows(N: int, bm: int, bn: int, causal: bool) -> int:
    """Sum over Q blocks of the real K (or V) rows the v2 kernel loads for that block.

    Causal: Q block i loads K/V blocks ``j`` with ``j·bn < hi = min(N, (i+1)·bm)`` (``hi`` in
    kernels/v2.py); those blocks hold ``min(ceil(hi/bn)·bn, N)`` real rows.
    """
    tr = math.ceil(N / bm)
    if not causal:
        return tr * N
    total = 0
    for i in range(tr):
        hi = min(N, (i + 1) * bm)
        total += min(math.ceil(hi / bn) * bn, N)
    return total


def traffic_breakdown(variant: str, *, B, H, N, D, dtype_bytes, block_m, block_n,
                      causal=False) -> dict[str, dict[str, int]]:
    """Bytes read and written per tensor: ``{"Q": {"read": .., "write": ..}, "K": .., ...}``.

    Tensors that a variant does not touch are left out. :func:`hbm_bytes` is the sum over tensors.
    """
    variant = _check_variant(variant)
    p = _check_problem(dict(B=B, H=H, N=N, D=D, dtype_bytes=dtype_bytes, block_m=block_m,
                            block_n=block_n), causal)
    bh, N, bm, bn = p["B"] * p["H"], p["N"], p["block_m"], p["block_n"]
    row = p["D"] * p["dtype_bytes"]  # bytes of one row of Q, K, V or O
    x = bh * N * row  # one of Q, K, V, O
    tr, tc = math.ceil(N / bm), math.ceil(N / bn)

    def rw(read=0, write=0):
        return {"read": read, "write": write}

    if variant == "naive":
        s = bh * N * N * STAT_BYTES  # scores, float32
        pm = bh * N * N * p["dtype_bytes"]  # probabilities, in the input dtype
        return {
            # scores_kernel: every (Q block, K block) tile loads its Q rows and its K rows
            "Q": rw(read=tc * x),
            "K": rw(read=tr * x),
            # written once by scores_kernel, read three times by softmax_kernel (max, sum, write)
            "S": rw(read=3 * s, write=s),
            # written by softmax_kernel, read once by pv_kernel
            "P": rw(read=pm, write=pm),
            # pv_kernel: every Q block walks over all of V
            "V": rw(read=tr * x),
            "O": rw(write=x),
        }

    if variant == "v1":
        visits = bh * _v1_visit_rows(N, bm, bn, causal)  # (bh, row) visits of the inner loop
        stat = visits * STAT_BYTES
        return {
            "K": rw(read=x),  # each K/V block loaded once per program, before the inner loop
            "V": rw(read=x),
            "Q": rw(read=visits * row),
            "O": rw(read=visits * row, write=visits * row),  # read, updated, written back
            "l": rw(read=stat, write=stat),
            "m": rw(read=stat, write=stat),
        }

    # the v2 family: one program per Q block; Q loaded once, K/V blocks streamed, O written once
    kv = bh * _v2_kv_rows(N, bm, bn, causal) * row
    parts = {"Q": rw(read=x), "K": rw(read=kv), "V": rw(read=kv), "O": rw(write=x)}
    if variant == "v2_kt":
        parts["K^T copy"] = rw(read=x, write=x)  # k.transpose(-1, -2).contiguous() on the host
    return parts


def hbm_bytes(variant: str, *, B, H, N, D, dtype_bytes, block_m, block_n, causal=False) -> dict[str, int]:
    """Global-memory bytes the kernel(s) of ``variant`` request, with no cache reuse.

    Returns ``{"read": int, "write": int}``. Non-causal, with N a multiple of both block sizes
    (otherwise only the real rows of the last block count):

    * ``naive`` (three kernels, as kernels/naive.py is written): scores_kernel reads Q ``Tc`` times
      and K ``Tr`` times and writes S (B·H·N² float32); softmax_kernel reads S three times (max pass,
      sum pass, write pass) and writes P (B·H·N²·dtype_bytes); pv_kernel reads P once and V ``Tr``
      times and writes O. read = Tc·X + 2·Tr·X + 3·S + P, write = S + P + X. Causal does **no**
      skipping here (the tiles are masked, not skipped), so causal counts equal non-causal ones.
    * ``v1``: read = K + V + Tc·(Q + O + 2L), write = Tc·(O + 2L). Causal: the kernel skips the
      (Q block i, K block j) pairs with ``j·block_n > i·block_m + block_m - 1`` (entirely above the
      diagonal); only the visited pairs are counted.
    * ``v2`` and ``v2_kt_view`` (same bytes, K read through a transposed view): read = Q + Tr·(K + V),
      write = O. Causal: Q block i reads only the K/V blocks that start before
      ``min(N, (i+1)·block_m)``.
    * ``v2_kt``: as ``v2`` plus the host copy ``k.transpose(-1, -2).contiguous()``, which reads K
      once and writes it once (+X read, +X write).
    * ``v2_padded``: as ``v2``. The head dimension is padded inside the kernel with masked loads,
      and masked lanes are not fetched, so the padding costs registers and FLOPs, not bytes.

    Not counted: PyTorch's initialisation of v1's O, l and m (``zeros``/``full`` before the kernel,
    one more write of O + 2L) and the allocation of outputs.
    """
    parts = traffic_breakdown(variant, B=B, H=H, N=N, D=D, dtype_bytes=dtype_bytes,
                              block_m=block_m, block_n=block_n, causal=causal)
    return {
        "read": sum(part["read"] for part in parts.values()),
        "write": sum(part["write"] for part in parts.values()),
    }


def traffic_table(variants=VARIANTS, **problem) -> list[dict]:
    """One row per variant: ``{"variant", "read", "write", "total"}`` for the same problem."""
    if isinstance(variants, str):
        variants = (variants,)
    rows = []
    for variant in variants:
        counts = hbm_bytes(variant, **problem)
        rows.append({"variant": variant, **counts, "total": counts["read"] + counts["write"]})
    return rows


def savings(new: dict, old: dict) -> dict[str, float]:
    """Fraction of the bytes ``new`` saves against ``old``: ``1 - new/old`` for read, write, total.

    Both arguments are :func:`hbm_bytes` results. 0.93 means "93 % less"; negative means more.
    """
    for name, counts in (("new", new), ("old", old)):
        if not isinstance(counts, dict) or not {"read", "write"} <= counts.keys():
            raise TypeError(f"{name} must be a hbm_bytes() result with 'read' and 'write', got {counts!r}")
    out = {}
    for key in ("read", "write", "total"):
        n = new[key] if key != "total" else new["read"] + new["write"]
        o = old[key] if key != "total" else old["read"] + old["write"]
        out[key] = 1.0 - n / o if o else float("nan")
    return out


def describe_savings(new_name: str, new: dict, old_name: str, old: dict) -> str:
    """A sentence: ``"v2 reads 2.4 % less and writes 98.4 % less than v1"``."""
    s = savings(new, old)

    def phrase(verb, frac):
        return f"{verb} {abs(frac) * 100:.1f} % {'less' if frac >= 0 else 'more'}"

    return f"{new_name} {phrase('reads', s['read'])} and {phrase('writes', s['write'])} than {old_name}"


def format_bytes(n: float, binary: bool = False) -> str:
    """``11580000000 -> '11.58 GB'`` (SI units; ``binary=True`` gives KiB, MiB, GiB, TiB)."""
    base, units = (1024, ("B", "KiB", "MiB", "GiB", "TiB", "PiB")) if binary else (
        1000, ("B", "kB", "MB", "GB", "TB", "PB"))
    value = float(n)
    for unit in units:
        if abs(value) < base or unit == units[-1]:
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.2f} {unit}"
        value /= base
    raise AssertionError("unreachable")


def format_table(rows: list[dict], binary: bool = False) -> str:
    """A plain-text table of :func:`traffic_table` rows."""
    lines = [f"{'variant':<12}{'read':>12}{'write':>12}{'total':>12}"]
    for r in rows:
        lines.append(f"{r['variant']:<12}" + "".join(
            f"{format_bytes(r[k], binary):>12}" for k in ("read", "write", "total")))
    return "\n".join(lines)


def n_sweep(n_max: int, n_min: int = 128) -> list[int]:
    """Powers of two from ``n_min`` up to ``n_max`` (both included when they are powers of two)."""
    if n_min <= 0 or n_max < n_min:
        raise ValueError(f"need 0 < n_min <= n_max, got n_min={n_min}, n_max={n_max}")
    values, n = [], 1 << (n_min - 1).bit_length()
    while n <= n_max:
        values.append(n)
        n *= 2
    return values


# --- figure and summary (the computation behind widgets.traffic_widget) -----------------------


def plot_traffic(N_values, D, dtype_bytes, block_m, block_n, B, H, causal=False,
                 variants=("naive", "v1", "v2")):
    """Bytes read (left) and written (right) per variant against N, both axes logarithmic.

    Returns a matplotlib Figure with one line per variant on each axis, labelled by variant name.
    """
    import matplotlib.pyplot as plt

    from flashattn.teaching import plots

    N_values = list(N_values)
    if not N_values:
        raise ValueError("N_values is empty")
    plots.use_style()
    fig, (ax_read, ax_write) = plt.subplots(1, 2, figsize=(10, 4), sharex=True)
    problem = dict(D=D, dtype_bytes=dtype_bytes, block_m=block_m, block_n=block_n, B=B, H=H, causal=causal)
    for variant in variants:
        counts = [hbm_bytes(variant, N=n, **problem) for n in N_values]
        style = dict(color=plots.color(variant), marker="o", markersize=3, label=variant)
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


def traffic_summary(N, D, dtype_bytes, block_m, block_n, B, H, causal=False, new="v2", old="v1") -> dict:
    """How much ``new`` (default v2) saves against ``old`` (default v1) at one problem size.

    Returns ``{"new", "old", "new_bytes", "old_bytes", "read_saving", "write_saving",
    "total_saving", "text"}``; savings are fractions (0.93 = 93 % less).
    """
    problem = dict(B=B, H=H, N=N, D=D, dtype_bytes=dtype_bytes, block_m=block_m, block_n=block_n,
                   causal=causal)
    new_bytes, old_bytes = hbm_bytes(new, **problem), hbm_bytes(old, **problem)
    s = savings(new_bytes, old_bytes)
    return {
        "new": new, "old": old, "new_bytes": new_bytes, "old_bytes": old_bytes,
        "read_saving": s["read"], "write_saving": s["write"], "total_saving": s["total"],
        "text": f"N={N}: " + describe_savings(new, new_bytes, old, old_bytes),
    }


# --- the source post's numbers: which problem shape could they come from? ---------------------

POST_LABEL = "as reported by the post (RTX 2070, float32)"
POST_REPORTED = {  # bytes, SI units as printed by the post; show them only labelled with POST_LABEL
    "v1_read": 11.58e9,
    "v1_write": 5.54e9,
    "v2_read": 412.18e6,
    "v2_write": 80e6,  # "~80 MB"
}
QUANTITIES = tuple(POST_REPORTED)


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
    :data:`POST_REPORTED`, the numbers as reported by the post, RTX 2070, float32). Every shape of
    the grid (non-causal, v1 and v2 at the same block sizes) is scored by its largest relative error.
    Ties on that are broken by the summed relative error, then by plausibility (equal blocks, N a
    power of two, blocks near 64). The result holds the best shape for all four numbers, the best
    shape for each three of them (``leave_one_out``) and the number whose omission helps the others
    most (``misfit``). The model
    depends on B and H only through B·H, so every B·H of the grid is evaluated once (vectorised).
    """
    import numpy as np

    reported = dict(POST_REPORTED if reported is None else reported)
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


# --- the model against Nsight Compute's counters (notebook 09, measurement 'traffic_measured') ---------
#
# A profiler sees three different numbers for the same kernel:
#   * L2 requests (lts__t_sectors_srcunit_tex_op_read/_write × 32 bytes): what the SMs asked of the
#     memory system after the L1; this is what the model above counts;
#   * DRAM bytes (dram__bytes_read/_write): what missed in L2 (reads) and what L2 evicted (writes);
#   * the compulsory bytes: each tensor a kernel touches read (or written) exactly once, the DRAM
#     traffic of a perfect cache.

from flashattn.measure.profile import SECTOR_BYTES  # noqa: E402  (this section's own import)

HOST_SIDE_PARTS = ("K^T copy",)  # done by PyTorch before the kernel: a profile of the kernel does not see it


def kernel_hbm_bytes(variant: str, **problem) -> dict[str, int]:
    """:func:`hbm_bytes` of the Triton kernel(s) alone, without host-side copies (v2_kt's K^T copy)."""
    parts = traffic_breakdown(variant, **problem)
    kept = [part for name, part in parts.items() if name not in HOST_SIDE_PARTS]
    return {"read": sum(p["read"] for p in kept), "write": sum(p["write"] for p in kept)}


def naive_kernel_bytes(*, B, H, N, D, dtype_bytes, block_m, block_n, causal=False) -> dict[str, dict[str, int]]:
    """The naive model split by kernel: ``{"scores_kernel": {"read", "write"}, "softmax_kernel", "pv_kernel"}``."""
    parts = traffic_breakdown("naive", B=B, H=H, N=N, D=D, dtype_bytes=dtype_bytes, block_m=block_m,
                              block_n=block_n, causal=causal)
    return {
        "scores_kernel": {"read": parts["Q"]["read"] + parts["K"]["read"], "write": parts["S"]["write"]},
        "softmax_kernel": {"read": parts["S"]["read"], "write": parts["P"]["write"]},
        "pv_kernel": {"read": parts["P"]["read"] + parts["V"]["read"], "write": parts["O"]["write"]},
    }


def compulsory_bytes(variant: str, *, B, H, N, D, dtype_bytes) -> dict[str, int]:
    """DRAM bytes with a perfect cache inside each kernel: every tensor read or written exactly once.

    v2 family: read Q, K, V, write O. v1: also reads its O, l and m (initialised by PyTorch before the
    kernel) and writes them. naive (summed over its three kernels): read Q, K, V, S and P, write S, P
    and O. Host-side copies (v2_kt's K^T) are not counted.
    """
    variant = _check_variant(variant)
    p = _check_problem(dict(B=B, H=H, N=N, D=D, dtype_bytes=dtype_bytes, block_m=1, block_n=1), False)
    bh = p["B"] * p["H"]
    x = bh * p["N"] * p["D"] * p["dtype_bytes"]
    stat = bh * p["N"] * STAT_BYTES
    if variant == "naive":
        s, pm = bh * p["N"] ** 2 * STAT_BYTES, bh * p["N"] ** 2 * p["dtype_bytes"]
        return {"read": 3 * x + s + pm, "write": s + pm + x}
    if variant == "v1":
        return {"read": 4 * x + 2 * stat, "write": x + 2 * stat}
    return {"read": 3 * x, "write": x}


def _value(metrics: dict, name: str) -> float | None:
    value = (metrics or {}).get(name)
    if isinstance(value, dict):
        value = value.get("value")
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def measured_bytes(metrics: dict) -> dict[str, float | None]:
    """Bytes from Nsight Compute metrics: ``{"dram_read", "dram_write", "l2_read", "l2_write", "l2_all"}``.

    ``l2_read``/``l2_write`` are the SMs' requests to L2 (sectors × 32 bytes), ``l2_all`` is
    ``lts__t_bytes.sum`` (every L2 lookup, any source). A metric that was not collected gives None.
    """
    def sectors(name):
        v = _value(metrics, name)
        return None if v is None else v * SECTOR_BYTES

    return {
        "dram_read": _value(metrics, "dram__bytes_read.sum"),
        "dram_write": _value(metrics, "dram__bytes_write.sum"),
        "l2_read": sectors("lts__t_sectors_srcunit_tex_op_read.sum"),
        "l2_write": sectors("lts__t_sectors_srcunit_tex_op_write.sum"),
        "l2_all": _value(metrics, "lts__t_bytes.sum"),
    }


def _ratio(a, b):
    return None if a is None or b in (None, 0) else a / b


def compare_with_model(row: dict) -> dict:
    """One measured row (``traffic_measured``) against its model: bytes and ratios.

    Returns ``{"variant", "size", "model", "compulsory", "measured", "l2_over_model" {read, write,
    total}, "dram_over_model" {read, write}, "dram_over_compulsory" {read, write}}``; ratios are None
    where a number is missing. ``model`` is the kernels' request count (:func:`kernel_hbm_bytes`).
    """
    model, comp, m = row["model_kernels"], row["compulsory"], row["measured"]
    l2_total = None if m["l2_read"] is None or m["l2_write"] is None else m["l2_read"] + m["l2_write"]
    return {
        "variant": row["variant"], "size": row.get("size"), "model": model, "compulsory": comp, "measured": m,
        "l2_over_model": {"read": _ratio(m["l2_read"], model["read"]), "write": _ratio(m["l2_write"], model["write"]),
                          "total": _ratio(l2_total, model["read"] + model["write"])},
        "dram_over_model": {"read": _ratio(m["dram_read"], model["read"]),
                            "write": _ratio(m["dram_write"], model["write"])},
        "dram_over_compulsory": {"read": _ratio(m["dram_read"], comp["read"]),
                                 "write": _ratio(m["dram_write"], comp["write"])},
    }


def _fmt(n) -> str:
    return "-" if n is None else format_bytes(n)


def _pct(r) -> str:
    return "-" if r is None else f"{r * 100:.0f} %"


def format_measured_table(rows: list[dict]) -> str:
    """Model, L2 requests and DRAM bytes side by side, one line per measured row (error rows say so)."""
    head = (f"{'size':<6}{'variant':<10}{'shape':<18}{'':<6}{'model':>11}{'L2 req.':>11}{'L2/model':>9}"
            f"{'DRAM':>11}{'DRAM/model':>11}{'compulsory':>12}")
    lines = [head]
    for row in rows:
        shape = f"{row['B']}×{row['H']}×{row['N']}×{row['D']}"
        if "error" in row:
            lines.append(f"{row.get('size', ''):<6}{row['variant']:<10}{shape:<18}error: {row['error'][:60]}")
            continue
        c = compare_with_model(row)
        for op in ("read", "write"):
            lines.append(
                f"{row.get('size', '') if op == 'read' else '':<6}{row['variant'] if op == 'read' else '':<10}"
                f"{shape if op == 'read' else '':<18}{op:<6}{_fmt(c['model'][op]):>11}"
                f"{_fmt(c['measured']['l2_' + op]):>11}{_pct(c['l2_over_model'][op]):>9}"
                f"{_fmt(c['measured']['dram_' + op]):>11}{_pct(c['dram_over_model'][op]):>11}"
                f"{_fmt(c['compulsory'][op]):>12}")
    return "\n".join(lines)


def measured_summary(rows: list[dict], size: str = "large", tolerance: float = 0.15) -> dict:
    """The two checks of notebook 09 on the rows of one size.

    Returns ``{"l2_vs_model": {variant: total L2 requests ÷ model}, "within_tolerance": {variant: bool},
    "v2_over_v1_dram_read": float | None, "text": str}``.
    """
    ok = [r for r in rows if r.get("size") == size and "error" not in r]
    by = {r["variant"]: compare_with_model(r) for r in ok}
    l2 = {v: c["l2_over_model"]["total"] for v, c in by.items()}
    within = {v: r is not None and abs(r - 1) <= tolerance for v, r in l2.items()}
    ratio = None
    if "v1" in by and "v2" in by:
        ratio = _ratio(by["v2"]["measured"]["dram_read"], by["v1"]["measured"]["dram_read"])
    lines = [f"L2 requests ÷ model ({size}): " + ", ".join(
        f"{v} {_pct(r)}" + ("" if within[v] else " (outside ±" + f"{tolerance:.0%})") for v, r in l2.items())]
    if ratio is not None:
        lines.append(f"v2's DRAM reads are {ratio:.1%} of v1's ({size}).")
    return {"l2_vs_model": l2, "within_tolerance": within, "v2_over_v1_dram_read": ratio, "text": "\n".join(lines)}


def plot_measured_traffic(rows: list[dict], size: str = "large", caption_text: str | None = None):
    """Bars per variant (reads left, writes right): model request, L2 requests, DRAM, compulsory.

    Log scale; error rows are left out. Returns a matplotlib Figure.
    """
    import matplotlib.pyplot as plt

    from flashattn.teaching import plots

    ok = [r for r in rows if r.get("size") == size and "error" not in r]
    if not ok:
        raise ValueError(f"no measured rows of size {size!r} without errors")
    plots.use_style()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    series = (("model (request)", "model_kernels", None, "#c7c7c7"), ("L2 requests", "measured", "l2_", "#6baed6"),
              ("DRAM", "measured", "dram_", "#08519c"), ("compulsory", "compulsory", None, "#fdae6b"))
    width = 0.2
    for ax, op in zip(axes, ("read", "write"), strict=True):
        for i, row in enumerate(ok):
            for j, (label, key, prefix, colour) in enumerate(series):
                value = row[key][prefix + op] if prefix else row[key][op]
                if value:
                    ax.bar(i + (j - 1.5) * width, value, width, color=colour, edgecolor="black", linewidth=0.5,
                           label=label if i == 0 else None)
        ax.set_xticks(range(len(ok)), [f"{r['variant']}\nB={r['B']} H={r['H']}" for r in ok], fontsize=8)
        ax.set_yscale("log")
        ax.set_title(f"bytes {'read' if op == 'read' else 'written'} ({size} size, N={ok[0]['N']})")
        ax.set_ylabel("bytes")
    axes[0].legend(fontsize=8)
    if caption_text:
        plots.caption(axes[0], caption_text)
    fig.tight_layout()
    return fig


def l2_served_fraction(dram_read: float, model_read: float, compulsory_read: float) -> float | None:
    """Of the repeated reads (requests beyond the compulsory bytes), the fraction L2 served.

    ``1 - (dram_read - compulsory_read) / (model_read - compulsory_read)``: 1 when DRAM saw only the
    compulsory bytes, 0 when every request went to DRAM. None when the model has no repeated reads.
    """
    repeats = model_read - compulsory_read
    if repeats <= 0:
        return None
    return 1.0 - (dram_read - compulsory_read) / repeats
