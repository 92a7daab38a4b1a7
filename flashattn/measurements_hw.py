"""Measurements of what the hardware does: compiled layouts and SASS, and Nsight Compute counters."""

from __future__ import annotations

import subprocess

import torch

from . import runtime
from .kernels import VARIANTS, default_options
from .kernels.v2 import attn_kernel_v2
from .profile import BANK_METRICS, NcuUnavailable, compiled_kernels, find_ncu, kernel_facts, ncu_profile
from .record import measurement

# The two paths of notebook 05: float32 on CUDA cores (the source post's), fp16 on tensor cores.
PATHS = {
    "fp32_ieee": {"dtype": "float32", "Ds": (32, 64), "B": 4, "H": 16, "N": 2048,
                  "options": {"input_precision": "ieee"}},
    "fp16_tc": {"dtype": "float16", "Ds": (64, 128), "B": 4, "H": 16, "N": 4096, "options": {}},
}
K_VARIANTS = ("v2", "v2_kt", "v2_kt_view", "v2_padded")


def _configs():
    for path, p in PATHS.items():
        for D in p["Ds"]:
            for variant in K_VARIANTS:
                yield path, {"variant": variant, "dtype": p["dtype"], "B": p["B"], "H": p["H"], "N": p["N"],
                             "D": D, "causal": False, "options": dict(p["options"])}


def _launch_options(cfg) -> dict:
    """Tile sizes, warps and stages the configuration ran with (the variant's defaults on a GPU)."""
    opts = default_options(cfg["variant"], getattr(torch, cfg["dtype"]), cfg["D"], mode="gpu")
    opts.update(cfg["options"])
    return {k: opts[k] for k in ("block_m", "block_n", "num_warps", "num_stages")}


@measurement("compiled_layouts", description="shared layouts (TTGIR), resources and SASS counts of v2 variants")
def compiled_layouts() -> dict:
    rows = []
    for path, cfg in _configs():
        q, k, v = runtime.random_qkv(cfg["B"], cfg["H"], cfg["N"], cfg["D"], dtype=getattr(torch, cfg["dtype"]),
                                     device="cuda")
        attn_kernel_v2.device_caches.clear()
        VARIANTS[cfg["variant"]](q, k, v, **cfg["options"])
        torch.cuda.synchronize()
        (kernel,) = compiled_kernels(attn_kernel_v2)
        rows.append({"path": path, **{k2: cfg[k2] for k2 in ("variant", "dtype", "D", "N")}, **_launch_options(cfg),
                     **kernel_facts(kernel)})
    return {"rows": rows, "notes": "default options of each variant; SASS from the cubin via cuobjdump"}


def _ncu_version() -> str | None:
    ncu = find_ncu()
    if not ncu:
        return None
    out = subprocess.run([ncu, "--version"], capture_output=True, text=True, timeout=60)
    return out.stdout.strip().splitlines()[-1] if out.stdout else None


@measurement("bank_conflicts", description="Nsight Compute shared-memory counters of v2, v2_kt, v2_kt_view, v2_padded")
def bank_conflicts() -> dict:
    configs = list(_configs())
    try:
        profiled = ncu_profile([cfg for _, cfg in configs], BANK_METRICS, kernel_regex="attn_kernel_v2")
    except NcuUnavailable as err:
        return {"rows": [], "error": str(err)}
    rows = []
    for (path, cfg), launches in zip(configs, profiled, strict=True):
        (launch,) = launches
        rows.append({"path": path, **{k: cfg[k] for k in ("variant", "dtype", "B", "H", "N", "D")},
                     **_launch_options(cfg), "grid": launch["grid"], "block": launch["block"],
                     "metrics": launch["metrics"]})
    return {"rows": rows, "metrics": BANK_METRICS, "ncu_version": _ncu_version(),
            "notes": "ncu --clock-control none; second launch of each configuration (the first compiles)"}
