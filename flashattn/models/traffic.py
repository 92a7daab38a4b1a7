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

Which formula a variant follows is part of its record in ``flashattn.kernels.registry`` (``traffic``). The
model against Nsight Compute's counters is ``flashattn.traffic_counters``; the source post's numbers and
the search for their problem shape are ``flashattn.source_post``; the figures are in ``flashattn.plots``.
"""

from __future__ import annotations

import math
import numbers

from flashattn.kernels import registry

STAT_BYTES = 4  # l and m (v1) and the scores S (naive) are float32 whatever the input dtype

_INT_ARGS = ("B", "H", "N", "D", "dtype_bytes", "block_m", "block_n")


# --- the variants and the problem -----------------------------------------------------------


def modelled_variants() -> list[str]:
    """The variants the model covers: those registered with a traffic formula (``flashattn.kernels``)."""
    return registry.names(traffic=True)


def formula(variant) -> str:
    """The formula ``variant`` follows: "naive", "v1", "v2", or "v2_kt" (v2 plus a host copy of Kᵀ)."""
    accepted = ", ".join(modelled_variants())
    if not isinstance(variant, str):
        raise TypeError(f"variant must be a str, got {type(variant).__name__} {variant!r}; accepted: {accepted}")
    if variant not in registry.REGISTRY or registry.get(variant).traffic is None:
        raise ValueError(f"unknown variant {variant!r} (or one the traffic model does not cover); "
                         f"accepted: {accepted}")
    return registry.get(variant).traffic


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
    family = formula(variant)
    p = _check_problem(dict(B=B, H=H, N=N, D=D, dtype_bytes=dtype_bytes, block_m=block_m,
                            block_n=block_n), causal)
    bh, N, bm, bn = p["B"] * p["H"], p["N"], p["block_m"], p["block_n"]
    row = p["D"] * p["dtype_bytes"]  # bytes of one row of Q, K, V or O
    x = bh * N * row  # one of Q, K, V, O
    tr, tc = math.ceil(N / bm), math.ceil(N / bn)

    def rw(read=0, write=0):
        return {"read": read, "write": write}

    if family == "naive":
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

    if family == "v1":
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
    if family == "v2_kt":
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


def traffic_table(variants=None, **problem) -> list[dict]:
    """One row per variant (default: every variant the model covers): ``{"variant", "read", "write",
    "total"}`` for the same problem."""
    if variants is None:
        variants = modelled_variants()
    elif isinstance(variants, str):
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


def format_bytes(n: float | None, binary: bool = False) -> str:
    """Bytes for people, the one formatter of the course: ``11580000000 -> '11.58 GB'``; None -> '—'.

    SI units (powers of 1000), as the source post, Nsight Compute and every bandwidth (GB/s, TB/s) count
    bytes; ``binary=True`` (KiB, MiB, GiB: powers of 1024) for capacities the hardware sizes in powers of
    two (shared memory, L2, GPU memory).
    """
    if n is None:
        return "—"
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


# --- what a profiler can compare with the model (notebook 09) ------------------------------

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
    family = formula(variant)
    p = _check_problem(dict(B=B, H=H, N=N, D=D, dtype_bytes=dtype_bytes, block_m=1, block_n=1), False)
    bh = p["B"] * p["H"]
    x = bh * p["N"] * p["D"] * p["dtype_bytes"]
    stat = bh * p["N"] * STAT_BYTES
    if family == "naive":
        s, pm = bh * p["N"] ** 2 * STAT_BYTES, bh * p["N"] ** 2 * p["dtype_bytes"]
        return {"read": 3 * x + s + pm, "write": s + pm + x}
    if family == "v1":
        return {"read": 4 * x + 2 * stat, "write": x + 2 * stat}
    return {"read": 3 * x, "write": x}


def l2_served_fraction(dram_read: float, model_read: float, compulsory_read: float) -> float | None:
    """Of the repeated reads (requests beyond the compulsory bytes), the fraction L2 served.

    ``1 - (dram_read - compulsory_read) / (model_read - compulsory_read)``: 1 when DRAM saw only the
    compulsory bytes, 0 when every request went to DRAM. None when the model has no repeated reads.
    """
    repeats = model_read - compulsory_read
    if repeats <= 0:
        return None
    return 1.0 - (dram_read - compulsory_read) / repeats
