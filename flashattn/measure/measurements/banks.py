"""Measurements of what the hardware does: compiled layouts and SASS, and Nsight Compute counters."""

from __future__ import annotations

import torch

from flashattn import runtime
from flashattn.kernels import VARIANTS, launch_tiles, registry
from flashattn.measure.bank_counters import BANK_RUN_METRICS
from flashattn.measure.compiled import compiled_kernels, kernel_facts
from flashattn.measure.profile import NcuUnavailable, kernel_regex, ncu_profile, ncu_version
from flashattn.models.tuning import PATHS
from flashattn.record import measurement

# The two paths of notebook 06b (flashattn.tuning.PATHS): float32 on CUDA cores (the source post's),
# then fp16 on tensor cores.
PATH_ORDER = ("fp32_ieee", "fp16_tc")


def k_variants() -> list[str]:
    """The variants notebook 06 teaches: the ways of storing and reading K (one kernel each)."""
    return registry.names(notebook="06")


def _configs():
    for path in PATH_ORDER:
        p = PATHS[path]
        for D in p["Ds"]:
            for variant in k_variants():
                yield path, {"variant": variant, "dtype": p["dtype"], "B": p["B"], "H": p["H"], "N": p["N"],
                             "D": D, "causal": False, "options": dict(p["options"])}


@measurement("compiled_layouts", description="shared layouts (TTGIR), resources and SASS counts of v2 variants")
def compiled_layouts() -> dict:
    rows = []
    for path, cfg in _configs():
        q, k, v = runtime.random_qkv(cfg["B"], cfg["H"], cfg["N"], cfg["D"], dtype=getattr(torch, cfg["dtype"]),
                                     device="cuda")
        (jit,) = registry.jit_kernels(cfg["variant"])
        jit.device_caches.clear()
        VARIANTS[cfg["variant"]](q, k, v, **cfg["options"])
        torch.cuda.synchronize()
        (kernel,) = compiled_kernels(jit)
        tiles = launch_tiles(cfg["variant"], cfg["dtype"], cfg["D"])  # what it ran with: the variant's defaults
        rows.append({"path": path, **{k2: cfg[k2] for k2 in ("variant", "dtype", "D", "N")}, **tiles,
                     **kernel_facts(kernel)})
    return {"rows": rows, "notes": "default options of each variant; SASS from the cubin via cuobjdump"}


@measurement("bank_conflicts", description="Nsight Compute shared-memory counters of v2, v2_kt, v2_kt_view, v2_padded")
def bank_conflicts() -> dict:
    configs = list(_configs())
    try:
        profiled = ncu_profile([cfg for _, cfg in configs], BANK_RUN_METRICS, kernel_regex=kernel_regex(k_variants()))
    except NcuUnavailable as err:
        return {"rows": [], "error": str(err)}
    rows = []
    for (path, cfg), launches in zip(configs, profiled, strict=True):
        (launch,) = launches
        rows.append({"path": path, **{k: cfg[k] for k in ("variant", "dtype", "B", "H", "N", "D")},
                     **launch_tiles(cfg["variant"], cfg["dtype"], cfg["D"]), "grid": launch["grid"],
                     "block": launch["block"], "metrics": launch["metrics"]})
    return {"rows": rows, "metrics": BANK_RUN_METRICS, "ncu_version": ncu_version(),
            "notes": "ncu --clock-control none; second launch of each configuration (the first compiles)"}
