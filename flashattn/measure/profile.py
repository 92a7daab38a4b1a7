"""The profilers, from Python: Nsight Compute, Nsight Systems and torch.profiler.

* ``ncu_profile(configs, metrics)``: run Nsight Compute on a small target (this module, run as
  ``python -m flashattn.measure.profile TARGET_JSON``) and parse its CSV into numbers;
* ``ncu_shell_command(...)`` / ``nsys_command(...)``: the commands a learner pastes into a shell;
* ``torch_profile(calls)``: a quick ``torch.profiler`` table of labelled calls.

Nsight Compute needs a GPU and permission to read the counters; where ``ncu`` is missing or refused,
``NcuUnavailable`` says why, and the notebooks use the recorded results instead.
"""

from __future__ import annotations

import csv
import glob
import io
import json
import os
import shutil
import subprocess
import sys

from flashattn.kernels import registry
from flashattn.measure import recorded


class NcuUnavailable(RuntimeError):
    """Nsight Compute is not installed, or may not read the GPU's counters here."""


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


def ncu_command(ncu: str, target: list[dict], metrics: list[str], kernel_regex: str,
                module: str = "flashattn.measure.profile") -> list[str]:
    """The command line: profile every launch of the kernels matching ``kernel_regex`` while ``python -m
    module TARGET_JSON`` runs each configuration of ``target`` twice."""
    return [
        ncu, "--clock-control", "none", "--csv", "--page", "raw", "--print-units", "base",
        "--metrics", ",".join(metrics), "--kernel-name", f"regex:{kernel_regex}",
        sys.executable, "-m", module, json.dumps(target),
    ]


def _cell(text: str):
    """A CSV cell: its number, else its text (None when empty)."""
    value = recorded.number(text)
    return value if value is not None else (text.strip() or None)


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
        metrics = {name: _cell(record[name]) for name in header if name not in fixed}
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


def ncu_profile(target: list[dict], metrics: list[str], kernel_regex: str = "attn_kernel",
                timeout: int = 600, module: str = "flashattn.measure.profile") -> list[dict]:
    """Profile each configuration in ``target`` (run twice: warm-up, then profiled) with ncu; ``module`` is
    the target program (``python -m module TARGET_JSON``; this module's runs forward variants).

    Returns one parsed row per configuration, in order (the warm-up launches are dropped).
    """
    ncu = find_ncu()
    if ncu is None:
        raise NcuUnavailable("Nsight Compute (ncu) is not installed or not on PATH")
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.run(ncu_command(ncu, target, metrics, kernel_regex, module), capture_output=True, text=True,
                          timeout=timeout, env=env)
    text = proc.stdout + "\n" + proc.stderr
    if "ERR_NVGPUCTRPERM" in text or "permission" in text.lower() and proc.returncode != 0:
        raise NcuUnavailable("ncu may not read the GPU performance counters here (ERR_NVGPUCTRPERM)")
    if proc.returncode != 0:
        raise NcuUnavailable(f"ncu failed (exit {proc.returncode}): {text.strip()[-800:]}")
    rows = parse_ncu_csv(proc.stdout)
    for row in rows:  # the raw page also lists device attributes and launch statistics: keep what was asked
        row["metrics"] = keep_metrics(row["metrics"], metrics)
    # every configuration launches warm-up then measured, the same kernels each time (naive: three a call)
    per_config = len(rows) // len(target) if target else 0
    if per_config < 2 or per_config % 2 or per_config * len(target) != len(rows):
        raise NcuUnavailable(f"expected the same kernels launched by two calls of each configuration, got "
                             f"{len(rows)} launches for {len(target)}: {[r['kernel'] for r in rows][:12]}")
    second_calls = []
    for i in range(len(target)):
        mine = rows[i * per_config: (i + 1) * per_config]
        first, second = mine[: per_config // 2], mine[per_config // 2:]
        if [r["kernel"] for r in first] != [r["kernel"] for r in second]:
            raise NcuUnavailable(f"the two calls of configuration {i} launched different kernels: "
                                 f"{[r['kernel'] for r in first]} then {[r['kernel'] for r in second]}")
        second_calls.append(second)
    return second_calls


def _run_target(target: list[dict]) -> None:
    """Body of ``python -m flashattn.measure.profile TARGET_JSON``: run each configuration twice."""
    import torch

    from flashattn import runtime
    from flashattn.kernels import VARIANTS

    for cfg in target:
        dtype = getattr(torch, cfg["dtype"])
        q, k, v = runtime.random_qkv(cfg["B"], cfg["H"], cfg["N"], cfg["D"], dtype=dtype, device="cuda")
        fn = VARIANTS[cfg["variant"]]
        for _ in range(2):
            fn(q, k, v, causal=cfg.get("causal", False), **cfg.get("options", {}))
        torch.cuda.synchronize()

# ---------------------------------------------------------------- the metrics and the learner's commands
#
# Metric names are those that worked with Nsight Compute 2025.3 on an H200 (see the course's source notes).


SECTOR_BYTES = 32  # the L2 works in 32-byte sectors

TRAFFIC_METRICS = [
    "dram__bytes_read.sum",  # bytes the DRAM delivered (L2 misses)
    "dram__bytes_write.sum",  # bytes written back to DRAM (evicted dirty L2 lines)
    "lts__t_sectors_srcunit_tex_op_read.sum",  # sectors the SMs asked of L2 for loads
    "lts__t_sectors_srcunit_tex_op_write.sum",  # ... for stores
    "lts__t_bytes.sum",  # every L2 lookup, from any unit and any operation
    "gpu__time_duration.sum",
]

STALL_REASONS = ("mio_throttle", "short_scoreboard", "long_scoreboard", "barrier", "math_pipe_throttle",
                 "wait", "lg_throttle", "not_selected", "selected")

WARP_METRICS = [
    "sm__warps_active.avg.pct_of_peak_sustained_active",  # achieved occupancy
    "smsp__average_warp_latency_per_inst_issued.ratio",  # cycles between two instructions of a warp
    *(f"smsp__average_warps_issue_stalled_{reason}_per_issue_active.ratio" for reason in STALL_REASONS),
]

METRIC_MEANINGS = {
    "dram__bytes_read.sum": "bytes read from DRAM (HBM): what missed in L2",
    "dram__bytes_write.sum": "bytes written to DRAM: dirty L2 lines evicted while the kernel ran",
    "lts__t_sectors_srcunit_tex_op_read.sum": "32-byte sectors the SMs' loads asked of L2 (hit or miss)",
    "lts__t_sectors_srcunit_tex_op_write.sum": "32-byte sectors the SMs' stores sent to L2",
    "lts__t_bytes.sum": "bytes of every L2 lookup, from all units (SMs, copy engines, the other L2 half)",
    "gpu__time_duration.sum": "kernel duration (ns)",
    "l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum": "shared-memory load wavefronts (passes of the "
                                                            "shared-memory pipe)",
    "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum": "extra wavefronts caused by bank conflicts on "
                                                                "shared loads",
    "sm__warps_active.avg.pct_of_peak_sustained_active": "achieved occupancy: active warps per SM, % of the "
                                                         "maximum",
    "smsp__average_warp_latency_per_inst_issued.ratio": "cycles a warp waits between two of its instructions "
                                                        "(the sum of the stall reasons)",
    **{f"smsp__average_warps_issue_stalled_{reason}_per_issue_active.ratio":
       f"of those cycles, stalled on '{reason.replace('_', ' ')}'" for reason in STALL_REASONS},
}


def kernel_regex(variants) -> str:
    """An ncu ``--kernel-name regex:`` that matches the kernels of every variant in ``variants``."""
    if isinstance(variants, str):
        variants = (variants,)
    names = sorted({name for v in variants for name in registry.kernel_names(v)})
    return "|".join(names)


def target_config(variant: str, *, B: int, H: int, N: int, D: int, dtype: str = "float16", causal: bool = False,
                  options: dict | None = None) -> dict:
    """One configuration for ``python -m flashattn.measure.profile TARGET_JSON`` (a JSON-able dict)."""
    registry.get(variant)  # validates the name
    if dtype not in ("float16", "bfloat16", "float32"):
        raise ValueError(f"dtype must be 'float16', 'bfloat16' or 'float32', got {dtype!r}")
    return {"variant": variant, "dtype": dtype, "B": int(B), "H": int(H), "N": int(N), "D": int(D),
            "causal": bool(causal), "options": dict(options or {})}


def _target_and_regex(target) -> tuple[list[dict], str, int]:
    target = [target] if isinstance(target, dict) else list(target)
    if not target:
        raise ValueError("target is empty: give at least one configuration (see target_config)")
    counts = {registry.get(cfg["variant"]).launches for cfg in target}
    if len(counts) != 1:
        raise ValueError("give variants that launch different numbers of kernels per call (naive: three) "
                         "in separate commands")
    return target, kernel_regex([cfg["variant"] for cfg in target]), counts.pop()


def ncu_shell_command(target, metrics: list[str] | None = None, *, ncu: str = "ncu", python: str = "python",
                      full_set: bool = False, report: str | None = None) -> str:
    """The command a learner pastes into a shell to profile ``target`` with Nsight Compute.

    ``target`` is one :func:`target_config` dict or a list of them. Each configuration is launched
    twice (the first launch compiles); for a single configuration ``--launch-skip`` drops the
    warm-up launch, so ncu profiles only the second. ``full_set=True`` asks for ``--set full`` (every
    section: slow, dozens of replays per kernel) instead of the listed metrics; ``report`` writes an
    ``.ncu-rep`` file for the Nsight Compute GUI instead of printing CSV.
    """
    import shlex

    target, regex, per_call = _target_and_regex(target)
    args = [ncu, "--clock-control", "none", "--kernel-name", f"regex:{regex}"]
    if len(target) == 1:
        args += ["--launch-skip", str(per_call), "--launch-count", str(per_call)]
    if full_set:
        args += ["--set", "full"]
    else:
        args += ["--metrics", ",".join(metrics or TRAFFIC_METRICS)]
    args += ["-o", report] if report else ["--csv", "--page", "raw", "--print-units", "base"]
    args += [python, "-m", "flashattn.measure.profile", json.dumps(target, separators=(",", ":"))]
    return shlex.join(args)


def nsys_command(target, *, report: str = "flashattn_timeline", python: str = "python") -> str:
    """The Nsight Systems command for a timeline of ``target`` (every kernel, memcpy and CPU range)."""
    import shlex

    target, _, _ = _target_and_regex(target)
    return shlex.join(["nsys", "profile", "--trace", "cuda,nvtx,osrt", "--force-overwrite", "true",
                       "--output", report, python, "-m", "flashattn.measure.profile",
                       json.dumps(target, separators=(",", ":"))])


def ncu_version() -> str | None:
    """``ncu --version``'s last line, or None without ncu."""
    ncu = find_ncu()
    if not ncu:
        return None
    try:
        out = subprocess.run([ncu, "--version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    lines = out.stdout.strip().splitlines()
    return lines[-1] if lines else None


def ncu_status() -> str:
    """One sentence: can Nsight Compute run here? (Permission is only known once it tries.)"""
    ncu = find_ncu()
    if ncu is None:
        return ("Nsight Compute (ncu) is not installed or not on PATH: the recorded measurements are shown "
                "instead. It ships with the CUDA toolkit (or as 'nsight-compute').")
    from flashattn import runtime

    if runtime.MODE != "gpu":
        return f"ncu found at {ncu}, but no GPU is in use ({runtime.describe()}): recorded measurements are shown."
    return (f"ncu found at {ncu}. If it reports ERR_NVGPUCTRPERM, the driver does not let this user read the "
            "performance counters (ask an administrator, or run where you may).")


def is_additive(metric: str) -> bool:
    """Whether a metric adds up over kernels (counts and durations do; averages, ratios and % do not)."""
    return metric.endswith(".sum") and ".pct" not in metric and ".per_" not in metric


def sum_launches(launches: list[dict]) -> dict[str, float]:
    """The additive metrics (``.sum``) of several kernel launches, added up (e.g. naive's three)."""
    total: dict[str, float] = {}
    for launch in launches:
        for name, value in launch["metrics"].items():
            value = recorded.number(value)
            if is_additive(name) and value is not None:
                total[name] = total.get(name, 0.0) + value
    return total


# ---------------------------------------------------------------- torch.profiler: a quick table

def torch_profile(calls: dict, *, repeat: int = 3, warmup: int = 1) -> list[dict]:
    """Run each labelled call under ``torch.profiler`` and return one row per event.

    ``calls`` maps a label to a function of no arguments. Each call runs ``warmup`` times
    unprofiled (compilation), then ``repeat`` times inside ``record_function(label)``. Rows:
    ``{"name", "kind" ("label", "kernel" or "op"), "calls", "cpu_ms", "self_cpu_ms", "device_ms",
    "self_device_ms"}`` (totals over all calls), sorted by device time where a GPU ran, else by
    self CPU time. Works on the CPU (no kernels appear there: the interpreter runs them as Python).
    """
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    if not calls:
        raise ValueError("calls is empty: give {label: function}")
    if repeat < 1 or warmup < 0:
        raise ValueError(f"need repeat >= 1 and warmup >= 0, got repeat={repeat}, warmup={warmup}")
    gpu = torch.cuda.is_available()
    for fn in calls.values():
        for _ in range(warmup):
            fn()
    if gpu:
        torch.cuda.synchronize()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if gpu else [])
    with profile(activities=activities) as prof:
        for label, fn in calls.items():
            with record_function(label):
                for _ in range(repeat):
                    fn()
                if gpu:
                    torch.cuda.synchronize()
    return profile_rows(prof.key_averages(), calls)


def profile_rows(events, labels) -> list[dict]:
    """Rows of :func:`torch_profile` from ``torch.profiler``'s ``key_averages()``.

    A ``record_function(label)`` range appears twice where GPU work ran inside it: the CPU range, and
    its GPU-side annotation of the same name (the profiler keeps the events of each device apart). They
    make one "label" row: calls and CPU times of the CPU range, device time of the GPU annotation.
    Events that are not user annotations keep their kind, even one named like a label (a kernel
    ``attn_kernel_v2`` profiled under the label ``"attn_kernel_v2"``).
    """
    from torch.autograd import DeviceType

    rows, label_rows = [], {}
    for event in events:
        on_device = event.device_type != DeviceType.CPU
        if event.key in labels and getattr(event, "is_user_annotation", True):
            row = label_rows.get(event.key)
            if row is None:
                row = label_rows[event.key] = _row(event.key, "label")
                rows.append(row)
            if on_device:  # the GPU-side annotation: how long the device was busy inside the range
                row["device_ms"] = max(row["device_ms"], event.device_time_total / 1e3)
            else:
                row.update(calls=int(event.count), cpu_ms=event.cpu_time_total / 1e3,
                           self_cpu_ms=event.self_cpu_time_total / 1e3,
                           device_ms=max(row["device_ms"], event.device_time_total / 1e3))
            continue
        rows.append(_row(event.key, "kernel" if on_device else "op", calls=int(event.count),
                         cpu_ms=event.cpu_time_total / 1e3, self_cpu_ms=event.self_cpu_time_total / 1e3,
                         device_ms=event.device_time_total / 1e3, self_device_ms=event.self_device_time_total / 1e3))
    key = "self_device_ms" if any(r["self_device_ms"] > 0 for r in rows) else "self_cpu_ms"
    rows.sort(key=lambda r: (r["kind"] != "label", -r[key]))
    return rows


def _row(name: str, kind: str, **times) -> dict:
    return {"name": name, "kind": kind, "calls": 0, "cpu_ms": 0.0, "self_cpu_ms": 0.0, "device_ms": 0.0,
            "self_device_ms": 0.0, **times}


def format_profile_table(rows: list[dict], limit: int = 12) -> str:
    """A plain-text table of :func:`torch_profile` rows (labels first, then the top ``limit`` events).

    The GPU column is a label's whole GPU time (every kernel inside it) and an event's own."""
    lines = [f"{'name':<44}{'kind':<8}{'calls':>6}{'CPU ms':>10}{'self CPU':>10}{'GPU ms':>10}"]
    labels = [r for r in rows if r["kind"] == "label"]
    others = [r for r in rows if r["kind"] != "label"][:limit]
    for r in labels + others:
        name = r["name"] if len(r["name"]) <= 42 else r["name"][:39] + "..."
        gpu_ms = r["device_ms"] if r["kind"] == "label" else r["self_device_ms"]
        lines.append(f"{name:<44}{r['kind']:<8}{r['calls']:>6}{r['cpu_ms']:>10.3f}{r['self_cpu_ms']:>10.3f}"
                     f"{gpu_ms:>10.3f}")
    return "\n".join(lines)


if __name__ == "__main__":
    _run_target(json.loads(sys.argv[1]))
