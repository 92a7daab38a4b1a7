"""The traffic model against Nsight Compute's counters (notebook 09, measurement 'traffic_measured').

A profiler sees three different numbers for the same kernel:

* L2 requests (``lts__t_sectors_srcunit_tex_op_read/_write`` × 32 bytes): what the SMs asked of the
  memory system after the L1; this is what the model (``flashattn.traffic``) counts;
* DRAM bytes (``dram__bytes_read/_write``): what missed in L2 (reads) and what L2 evicted (writes);
* the compulsory bytes: each tensor a kernel touches read (or written) exactly once, the DRAM traffic
  of a perfect cache.
"""

from __future__ import annotations

from flashattn.measure import recorded
from flashattn.measure.profile import SECTOR_BYTES
from flashattn.models.traffic import format_bytes


def measured_bytes(metrics: dict) -> dict[str, float | None]:
    """Bytes from Nsight Compute metrics: ``{"dram_read", "dram_write", "l2_read", "l2_write", "l2_all"}``.

    ``l2_read``/``l2_write`` are the SMs' requests to L2 (sectors × 32 bytes), ``l2_all`` is
    ``lts__t_bytes.sum`` (every L2 lookup, any source). A metric that was not collected gives None.
    """
    metrics = metrics or {}

    def sectors(name):
        v = recorded.number(metrics.get(name))
        return None if v is None else v * SECTOR_BYTES

    return {
        "dram_read": recorded.number(metrics.get("dram__bytes_read.sum")),
        "dram_write": recorded.number(metrics.get("dram__bytes_write.sum")),
        "l2_read": sectors("lts__t_sectors_srcunit_tex_op_read.sum"),
        "l2_write": sectors("lts__t_sectors_srcunit_tex_op_write.sum"),
        "l2_all": recorded.number(metrics.get("lts__t_bytes.sum")),
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


def _pct(r) -> str:
    return "—" if r is None else f"{r * 100:.0f} %"


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
                f"{shape if op == 'read' else '':<18}{op:<6}{format_bytes(c['model'][op]):>11}"
                f"{format_bytes(c['measured']['l2_' + op]):>11}{_pct(c['l2_over_model'][op]):>9}"
                f"{format_bytes(c['measured']['dram_' + op]):>11}{_pct(c['dram_over_model'][op]):>11}"
                f"{format_bytes(c['compulsory'][op]):>12}")
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
