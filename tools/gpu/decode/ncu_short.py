"""Nsight Compute on attention_with_kvcache's slowest cells against SDPA's kernels (issue 31).

    OUT=... python tools/gpu/decode/ncu_short.py      # about a minute on an H200; $OUT/decode_ncu_short.json

decode_vs_sdpa (2026-12-03 11:48, CUDA-graph replays) has its unsplit launches of 512 programs over 1k keys (B = 16
with 32/32 heads, B = 64 with 32/8) at 0.92-0.93× SDPA, and merge.py found no split faster. ncu's view of each
kernel of one call of ours and of SDPA's (fp16, D = 128, Lq = 1, a full contiguous cache) at those cells and at
two for contrast (B = 1 with 32/8 heads at 4k, where both are far from the bandwidth, and at 128k with 16
splits): duration, DRAM throughput and bytes, achieved occupancy, waves, the launch's registers and shared memory,
and the warps' stall reasons. First run 2026-12-03 13:28: the default's 512 programs ran in 1.29 waves at 75 % of
the DRAM bandwidth, SDPA's (cuDNN's kernel) in 1.94 at 84 % (decode_plan.SHORT_TILES since). Clocks as they
come (--clock-control none); ncu runs every kernel alone with the caches flushed, so durations differ a little from
the timing table.
Without ncu or a GPU it says so and writes what it found.
"""

from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

from flashattn.measure.profile import find_ncu  # noqa: E402

OUT = Path(os.environ.get("OUT", "probe_out"))
CELLS = [(64, 8, 1024), (16, 32, 1024), (1, 8, 4096), (1, 8, 131072)]  # (B, Hkv, S); Hq = 32
SECTIONS = ["SpeedOfLight", "Occupancy", "LaunchStats", "WarpStateStats", "MemoryWorkloadAnalysis",
            "SchedulerStats"]


def target(B: int, Hkv: int, S: int) -> None:
    """ncu's target: one cell, ours and SDPA's each called three times, the last call of each in an NVTX range."""
    import torch

    from flashattn import attention_with_kvcache

    gen = torch.Generator(device="cuda").manual_seed(S + B)
    k, v = (torch.randn(B, S, Hkv, 128, device="cuda", dtype=torch.float16, generator=gen) for _ in range(2))
    q = torch.randn(B, 1, 32, 128, device="cuda", dtype=torch.float16, generator=gen)
    seqlens = torch.full((B,), S, dtype=torch.int32, device="cuda")
    qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))
    fns = {"ours": lambda: attention_with_kvcache(q, k, v, seqlens),
           "sdpa": lambda: torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, enable_gqa=Hkv != 32)}
    for name, fn in fns.items():
        for _ in range(2):
            fn()
        torch.cuda.synchronize()
        torch.cuda.nvtx.range_push(f"profile_{name}")
        fn()
        torch.cuda.synchronize()
        torch.cuda.nvtx.range_pop()


def parse(text: str) -> list[dict]:
    """ncu --csv --page details: one dict per kernel launch, {kernel, grid, block, metrics: {section/metric [unit]:
    value}}."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith('"ID"')), None)
    if start is None:
        return []
    launches: dict = {}
    for row in csv.DictReader(io.StringIO("\n".join(lines[start:]))):
        launch = launches.setdefault(row["ID"], {"kernel": row.get("Kernel Name"), "grid": row.get("Grid Size"),
                                                 "block": row.get("Block Size"), "metrics": {}})
        value = row.get("Metric Value", "")
        try:
            value = float(value.replace(",", ""))
        except ValueError:
            pass
        launch["metrics"][f"{row.get('Section Name')}/{row.get('Metric Name')} [{row.get('Metric Unit')}]"] = value
    return list(launches.values())


def main() -> int:
    OUT.mkdir(parents=True, exist_ok=True)
    ncu = find_ncu()
    result = {"cells": [], "sections": SECTIONS, "ncu": ncu}
    if ncu is None:
        print("no ncu here: nothing profiled")
    for B, Hkv, S in CELLS if ncu else []:
        for name in ("ours", "sdpa"):
            cmd = [ncu, "--clock-control", "none", "--csv", "--page", "details", "--print-units", "base",
                   "--nvtx", "--nvtx-include", f"profile_{name}/",
                   *(arg for s in SECTIONS for arg in ("--section", s)),
                   sys.executable, __file__, "--target", str(B), str(Hkv), str(S)]
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
            launches = parse(proc.stdout)
            cell = {"B": B, "Hq": 32, "Hkv": Hkv, "S": S, "D": 128, "dtype": "float16", "kernels_of": name,
                    "rc": proc.returncode, "launches": launches}
            if not launches:
                cell["output_tail"] = (proc.stdout + proc.stderr)[-3000:]
            result["cells"].append(cell)
            print(f"B{B} 32/{Hkv} S{S} {name}: rc {proc.returncode}, {len(launches)} kernels", flush=True)
            for launch in launches:
                m = launch["metrics"]
                pick = {key.split("/")[1]: val for key, val in m.items() if any(
                    s in key for s in ("Duration", "DRAM Throughput", "Achieved Occupancy", "Waves Per SM",
                                       "Registers Per Thread", "Dynamic Shared Memory Per Block",
                                       "Theoretical Occupancy", "Memory Throughput [byte/second]"))}
                print(f"  {launch['kernel'][:60]} grid {launch['grid']} block {launch['block']}: {pick}", flush=True)
    (OUT / "decode_ncu_short.json").write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "--target":
        target(*map(int, sys.argv[2:]))
    else:
        sys.exit(main())
