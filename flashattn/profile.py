"""Compiled-kernel facts and Nsight Compute runs, from Python.

* ``compiled_kernels(jit_fn)``: the kernels Triton compiled for a ``@triton.jit`` function, with
  registers, spills, shared memory, TTGIR and SASS.
* ``ncu_profile(configs, metrics)``: run Nsight Compute on a small target (this module, run as
  ``python -m flashattn.profile TARGET_JSON``) and parse its CSV into numbers.

Nsight Compute needs a GPU and permission to read the counters; where ``ncu`` is missing or refused,
``NcuUnavailable`` says why, and the notebooks use the recorded results instead.
"""

from __future__ import annotations

import csv
import glob
import io
import json
import os
import re
import shutil
import subprocess
import sys
from collections import Counter

BANK_METRICS = [
    "smsp__inst_executed_op_shared_ld.sum",
    "l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum",
    "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum",
    "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum",
    "gpu__time_duration.sum",
]


class NcuUnavailable(RuntimeError):
    """Nsight Compute is not installed, or may not read the GPU's counters here."""


# ---------------------------------------------------------------- compiled kernels

def compiled_kernels(jit_fn) -> list:
    """Every kernel Triton has compiled for ``jit_fn`` in this process (GPU mode only)."""
    caches = getattr(jit_fn, "device_caches", {})
    return [kernel for cache in caches.values() for kernel in cache[0].values()]


_SASS_LINE = re.compile(
    r"^\s*(?:/\*[0-9a-f]{4,}\*/|[A-Z0-9-]+:[^\t]*\t)\s*(?:@!?U?P[T0-9]\s+)?([A-Z][A-Z0-9_]*(?:\.[A-Za-z0-9_]+)*)"
)


def sass_opcode_counts(sass: str) -> dict[str, int]:
    """Count SASS instructions by opcode (with its modifiers, e.g. ``LDS.128``, ``HGMMA.64x64x16.F32``).

    Reads both ``cuobjdump -sass`` lines (``/*0040*/  LDS.128 R4, [R2] ;``) and the
    ``control<TAB>instruction`` lines of ``triton.tools.disasm.get_sass``.
    """
    counts: Counter = Counter()
    for line in sass.splitlines():
        m = _SASS_LINE.match(line)
        if m:
            counts[m.group(1)] += 1
    return dict(sorted(counts.items()))


def shared_layouts(ttgir: str) -> list[str]:
    """The TTGIR lines that define shared-memory encodings (swizzled_shared, nvmma_shared, ...)."""
    return [line.strip() for line in ttgir.splitlines() if line.startswith("#") and "shared" in line]


def kernel_facts(kernel) -> dict:
    """Registers, spills, shared memory, warps, shared layouts and SASS opcode counts of one kernel."""
    facts = {
        "registers_per_thread": kernel.n_regs,
        "spills": kernel.n_spills,
        "shared_bytes": kernel.metadata.shared,
        "num_warps": kernel.metadata.num_warps,
        "num_stages": getattr(kernel.metadata, "num_stages", None),
        "shared_layouts": shared_layouts(kernel.asm.get("ttgir", "")),
    }
    try:
        from triton.tools.disasm import get_sass

        facts["sass_counts"] = sass_opcode_counts(get_sass(kernel.asm["cubin"]))
    except Exception as err:  # noqa: BLE001 - cuobjdump may be missing; say so in the data
        facts["sass_error"] = f"{type(err).__name__}: {err}"
    return facts


# ---------------------------------------------------------------- Nsight Compute

def find_ncu() -> str | None:
    found = shutil.which("ncu")
    if found:
        return found
    for pattern in ("/usr/local/cuda*/bin/ncu", "/opt/nvidia/nsight-compute/*/ncu"):
        hits = sorted(glob.glob(pattern))
        if hits:
            return hits[-1]
    return None


def ncu_command(ncu: str, target: list[dict], metrics: list[str], kernel_regex: str) -> list[str]:
    """The command line: profile every launch of the kernels matching ``kernel_regex``."""
    return [
        ncu, "--clock-control", "none", "--csv", "--page", "raw", "--print-units", "base",
        "--metrics", ",".join(metrics), "--kernel-name", f"regex:{kernel_regex}",
        sys.executable, "-m", "flashattn.profile", json.dumps(target),
    ]


def _number(text: str):
    text = text.strip().replace(",", "")
    try:
        return float(text)
    except ValueError:
        return text or None


def parse_ncu_csv(text: str) -> list[dict]:
    """Rows of ``ncu --csv --page raw``: [{"kernel", "grid", "block", "metrics": {name: value}, "units"}]."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith('"ID"')), None)
    if start is None:
        raise ValueError("no Nsight Compute CSV table found (no line starting with \"ID\")")
    table = list(csv.reader(io.StringIO("\n".join(lines[start:]))))
    header, units, rows = table[0], table[1], table[2:]
    fixed = {"ID", "Process ID", "Process Name", "Host Name", "Kernel Name", "Context", "Stream",
             "Block Size", "Grid Size", "Device", "CC"}
    out = []
    for row in rows:
        if len(row) != len(header):
            continue
        record = dict(zip(header, row, strict=True))
        metrics = {name: _number(record[name]) for name in header if name not in fixed}
        out.append({
            "kernel": record.get("Kernel Name"), "grid": record.get("Grid Size"),
            "block": record.get("Block Size"), "metrics": metrics,
            "units": {name: unit for name, unit in zip(header, units, strict=True) if name in metrics},
        })
    return out


LAUNCH_FACTS = ("launch__registers_per_thread", "launch__shared_mem_per_block", "launch__block_size",
                "launch__grid_size", "launch__waves_per_multiprocessor", "launch__occupancy_limit_registers",
                "launch__occupancy_limit_shared_mem", "launch__occupancy_limit_warps")


def keep_metrics(metrics: dict, wanted: list[str]) -> dict:
    """The requested metrics plus a few launch facts (registers, shared memory, occupancy limits)."""
    return {name: value for name, value in metrics.items() if name in wanted or name in LAUNCH_FACTS}


def ncu_profile(target: list[dict], metrics: list[str] = BANK_METRICS, kernel_regex: str = "attn_kernel",
                timeout: int = 600) -> list[dict]:
    """Profile each configuration in ``target`` (run twice: warm-up, then profiled) with ncu.

    Returns one parsed row per configuration, in order (the warm-up launches are dropped).
    """
    ncu = find_ncu()
    if ncu is None:
        raise NcuUnavailable("Nsight Compute (ncu) is not installed or not on PATH")
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.run(ncu_command(ncu, target, metrics, kernel_regex), capture_output=True, text=True,
                          timeout=timeout, env=env)
    text = proc.stdout + "\n" + proc.stderr
    if "ERR_NVGPUCTRPERM" in text or "permission" in text.lower() and proc.returncode != 0:
        raise NcuUnavailable("ncu may not read the GPU performance counters here (ERR_NVGPUCTRPERM)")
    if proc.returncode != 0:
        raise NcuUnavailable(f"ncu failed (exit {proc.returncode}): {text.strip()[-800:]}")
    rows = parse_ncu_csv(proc.stdout)
    for row in rows:  # the raw page also lists device attributes and launch statistics: keep what was asked
        row["metrics"] = keep_metrics(row["metrics"], metrics)
    per_config = len(rows) // len(target) if target else 0
    if per_config < 2:
        raise NcuUnavailable(f"expected two profiled launches per configuration, got {len(rows)} for {len(target)}")
    # every configuration launches warm-up then measured; naive launches three kernels per call
    return [rows[i * per_config + per_config // 2: (i + 1) * per_config] for i in range(len(target))]


def _run_target(target: list[dict]) -> None:
    """Body of ``python -m flashattn.profile TARGET_JSON``: run each configuration twice."""
    import torch

    from flashattn import VARIANTS, runtime

    for cfg in target:
        dtype = getattr(torch, cfg["dtype"])
        q, k, v = runtime.random_qkv(cfg["B"], cfg["H"], cfg["N"], cfg["D"], dtype=dtype, device="cuda")
        fn = VARIANTS[cfg["variant"]]
        for _ in range(2):
            fn(q, k, v, causal=cfg.get("causal", False), **cfg.get("options", {}))
        torch.cuda.synchronize()


if __name__ == "__main__":
    _run_target(json.loads(sys.argv[1]))
