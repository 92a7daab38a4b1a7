"""What the compiler made of each variant (notebook 07): compiled facts, deferred normalization and exp2,
achieved occupancy.

Each measurement is registered separately (``python -m flashattn.record --only NAME``):

* ``compiled_facts``       registers, spills, shared memory, SASS counts and occupancy of every modelled variant
* ``compiled_facts_fast``  the same for the ``fast`` variant (its autotuner may compile many configs)
* ``normalization_exp2``   v2 with division in the loop or deferred, exp or exp2: time, SASS, resources
* ``occupancy_ncu``        Nsight Compute's achieved and theoretical occupancy for a few kernels
"""

from __future__ import annotations

import functools
import time

import torch

from flashattn import runtime
from flashattn.bench import tflops, time_ms
from flashattn.kernels import VARIANTS, launch_tiles, registry
from flashattn.kernels.fast import tuned_config
from flashattn.measure.compiled import compiled_kernels, instruction_summary, kernel_facts, kernel_name
from flashattn.measure.hardware import device_properties
from flashattn.measure.measurements.tuning import CHECK, log, problems
from flashattn.measure.profile import NcuUnavailable, ncu_profile
from flashattn.models.occupancy import SMLimits, kernel_occupancy
from flashattn.models.tuning import PATHS, short_error
from flashattn.record import measurement
from flashattn.reference import reference, rel_error


def compiled_variants() -> list[str]:
    """The variants ``compiled_facts`` compiles: every one the course's models cover (``fast``, autotuned
    over many configurations, has its own measurement)."""
    return registry.names(traffic=True)


def _compiled_rows(variants) -> list[dict]:
    limits = SMLimits.from_properties(device_properties())
    rows = []
    for path, p, D in problems():
        dtype = getattr(torch, p["dtype"])
        q, k, v = runtime.random_qkv(p["B"], p["H"], p["N"], D, dtype=dtype, seed_value=D, device="cuda")
        for variant in variants:
            base = {"path": path, "variant": variant, "dtype": p["dtype"], "B": p["B"], "H": p["H"], "N": p["N"],
                    "D": D, **launch_tiles(variant, dtype, D)}
            t0 = time.perf_counter()
            tuned = {}
            try:
                jits = registry.jit_kernels(variant)
                fn = registry.get(variant).fn
                for _ in range(2):  # the second pass keeps only what runs (an autotuner's chosen config)
                    for jit in jits:
                        jit.device_caches.clear()
                    fn(q, k, v, **p["options"])
                    torch.cuda.synchronize()
                ms = time_ms(functools.partial(fn, q, k, v, **p["options"]), warmup=5, rep=20)
                # fast: the tiles autotuning chose, over the first of its space and over the compiler's
                # num_stages (which the Gluon kernel does not use: its stages are the K/V ring's)
                if variant == "fast":
                    tuned = tuned_config(D, dtype, p["N"], p["H"], False, B=p["B"]) or {}
                for jit in jits:
                    for kernel in compiled_kernels(jit):
                        facts = kernel_facts(kernel)
                        facts["instructions"] = instruction_summary(facts.get("sass_counts", {}))
                        rows.append({**base, "kernel": kernel_name(jit), **facts, **tuned,
                                     "occupancy": kernel_occupancy(facts, limits), "ms": ms,
                                     "tflops": tflops(p["B"], p["H"], p["N"], D, ms)})
            except Exception as err:  # noqa: BLE001 - a failure is itself a result
                rows.append({**base, "error": short_error(err)})
            log(f"{path} D={D} {variant}: {time.perf_counter() - t0:.1f} s"
                + (f" ERROR {rows[-1]['error'][:80]}" if "error" in rows[-1] else ""))
        del q, k, v
        torch.cuda.empty_cache()
    return rows


_FACTS_NOTES = ("default options of each variant (naive: 3 kernels, one row each); SASS counts are static "
                "(instructions in the binary, a loop body counted once), from the cubin via cuobjdump; "
                "occupancy by flashattn.occupancy from the compiled registers and shared memory; "
                "ms/tflops: do_bench median (warmup 5 ms, rep 20 ms) of the whole variant call")


@measurement("compiled_facts", description="registers, spills, shared memory, SASS counts, occupancy of every variant")
def compiled_facts() -> dict:
    return {"rows": _compiled_rows(compiled_variants()), "paths": PATHS, "notes": _FACTS_NOTES}


@measurement("compiled_facts_fast", description="registers, spills, shared memory, SASS counts of the fast variant")
def compiled_facts_fast() -> dict:
    return {"rows": _compiled_rows(("fast",)), "paths": PATHS, "notes": _FACTS_NOTES}


# --- deferred normalization and exp2 ------------------------------------------------------------

ABLATIONS = [
    {"name": "divide in the loop, exp", "deferred_norm": False, "use_exp2": False},
    {"name": "deferred, exp", "deferred_norm": True, "use_exp2": False},
    {"name": "divide in the loop, exp2", "deferred_norm": False, "use_exp2": True},
    {"name": "deferred, exp2", "deferred_norm": True, "use_exp2": True},
]


@measurement("normalization_exp2", description="v2 with division in the loop or deferred, exp or exp2")
def normalization_exp2() -> dict:
    limits = SMLimits.from_properties(device_properties())
    (jit,) = registry.jit_kernels("v2")
    rows = []
    for path, p, D in problems():
        dtype = getattr(torch, p["dtype"])
        q, k, v = runtime.random_qkv(p["B"], p["H"], p["N"], D, dtype=dtype, seed_value=D, device="cuda")
        cq, ck, cv = runtime.random_qkv(CHECK["B"], CHECK["H"], CHECK["N"], D, dtype=dtype, seed_value=7,
                                        device="cuda")
        ref = reference(cq, ck, cv)
        for ab in ABLATIONS:
            opts = {**p["options"], "deferred_norm": ab["deferred_norm"], "use_exp2": ab["use_exp2"]}
            row = {"path": path, "dtype": p["dtype"], "B": p["B"], "H": p["H"], "N": p["N"], "D": D, **ab,
                   **launch_tiles("v2", dtype, D)}
            try:
                jit.device_caches.clear()
                row["rel_error"] = rel_error(VARIANTS["v2"](cq, ck, cv, **opts), ref)
                (kernel,) = compiled_kernels(jit)
                facts = kernel_facts(kernel)
                facts.pop("shared_layouts", None)
                row.update(facts, instructions=instruction_summary(facts.get("sass_counts", {})),
                           occupancy=kernel_occupancy(facts, limits))
                row["ms"] = time_ms(functools.partial(VARIANTS["v2"], q, k, v, **opts), warmup=10, rep=50)
                row["tflops"] = tflops(p["B"], p["H"], p["N"], D, row["ms"])
            except Exception as err:  # noqa: BLE001
                row["error"] = short_error(err)
            rows.append(row)
            log(f"{path} D={D} {ab['name']}: " + (f"{row['tflops']:.0f} TFLOP/s" if "tflops" in row
                                                   else row.get("error", "")[:80]))
        del q, k, v, cq, ck, cv, ref
        torch.cuda.empty_cache()
    return {"rows": rows, "check": CHECK, "flop_convention": "4*B*H*N^2*D",
            "notes": "v2 (K row-major, tl.trans) at its default tiles; deferred_norm=False divides the accumulator "
                     "by the running sum at every K/V block (the v1 way); use_exp2=True folds log2(e) into the "
                     "scale and calls exp2; do_bench median (warmup 10 ms, rep 50 ms); rel_error on the CHECK "
                     "problem against the float64 reference; SASS counts are static"}


# --- Nsight Compute: achieved occupancy ---------------------------------------------------------

OCCUPANCY_METRICS = ["sm__warps_active.avg.pct_of_peak_sustained_active", "sm__maximum_warps_per_active_cycle_pct",
                     "launch__occupancy_limit_blocks", "gpu__time_duration.sum"]


def _ncu_targets() -> list[dict]:
    targets = []
    for path, p, D in problems():
        targets.append({"variant": "v2", "dtype": p["dtype"], "B": p["B"], "H": p["H"], "N": p["N"], "D": D,
                        "options": dict(p["options"]), "path": path})
    p = PATHS["fp16_tc"]
    targets.append({"variant": "v1", "dtype": "float16", "B": p["B"], "H": p["H"], "N": p["N"], "D": 64,
                    "options": {}, "path": "fp16_tc"})
    return targets


@measurement("occupancy_ncu", description="Nsight Compute achieved/theoretical occupancy of v1 and v2 kernels")
def occupancy_ncu() -> dict:
    targets = _ncu_targets()
    try:
        profiled = ncu_profile(targets, OCCUPANCY_METRICS, kernel_regex="attn_kernel")
    except NcuUnavailable as err:
        return {"rows": [], "error": str(err)}
    rows = []
    for cfg, launches in zip(targets, profiled, strict=True):
        for launch in launches:
            rows.append({**cfg, **launch_tiles(cfg["variant"], getattr(torch, cfg["dtype"]), cfg["D"]),
                         "kernel": launch["kernel"], "grid": launch["grid"], "block": launch["block"],
                         "metrics": launch["metrics"]})
    return {"rows": rows, "metrics": OCCUPANCY_METRICS,
            "notes": "ncu --clock-control none; second launch of each configuration; achieved = "
                     "sm__warps_active.avg.pct_of_peak_sustained_active, theoretical = "
                     "sm__maximum_warps_per_active_cycle_pct"}
