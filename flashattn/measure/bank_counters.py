"""Reading the recorded bank-conflict measurements: Nsight Compute's shared-memory counters and the shared
layouts Triton chose (TTGIR), next to the predictions of ``flashattn.models.fma_loads`` (notebook 06b).
"""

from __future__ import annotations

import math
import re

from flashattn.measure import recorded
from flashattn.measure.compiled import listing_truncated
from flashattn.measure.profile import WARP_METRICS
from flashattn.models.banks import WARP_SIZE
from flashattn.models.fma_loads import fma_loop_summary, fma_num_warps, predicted_ratios
from flashattn.models.layouts import CHUNK_BYTES

NCU_INSTRUCTIONS = "smsp__inst_executed_op_shared_ld.sum"
NCU_WAVEFRONTS = "l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum"
NCU_CONFLICTS = "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum"
NCU_STORE_CONFLICTS = "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum"
NCU_TIME_NS = "gpu__time_duration.sum"
SHARED_METRICS = [NCU_WAVEFRONTS, NCU_CONFLICTS]  # shared loads: wavefronts and the extra ones conflicts cost
BANK_METRICS = [NCU_INSTRUCTIONS, *SHARED_METRICS, NCU_STORE_CONFLICTS, NCU_TIME_NS]
# The warp stall metrics (names from flashattn.measure.profile.WARP_METRICS): cycles a warp waits between two
# of its instructions, and of those, the cycles stalled on a full MIO queue (the post's "MIO throttle").
NCU_WARP_CYCLES = "smsp__average_warp_latency_per_inst_issued.ratio"
NCU_MIO_THROTTLE = "smsp__average_warps_issue_stalled_mio_throttle_per_issue_active.ratio"
BANK_RUN_METRICS = BANK_METRICS + [m for m in WARP_METRICS if m not in BANK_METRICS]  # the 'bank_conflicts' run
LOCAL_WORD_BYTES = 4  # Triton reports a kernel's local memory (its stack) as ``n_spills``, in 4-byte words


def ncu_rows(entry: dict | None, path: str | None = None) -> list[dict]:
    """Rows of a recorded 'bank_conflicts' entry (optionally one path), each with its derived numbers.

    Adds ``wavefronts``, ``conflicts``, ``instructions``, ``time_ms``, ``wavefronts_per_instruction``,
    ``conflict_share`` (conflicts ÷ wavefronts), ``cycles_per_instruction`` (cycles a warp waits between
    two of its instructions), ``mio_throttle_cycles`` (of those, stalled on MIO throttle) and
    ``mio_throttle_share`` where the metrics are present (None otherwise).
    """
    out = []
    for row in (entry or {}).get("rows", []) or []:
        if not isinstance(row, dict) or (path is not None and row.get("path") != path):
            continue
        metrics = row.get("metrics") or {}
        wf, conf, inst, t, cycles, mio = (
            recorded.number(metrics.get(k))
            for k in (NCU_WAVEFRONTS, NCU_CONFLICTS, NCU_INSTRUCTIONS, NCU_TIME_NS, NCU_WARP_CYCLES, NCU_MIO_THROTTLE))
        out.append({
            **row,
            "wavefronts": wf, "conflicts": conf, "instructions": inst,
            "time_ms": t / 1e6 if t is not None else None,
            "wavefronts_per_instruction": wf / inst if wf is not None and inst else None,
            "conflict_share": conf / wf if conf is not None and wf else None,
            "cycles_per_instruction": cycles, "mio_throttle_cycles": mio,
            "mio_throttle_share": mio / cycles if mio is not None and cycles else None,
        })
    return out


def _fmt_ratio(x: float) -> str:
    return f"{x:.2f}×"


def _tuple_of_ints(text) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", text)) if isinstance(text, str) else ()


def launch_config(row: dict) -> dict:
    """``block_m``, ``block_n``, ``num_warps`` of a recorded row, from what it gives.

    ``num_warps``: the row's own, else the launch's threads per block ÷ 32 (``launch__block_size`` or
    the ``block`` string), else the float32 GPU default. ``block_m``: the row's own, else N ÷ the
    grid's first dimension (one program per Q block), else 64. ``block_n``: the row's own, else 64
    (v2's float32 default on a GPU).
    """
    D = row.get("D")
    threads = (row.get("metrics") or {}).get("launch__block_size") or (_tuple_of_ints(row.get("block")) or (0,))[0]
    num_warps = row.get("num_warps") or (int(threads) // WARP_SIZE if threads else None)
    if not num_warps:
        num_warps = fma_num_warps(D) if isinstance(D, int) else 4
    grid = _tuple_of_ints(row.get("grid"))
    block_m = row.get("block_m")
    if not block_m and grid and isinstance(row.get("N"), int) and grid[0]:
        block_m = 1 << max(0, math.ceil(math.log2(row["N"] / grid[0])))  # Q blocks are powers of two
    return {"block_m": block_m or 64, "block_n": row.get("block_n") or 64, "num_warps": num_warps}


def compare_with_ncu(entry: dict | None, path: str = "fp32_ieee") -> list[dict]:
    """The model's v2 ÷ v2_kt wavefront ratios next to Nsight Compute's, one dict per head dimension.

    Each dict: ``D``; ``measured`` (v2 ÷ v2_kt shared-load wavefronts, None when a row is missing);
    ``predicted`` (:func:`predicted_ratios`); ``per_instruction`` (wavefronts per shared-load
    instruction, measured and modelled, for v2 and v2_kt); ``instructions`` (measured) and
    ``predicted_instructions`` (the model's loads per warp and iteration × warps × iterations ×
    programs); the launch configuration used; and ``text``, the comparison in words.
    """
    rows = ncu_rows(entry, path)
    out = []
    for D in sorted({r.get("D") for r in rows if isinstance(r.get("D"), int)}):
        by = {r.get("variant"): r for r in rows if r.get("D") == D}
        v2, kt = by.get("v2"), by.get("v2_kt")
        config = launch_config(v2 or kt)
        summary = fma_loop_summary(D, **config)
        item = {"D": D, **config, "measured": None, "predicted": predicted_ratios(D, **config),
                "per_instruction": {}, "instructions": {}, "predicted_instructions": None}
        if v2 and kt and v2["wavefronts"] and kt["wavefronts"]:
            item["measured"] = v2["wavefronts"] / kt["wavefronts"]
            item["instructions"] = {"v2": v2["instructions"], "v2_kt": kt["instructions"]}
            item["per_instruction"] = {
                name: {"measured": row["wavefronts_per_instruction"],
                       "model": summary[name]["wavefronts"] / summary[name]["instructions"]}
                for name, row in (("v2", v2), ("v2_kt", kt))}
            if all(isinstance(v2.get(k), int) for k in ("B", "H", "N")):
                programs = math.ceil(v2["N"] / config["block_m"]) * v2["B"] * v2["H"]
                item["predicted_instructions"] = (programs * math.ceil(v2["N"] / config["block_n"])
                                                  * config["num_warps"] * summary["v2"]["instructions"])
        item["text"] = _comparison_text(item)
        out.append(item)
    return out


def _comparison_text(item: dict) -> str:
    D, p, m = item["D"], item["predicted"], item["measured"]
    head = (f"D={D}, v2 ÷ v2_kt shared-load wavefronts: simple model (K tile only) {_fmt_ratio(p['simple'])}, "
            f"Triton's loads (K tile only) {_fmt_ratio(p['k_tile_triton'])}, Triton's loads (Q, K, P and V) "
            f"{_fmt_ratio(p['loop_triton'])}")
    if m is None:
        return head + "; Nsight Compute: not recorded for both v2 and v2_kt."
    closest = min(p, key=lambda k: abs(math.log(m / p[k])))
    off = m / p[closest] - 1
    names = {"simple": "the simple model", "k_tile_triton": "the K-tile model of Triton's loads",
             "loop_triton": "the whole-iteration model of Triton's loads"}
    verdict = (f"within {abs(off):.0%} of {names[closest]}" if abs(off) <= 0.25
               else f"closest to {names[closest]} but {abs(off):.0%} {'above' if off > 0 else 'below'} it")
    lines = [f"{head}. Nsight Compute measured {_fmt_ratio(m)}: {verdict}."]
    inst, pred_inst = item["instructions"], item["predicted_instructions"]
    if inst.get("v2") and inst.get("v2_kt"):
        same = abs(inst["v2"] / inst["v2_kt"] - 1) < 0.02
        text = (f"Both variants executed {'the same number of' if same else 'different numbers of'} shared-load "
                f"instructions ({inst['v2']:.4g} and {inst['v2_kt']:.4g})")
        if pred_inst:
            text += f"; the model predicts {pred_inst:.4g} ({inst['v2'] / pred_inst - 1:+.0%})"
        lines.append(text + ".")
    per = item["per_instruction"]
    if per and all(per[v]["measured"] for v in per):
        mv, mk = per["v2"]["measured"], per["v2_kt"]["measured"]
        pv, pk = per["v2"]["model"], per["v2_kt"]["model"]
        lines.append(f"Per instruction: v2 {mv:.2f} wavefronts (model {pv:.2f}), v2_kt {mk:.2f} (model {pk:.2f}); "
                     f"v2's extra wavefronts per instruction (v2 minus v2_kt), the cost of its conflicts: "
                     f"{mv - mk:.2f} measured, {pv - pk:.2f} modelled ({(mv - mk) / (pv - pk) - 1:+.0%}).")
        if mk < 0.95 * pk and abs((mv - mk) / (pv - pk) - 1) <= 0.1:
            lines.append("So the model gets the conflicts right, and the hardware serves the conflict-free loads "
                         "more cheaply than the model charges (fewer wavefronts than one per phase: it appears to "
                         "merge lanes 16-31 with lanes 0-15 when they read the same addresses). A cheaper "
                         "baseline raises the ratio.")
    if m < p["simple"]:
        lines.append(f"The simple model's {_fmt_ratio(p['simple'])} is an upper bound for the K loads alone; Q, P "
                     "and V are read from shared memory too, conflict-free in both variants.")
    return " ".join(lines)


_LAYOUT_RE = re.compile(r"#?(?P<alias>[\w.]+)?\s*=?\s*#ttg\.(?P<kind>\w+)<\{(?P<body>[^}]*)\}>")


def parse_shared_layout(line: str) -> dict:
    """Parse one TTGIR shared-encoding line, e.g. ``#shared = #ttg.swizzled_shared<{vec = 1, ...}>``.

    Returns ``{"alias", "kind", "params": {name: int | bool | list | str}}``; raises ValueError when the
    line is not a ``#ttg.<kind><{...}>`` definition.
    """
    if not isinstance(line, str):
        raise TypeError(f"expected a TTGIR line (str), got {type(line).__name__}")
    m = _LAYOUT_RE.search(line)
    if not m:
        raise ValueError(f"not a TTGIR layout definition: {line!r}")
    params = {}
    for key, value in re.findall(r"(\w+)\s*=\s*(\[[^\]]*\]|[^,]+)", m.group("body")):
        value = value.strip()
        if value.startswith("["):
            params[key] = [int(x) for x in re.findall(r"-?\d+", value)]
        elif value in ("true", "false"):
            params[key] = value == "true"
        elif re.fullmatch(r"-?\d+", value):
            params[key] = int(value)
        else:
            params[key] = value
    return {"alias": m.group("alias"), "kind": m.group("kind"), "params": params}


def _parsed_layouts(row: dict) -> list[dict]:
    """The row's shared layouts, parsed; lines that are not ``#ttg.<kind><{...}>`` definitions are skipped."""
    parsed = []
    for line in row.get("shared_layouts") or []:
        try:
            parsed.append(parse_shared_layout(line))
        except (ValueError, TypeError):
            continue
    return parsed


def layout_signature(row: dict) -> tuple:
    """The shared encodings of a recorded compiled-layouts row, without their names (for comparisons)."""
    return tuple(sorted((layout["kind"], tuple(sorted((k, str(v)) for k, v in layout["params"].items())))
                        for layout in _parsed_layouts(row)))


def describe_shared_layout(layout: dict) -> str:
    """In words: whether a parsed shared layout swizzles, and how."""
    kind, p = layout.get("kind"), layout.get("params", {})
    if kind == "swizzled_shared":
        if p.get("maxPhase", 1) <= 1:
            return f"plain (no swizzle; order {p.get('order')})"
        return (f"XOR-swizzled: {p.get('vec')}-element vectors XOR ((row // {p.get('perPhase')}) mod "
                f"{p.get('maxPhase')}); order {p.get('order')}")
    if kind == "nvmma_shared":
        width = p.get("swizzlingByteWidth", 0)
        trans = ", transposed" if p.get("transposed") else ""
        if not width:
            return f"tensor-core layout, no swizzle{trans}"
        return (f"tensor-core layout, {width}-byte swizzle: 16-byte chunks XOR (row mod {width // CHUNK_BYTES})"
                f"{trans}, {p.get('elementBitWidth')}-bit elements")
    if kind == "padded_shared":
        return f"padded shared layout {p}"
    return f"{kind} {p}"


def compiled_layout_rows(entry: dict | None) -> list[dict]:
    """Rows of a recorded 'compiled_layouts' entry with their shared layouts parsed and described.

    Adds ``parsed_layouts`` (lines that are not ``#ttg.<kind><{...}>`` definitions are skipped),
    ``lds_counts`` (the shared-load opcodes of ``sass_counts``), ``hgmma``, ``ffma``, ``sass_truncated``
    (``flashattn.measure.compiled.listing_truncated``: counts from a listing Triton's get_sass cut short),
    ``sass_recorded`` (counts recorded and whole: the counts to show) and ``local_bytes`` (the kernel's
    local memory, its stack, per thread: ``stack_bytes`` where recorded, else Triton's ``spills`` × 4;
    None if neither is known).
    """
    out = []
    for row in (entry or {}).get("rows", []) or []:
        if not isinstance(row, dict):
            continue
        parsed = [{**layout, "text": describe_shared_layout(layout)} for layout in _parsed_layouts(row)]
        counts = row.get("sass_counts") or {}
        lds = {k: v for k, v in counts.items() if k == "LDS" or k.startswith("LDS.") or k.startswith("LDSM")}
        truncated = bool(counts) and listing_truncated(row)
        spills, stack = row.get("spills"), row.get("stack_bytes")
        out.append({**row, "parsed_layouts": parsed, "lds_counts": lds, "sass_truncated": truncated,
                    "sass_recorded": bool(counts) and not truncated,
                    "hgmma": sum(v for k, v in counts.items() if k.startswith("HGMMA")),
                    "ffma": counts.get("FFMA", 0),
                    "local_bytes": stack if isinstance(stack, int) else
                    spills * LOCAL_WORD_BYTES if isinstance(spills, int) else None})
    return out
