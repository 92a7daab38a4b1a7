"""Compiled-kernel facts of every variant, normalization/exp2 ablations and the block-size sweep (notebooks 07 and 08).

Each measurement is registered separately (``python -m flashattn.record --only NAME``), so that one
can be re-run on its own:

* ``compiled_facts``       registers, spills, shared memory, SASS counts and occupancy of every variant
* ``compiled_facts_fast``  the same for the ``fast`` variant (its autotuner may compile many configs)
* ``normalization_exp2``   v2 with division in the loop or deferred, exp or exp2: time, SASS, resources
* ``block_sweep_<path>_d<D>``  v2 over BLOCK_M × BLOCK_N × warps × stages (failures kept as rows)
* ``autotune_v2_d<D>``     triton.autotune over a pruned space (fp16): what it tried and what it picked
* ``occupancy_ncu``        Nsight Compute's achieved and theoretical occupancy for a few kernels
"""

from __future__ import annotations

import functools
import time

import torch

from flashattn import runtime
from flashattn.bench import tflops, time_ms
from flashattn.exercises._check import rel_error
from flashattn.kernels import VARIANTS, launch_tiles
from flashattn.kernels.fast import tuned_config
from flashattn.measure.measurements.core import device_properties
from flashattn.measure.profile import NcuUnavailable, compiled_kernels, kernel_facts, kernel_resources, ncu_profile
from flashattn.models import tuning
from flashattn.models.occupancy import SMLimits, occupancy
from flashattn.record import measurement
from flashattn.reference import reference

# A small problem every configuration is first checked on: N is not a multiple of any block size, but it
# is a multiple of 16 and H = 16, like the timed problems, so Triton compiles one kernel for both.
CHECK = {"B": 1, "H": 16, "N": 1040}
TOLERANCE = {"float16": 1e-2, "float32": 1e-4}
COMPILED_VARIANTS = ("naive", "v1", "v2", "v2_kt", "v2_kt_view", "v2_padded")


def _log(msg: str) -> None:
    print(f"  [tuning] {msg}", flush=True)


def _sm_limits() -> SMLimits:
    return SMLimits.from_properties(device_properties())


def _occupancy(res: dict, limits: SMLimits) -> dict:
    try:
        return occupancy(registers_per_thread=res["registers_per_thread"], shared_bytes=res["shared_bytes"],
                         num_warps=res["num_warps"], limits=limits)
    except ValueError as err:
        return {"error": str(err)}


def _variant_jits(variant: str) -> list:
    """The ``@triton.jit`` functions Triton compiles when ``variant`` runs."""
    if variant == "naive":
        from flashattn.kernels.naive import pv_kernel, scores_kernel, softmax_kernel

        return [scores_kernel, softmax_kernel, pv_kernel]
    if variant == "v1":
        from flashattn.kernels.v1 import attn_kernel_v1

        return [attn_kernel_v1]
    if variant.startswith("v2"):
        from flashattn.kernels.v2 import attn_kernel_v2

        return [attn_kernel_v2]
    if variant == "fast":
        from flashattn.kernels import fast

        return [tuning.unwrap_jit(k) for k in fast.JIT_KERNELS]
    raise ValueError(f"no kernels known for variant {variant!r}")


def _problems(paths=("fp16_tc", "fp32_ieee")):
    for path in paths:
        p = tuning.PATHS[path]
        for D in p["Ds"]:
            yield path, p, D


def _compiled_rows(variants) -> list[dict]:
    limits = _sm_limits()
    rows = []
    for path, p, D in _problems():
        dtype = getattr(torch, p["dtype"])
        q, k, v = runtime.random_qkv(p["B"], p["H"], p["N"], D, dtype=dtype, seed_value=D, device="cuda")
        for variant in variants:
            base = {"path": path, "variant": variant, "dtype": p["dtype"], "B": p["B"], "H": p["H"], "N": p["N"],
                    "D": D, **launch_tiles(variant, dtype, D)}
            t0 = time.perf_counter()
            tuned = {}
            try:
                jits = _variant_jits(variant)
                fn = VARIANTS[variant]
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
                        facts["instructions"] = tuning.instruction_summary(facts.get("sass_counts", {}))
                        rows.append({**base, "kernel": tuning.kernel_name(jit), **facts, **tuned,
                                     "occupancy": _occupancy(facts, limits), "ms": ms,
                                     "tflops": tflops(p["B"], p["H"], p["N"], D, ms)})
            except Exception as err:  # noqa: BLE001 - a failure is itself a result
                rows.append({**base, "error": tuning.short_error(err)})
            _log(f"{path} D={D} {variant}: {time.perf_counter() - t0:.1f} s"
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
    return {"rows": _compiled_rows(COMPILED_VARIANTS), "paths": tuning.PATHS, "notes": _FACTS_NOTES}


@measurement("compiled_facts_fast", description="registers, spills, shared memory, SASS counts of the fast variant")
def compiled_facts_fast() -> dict:
    if "fast" not in VARIANTS:
        return {"rows": [], "error": "no 'fast' variant in flashattn.VARIANTS"}
    return {"rows": _compiled_rows(("fast",)), "paths": tuning.PATHS, "notes": _FACTS_NOTES}


# --- deferred normalization and exp2 ------------------------------------------------------------

ABLATIONS = [
    {"name": "divide in the loop, exp", "deferred_norm": False, "use_exp2": False},
    {"name": "deferred, exp", "deferred_norm": True, "use_exp2": False},
    {"name": "divide in the loop, exp2", "deferred_norm": False, "use_exp2": True},
    {"name": "deferred, exp2", "deferred_norm": True, "use_exp2": True},
]


@measurement("normalization_exp2", description="v2 with division in the loop or deferred, exp or exp2")
def normalization_exp2() -> dict:
    from flashattn.kernels.v2 import attn_kernel_v2

    limits = _sm_limits()
    rows = []
    for path, p, D in _problems():
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
                attn_kernel_v2.device_caches.clear()
                row["rel_error"] = rel_error(VARIANTS["v2"](cq, ck, cv, **opts).cpu(), ref.cpu())
                (kernel,) = compiled_kernels(attn_kernel_v2)
                facts = kernel_facts(kernel)
                facts.pop("shared_layouts", None)
                row.update(facts, instructions=tuning.instruction_summary(facts.get("sass_counts", {})),
                           occupancy=_occupancy(facts, limits))
                row["ms"] = time_ms(functools.partial(VARIANTS["v2"], q, k, v, **opts), warmup=10, rep=50)
                row["tflops"] = tflops(p["B"], p["H"], p["N"], D, row["ms"])
            except Exception as err:  # noqa: BLE001
                row["error"] = tuning.short_error(err)
            rows.append(row)
            _log(f"{path} D={D} {ab['name']}: " + (f"{row['tflops']:.0f} TFLOP/s" if "tflops" in row
                                                    else row.get("error", "")[:80]))
        del q, k, v, cq, ck, cv, ref
        torch.cuda.empty_cache()
    return {"rows": rows, "check": CHECK, "flop_convention": "4*B*H*N^2*D",
            "notes": "v2 (K row-major, tl.trans) at its default tiles; deferred_norm=False divides the accumulator "
                     "by the running sum at every K/V block (the v1 way); use_exp2=True folds log2(e) into the "
                     "scale and calls exp2; do_bench median (warmup 10 ms, rep 50 ms); rel_error on the CHECK "
                     "problem against the float64 reference; SASS counts are static"}


# --- the block sweep -----------------------------------------------------------------------------

def sweep(path: str, D: int, configs: list[dict], *, warmup: int = 5, rep: int = 20) -> list[dict]:
    """Run v2 at each configuration: check it on the CHECK problem, then time it on the path's problem."""
    from flashattn.kernels.v2 import attn_kernel_v2

    p = tuning.PATHS[path]
    dtype = getattr(torch, p["dtype"])
    q, k, v = runtime.random_qkv(p["B"], p["H"], p["N"], D, dtype=dtype, seed_value=D, device="cuda")
    cq, ck, cv = runtime.random_qkv(CHECK["B"], CHECK["H"], CHECK["N"], D, dtype=dtype, seed_value=7, device="cuda")
    ref = reference(cq, ck, cv).cpu()
    limits = _sm_limits()
    rows = []
    t_start = time.perf_counter()
    for i, cfg in enumerate(configs):
        opts = {**p["options"], **cfg}
        row = {"path": path, "dtype": p["dtype"], "B": p["B"], "H": p["H"], "N": p["N"], "D": D, **cfg}
        try:
            attn_kernel_v2.device_caches.clear()
            err = rel_error(VARIANTS["v2"](cq, ck, cv, **opts).cpu(), ref)
            row["rel_error"] = err
            kernels = compiled_kernels(attn_kernel_v2)
            if kernels:
                res = kernel_resources(kernels[0])
                row.update(registers_per_thread=res["registers_per_thread"], spills=res["spills"],
                           shared_bytes=res["shared_bytes"], occupancy=_occupancy(res, limits).get("occupancy"))
            if not err < TOLERANCE[p["dtype"]]:
                row["error"] = f"wrong result: relative error {err:.2e}"
            else:
                row["ms"] = time_ms(functools.partial(VARIANTS["v2"], q, k, v, **opts), warmup=warmup, rep=rep)
                row["tflops"] = tflops(p["B"], p["H"], p["N"], D, row["ms"])
        except Exception as exc:  # noqa: BLE001 - out of shared memory, compile errors: recorded as rows
            row["error"] = tuning.short_error(exc)
        rows.append(row)
        result = f"{row['tflops']:.0f} TFLOP/s" if "tflops" in row else row["error"][:70]
        print("  " + tuning.progress_text(i + 1, len(configs), label=f"{tuning.config_label(cfg)}: {result} "
                                          f"({time.perf_counter() - t_start:.0f} s)"), flush=True)
    del q, k, v, cq, ck, cv
    torch.cuda.empty_cache()
    return rows


def _sweep_entry(path: str, D: int) -> dict:
    space = tuning.SWEEP_SPACES[path]
    rows = sweep(path, D, tuning.sweep_configs(space))
    return {"rows": rows, "space": space, "check": CHECK, "tolerance": TOLERANCE[tuning.PATHS[path]["dtype"]],
            "flop_convention": "4*B*H*N^2*D", "options": tuning.PATHS[path]["options"],
            "notes": "v2 (tl.trans), exp, deferred normalization; do_bench median (warmup 5 ms, rep 20 ms); "
                     "every configuration first checked against the float64 reference on the CHECK problem; "
                     "failures (out of shared memory, compile errors, wrong results) kept as rows with 'error'"}


def _register_sweeps():
    for path, p in tuning.PATHS.items():
        for D in p["Ds"]:
            name = f"block_sweep_{path.split('_')[0]}_d{D}"

            def run(path=path, D=D):
                return _sweep_entry(path, D)

            measurement(name, description=f"v2 block sizes, warps and stages: {path}, D={D}")(run)


_register_sweeps()
SWEEP_NAMES = [f"block_sweep_{path.split('_')[0]}_d{D}" for path, p in tuning.PATHS.items() for D in p["Ds"]]


# --- triton.autotune ----------------------------------------------------------------------------

def autotune_entry(D: int, path: str = "fp16_tc") -> dict:
    """triton.autotune over the pruned AUTOTUNE_SPACE for v2 at one head dimension."""
    p = tuning.PATHS[path]
    dtype = getattr(torch, p["dtype"])
    limit = tuning._shared_limit()
    full = tuning.sweep_configs(tuning.AUTOTUNE_SPACE)
    pruned = tuning.prune_autotune_space(full, d_pad=D, elem_bytes=dtype.itemsize, shared_limit=limit)
    entry = {"path": path, "dtype": p["dtype"], "B": p["B"], "H": p["H"], "N": p["N"], "D": D,
             "space": tuning.AUTOTUNE_SPACE, "space_size": len(full), "pruned_size": len(pruned), "pruned": pruned,
             "key": ["N", "D", "CAUSAL", "PRECISION", "dtypes"], "prune_rule": tuning.PRUNE_RULE,
             "flop_convention": "4*B*H*N^2*D",
             "notes": "triton.autotune(configs, key, prune_configs_by={'early_config_prune': shared-memory "
                      "estimate}, do_bench=do_bench(warmup=5, rep=20)) on attn_kernel_v2; timings = the tuner's "
                      "own medians; ms/tflops = do_bench median (warmup 10 ms, rep 50 ms) after tuning"}
    try:
        q, k, v = runtime.random_qkv(p["B"], p["H"], p["N"], D, dtype=dtype, seed_value=D, device="cuda")
        tuned = tuning.autotuned_v2(tuning.triton_configs(pruned))
        t0 = time.perf_counter()
        o = tuning.run_autotuned_v2(tuned, q, k, v)
        torch.cuda.synchronize()
        entry["tuning_seconds"] = time.perf_counter() - t0
        entry["best"] = tuning.config_dict(tuned.best_config)
        entry["timings"] = tuning.timings_table(tuned)
        entry["ms"] = time_ms(functools.partial(tuning.run_autotuned_v2, tuned, q, k, v), warmup=10, rep=50)
        entry["tflops"] = tflops(p["B"], p["H"], p["N"], D, entry["ms"])
        entry["default"] = launch_tiles("v2", dtype, D)
        entry["default_ms"] = time_ms(functools.partial(VARIANTS["v2"], q, k, v), warmup=10, rep=50)
        entry["default_tflops"] = tflops(p["B"], p["H"], p["N"], D, entry["default_ms"])
        entry["rel_error_vs_default"] = rel_error(o.float().cpu(), VARIANTS["v2"](q, k, v).float().cpu())
        _log(f"autotune D={D}: {len(pruned)} configs in {entry['tuning_seconds']:.1f} s -> "
             f"{tuning.config_label(entry['best'])}, {entry['tflops']:.0f} TFLOP/s "
             f"(default {entry['default_tflops']:.0f})")
        del q, k, v, o
        torch.cuda.empty_cache()
    except Exception as err:  # noqa: BLE001
        entry["error"] = tuning.short_error(err, 400)
        _log(f"autotune D={D}: ERROR {entry['error'][:100]}")
    return entry


def _register_autotune():
    for D in tuning.PATHS["fp16_tc"]["Ds"]:
        def run(D=D):
            return autotune_entry(D)

        measurement(f"autotune_v2_d{D}", description=f"triton.autotune over a pruned space for v2, fp16, D={D}")(run)


_register_autotune()
AUTOTUNE_NAMES = [f"autotune_v2_d{D}" for D in tuning.PATHS["fp16_tc"]["Ds"]]


# --- Nsight Compute: achieved occupancy ---------------------------------------------------------

OCCUPANCY_METRICS = ["sm__warps_active.avg.pct_of_peak_sustained_active", "sm__maximum_warps_per_active_cycle_pct",
                     "launch__occupancy_limit_blocks", "gpu__time_duration.sum"]


def _ncu_targets() -> list[dict]:
    targets = []
    for path, p, D in _problems():
        targets.append({"variant": "v2", "dtype": p["dtype"], "B": p["B"], "H": p["H"], "N": p["N"], "D": D,
                        "options": dict(p["options"]), "path": path})
    p = tuning.PATHS["fp16_tc"]
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
