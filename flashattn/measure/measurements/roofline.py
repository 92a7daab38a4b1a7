"""DRAM bytes of the kernels the rooflines of notebooks 00 and 10 place, at the problems they place them
(measurement ``roofline_dram``).

A roofline's x axis is FLOP per byte of DRAM traffic (``flashattn.measure.dram``). Nsight Compute counts those
bytes (``dram__bytes_read/write``) next to the SMs' requests to L2. This measurement profiles, at the course's
full size (B=4, H=16, N=4096, fp16, non-causal): naive, v1 and v2 at D = 64 (notebook 00), and ``fast`` (with
the tiles autotuning picked in the recorded ``fast_vs_sdpa`` table, so that no autotuning runs under the
profiler) and SDPA at D = 64 and 128 (notebook 10). Each configuration runs in its own ncu process, called
twice; the second call's kernels are kept (caches are flushed before each kernel: ncu's default).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

from flashattn.kernels import registry
from flashattn.measure import recorded
from flashattn.measure.profile import (
    TRAFFIC_METRICS,
    NcuUnavailable,
    find_ncu,
    keep_metrics,
    ncu_version,
    parse_ncu_csv,
    sum_launches,
)
from flashattn.measure.traffic_counters import measured_bytes
from flashattn.record import measurement

PROBLEM = {"B": 4, "H": 16, "N": 4096, "dtype": "float16", "causal": False}
# (variant, D): notebook 00's kernels at D = 64, notebook 10's at D = 64 and 128
CONFIGS = [("naive", 64), ("v1", 64), ("v2", 64), ("fast", 64), ("sdpa", 64), ("fast", 128), ("sdpa", 128)]
SDPA_KERNELS = "sdpa|flash|fmha|attention"  # cuDNN's, FlashAttention's and PyTorch's own attention kernels
BUDGET_S = 200  # stop starting new ncu runs after this many seconds


def configs(fast_table: dict | None = None) -> list[dict]:
    """Every configuration, with the options it runs with (``fast``: the recorded pick for its problem)."""
    out = []
    for variant, D in CONFIGS:
        cfg = {"variant": variant, "D": D, **PROBLEM, "options": {}}
        if variant == "fast":
            picks = [r.get("fast_config") for r in (fast_table or {}).get("rows", [])
                     if (r["dtype"], r["D"], r["N"], r["B"], r["H"], r["causal"]) ==
                     (PROBLEM["dtype"], D, PROBLEM["N"], PROBLEM["B"], PROBLEM["H"], PROBLEM["causal"])]
            cfg["options"] = dict(picks[0]) if picks and picks[0] else {}
        out.append(cfg)
    return out


def kernel_regex(variant: str) -> str:
    return SDPA_KERNELS if variant == "sdpa" else "|".join(registry.kernel_names(variant))


def run_child(config_json: str) -> None:
    """The profiled process: run one configuration twice."""
    import torch

    from flashattn import bench, runtime

    cfg = json.loads(config_json)
    q, k, v = runtime.random_qkv(cfg["B"], cfg["H"], cfg["N"], cfg["D"], dtype=getattr(torch, cfg["dtype"]),
                                 device="cuda")
    fn = bench.call(cfg["variant"], q, k, v, causal=cfg["causal"], **cfg["options"])
    for _ in range(2):
        fn()
    torch.cuda.synchronize()


def _profile(cfg: dict, ncu: str, timeout: int) -> dict:
    child = "import sys; from flashattn.measure.measurements import roofline; roofline.run_child(sys.argv[1])"
    command = [ncu, "--clock-control", "none", "--csv", "--page", "raw", "--print-units", "base",
               "--metrics", ",".join(TRAFFIC_METRICS), "--kernel-name", f"regex:{kernel_regex(cfg['variant'])}",
               sys.executable, "-c", child, json.dumps(cfg)]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise NcuUnavailable(f"ncu failed (exit {proc.returncode}): {(proc.stdout + proc.stderr).strip()[-600:]}")
    launches = parse_ncu_csv(proc.stdout)
    if not launches or len(launches) % 2:
        raise NcuUnavailable(f"expected the same kernels in both calls, got {len(launches)} launches: "
                             f"{[launch['kernel'] for launch in launches]}")
    second = launches[len(launches) // 2:]
    for launch in second:
        launch["metrics"] = keep_metrics(launch["metrics"], TRAFFIC_METRICS)
    metrics = sum_launches(second)
    return {"kernels": [launch["kernel"] for launch in second], "metrics": metrics,
            "measured": measured_bytes(metrics)}


@measurement("roofline_dram", description="Nsight Compute DRAM bytes of naive, v1, v2, fast and SDPA at the "
                                          "problems notebooks 00 and 10 put on the roofline")
def roofline_dram() -> dict:
    t0 = time.perf_counter()
    fast_table = recorded.find("fast_vs_sdpa")
    result = {"metrics": TRAFFIC_METRICS, "ncu_version": ncu_version(), "problem": PROBLEM,
              "notes": "ncu --clock-control none (caches flushed before each kernel); the second of two calls; "
                       "fast with the tiles of the recorded fast_vs_sdpa pick for the same problem"}
    ncu = find_ncu()
    rows = []
    for cfg in configs(fast_table):
        row = {k: cfg[k] for k in ("variant", "B", "H", "N", "D", "dtype", "causal", "options")}
        if ncu is None:
            row["error"] = "Nsight Compute (ncu) is not installed"
        elif cfg["variant"] == "fast" and not cfg["options"]:
            row["error"] = "no recorded fast_vs_sdpa pick for this problem"
        elif time.perf_counter() - t0 > BUDGET_S:
            row["error"] = "skipped: the time budget was spent"
        else:
            try:
                row.update(_profile(cfg, ncu, timeout=int(max(60, BUDGET_S + 60 - (time.perf_counter() - t0)))))
            except Exception as err:  # noqa: BLE001 - a failure is a result too; keep going
                row["error"] = f"{type(err).__name__}: {str(err)[-600:]}"
        print(f"[roofline_dram] {row['variant']:<6} D={row['D']}: "
              f"{row.get('error') or row['measured']} ({time.perf_counter() - t0:.0f} s)", flush=True)
        rows.append(row)
    result["rows"] = rows
    result["elapsed_s"] = round(time.perf_counter() - t0, 1)
    return result
