"""What the compiler made of each variant (notebook 07): compiled facts, deferred normalization and exp2,
achieved occupancy.

Each measurement is registered separately (``python -m flashattn.record --only NAME``):

* ``compiled_facts``       registers, spills, shared memory, SASS counts and occupancy of every modelled variant
* ``compiled_facts_fast``  the same for the ``fast`` variant (its autotuner may compile many configs)
* ``normalization_exp2``   v2 with division in the loop or deferred, exp or exp2: time (interleaved rounds),
                           SASS (whole kernel and loop body), resources, and Nsight Compute counters (fp16)
* ``occupancy_ncu``        Nsight Compute's achieved and theoretical occupancy for a few kernels
"""

from __future__ import annotations

import functools
import re
import statistics
import subprocess
import time

import torch

from flashattn import runtime
from flashattn.bench import tflops, time_ms, time_rounds
from flashattn.kernels import VARIANTS, launch_tiles, registry
from flashattn.kernels.fast import tuned_config
from flashattn.measure.compiled import compiled_kernels, instruction_summary, kernel_facts, kernel_name
from flashattn.measure.hardware import device_properties
from flashattn.measure.measurements.tuning import CHECK, log, problems
from flashattn.measure.profile import (
    STALL_REASONS,
    WARP_METRICS,
    NcuUnavailable,
    find_ncu,
    ncu_profile,
    ncu_version,
    target_config,
)
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
ROUNDS = 3  # interleaved timing rounds per problem (the four kernels meet the same clock drift)

# What the counters say about the exp -> exp2 speed-up (notebook 07): instructions executed, how long a warp
# waits between two of them and why, warps per scheduler, the clock, the pipes' load. Nsight Compute
# versions differ in names; the ones this one does not know are left out (the entry lists them).
ALL_STALL_REASONS = (*STALL_REASONS, "no_instruction", "branch_resolving", "dispatch_stall", "drain", "imc_miss",
                     "membar", "misc", "sleeping", "tex_throttle")
EXP2_METRICS = [
    "gpu__time_duration.sum",
    "sm__cycles_elapsed.avg.per_second",  # the SM clock while the kernel ran (cycles per second)
    "smsp__cycles_active.avg",  # cycles a scheduler had at least one warp
    "smsp__inst_executed.sum",  # warp instructions executed (dynamic: a loop body once per iteration)
    "smsp__inst_executed_pipe_xu.sum",  # ... of them on the XU pipe (MUFU: EX2, RCP; some conversions)
    "smsp__inst_executed_pipe_fma.sum",  # ... on the FMA pipe (FFMA, FMUL, FADD)
    "smsp__inst_executed_pipe_alu.sum",  # ... on the ALU pipe (FSETP, FMNMX, FSEL, integer logic)
    "smsp__issue_active.avg.per_cycle_active",  # instructions issued per scheduler per active cycle (max 1)
    "smsp__warps_active.avg.per_cycle_active",  # warps resident per scheduler
    "smsp__warps_eligible.avg.per_cycle_active",  # warps ready to issue per scheduler
    "smsp__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active",  # XU (MUFU) pipe load
    "sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active",  # tensor cores (wgmma) busy
    "sm__warps_active.avg.pct_of_peak_sustained_active",  # achieved occupancy
    "smsp__average_warp_latency_per_inst_issued.ratio",  # cycles between two instructions of a warp
    *(f"smsp__average_warps_issue_stalled_{reason}_per_issue_active.ratio" for reason in ALL_STALL_REASONS),
]
KNOWN_METRICS = set(WARP_METRICS) | {"gpu__time_duration.sum"}  # recorded before with this ncu: never dropped


def _base_name(metric: str) -> str:
    return metric.split(".")[0]


def metrics_ncu_knows(metrics: list[str], query_output: str) -> tuple[list[str], list[str]]:
    """Split ``metrics`` into those whose base name ``ncu --query-metrics`` lists and those it does not.

    Metrics in ``KNOWN_METRICS`` are always kept; an empty or unreadable query keeps everything (ncu then
    names what it rejects)."""
    listed = set(re.findall(r"^\"?([a-z0-9]+__[A-Za-z0-9_]+)", query_output, flags=re.MULTILINE))
    if len(listed) < 50:
        return list(metrics), []
    keep = [m for m in metrics if m in KNOWN_METRICS or _base_name(m) in listed]
    return keep, [m for m in metrics if m not in keep]


def _query_metrics() -> str:
    ncu = find_ncu()
    if ncu is None:
        return ""
    try:
        return subprocess.run([ncu, "--query-metrics", "--csv"], capture_output=True, text=True, timeout=120).stdout
    except (OSError, subprocess.SubprocessError):
        return ""


def _exp2_counters(paths=("fp16_tc",)) -> dict:
    """Nsight Compute counters of the four ablations on ``paths``: ``{"rows": [...], "metrics", "dropped"}``
    (or ``{"error"}``). Each configuration at its path's problem and v2's default tiles."""
    targets = [target_config("v2", B=p["B"], H=p["H"], N=p["N"], D=D, dtype=p["dtype"],
                             options={**p["options"], "deferred_norm": ab["deferred_norm"],
                                      "use_exp2": ab["use_exp2"]})
               for path, p, D in problems(paths) for ab in ABLATIONS]
    metrics, dropped = metrics_ncu_knows(EXP2_METRICS, _query_metrics())
    try:
        profiled = ncu_profile(targets, metrics, kernel_regex="attn_kernel_v2")
    except NcuUnavailable as err:
        if find_ncu() is None or "ERR_NVGPUCTRPERM" in str(err):
            return {"error": str(err), "metrics": metrics, "dropped": dropped}
        # a metric name this ncu rejects: once more with the names known to work
        fallback = [m for m in metrics if m in KNOWN_METRICS or m == "smsp__inst_executed.sum"]
        dropped += [m for m in metrics if m not in fallback]
        metrics = fallback
        try:
            profiled = ncu_profile(targets, metrics, kernel_regex="attn_kernel_v2")
        except NcuUnavailable as err2:
            return {"error": f"{err}; with the known metrics only: {err2}", "metrics": metrics, "dropped": dropped}
    rows = []
    for cfg, launches in zip(targets, profiled, strict=True):
        (launch,) = launches
        rows.append({"D": cfg["D"], "dtype": cfg["dtype"], **{k: cfg["options"][k] for k in ("deferred_norm",
                                                                                             "use_exp2")},
                     "grid": launch["grid"], "block": launch["block"], "metrics": launch["metrics"]})
    return {"rows": rows, "metrics": metrics, "dropped": dropped, "ncu_version": ncu_version()}


def _ablation_row(path, p, D, ab, jit, limits, check) -> tuple[dict, dict]:
    """One ablation checked on the CHECK problem and its compiled facts; returns (row, options)."""
    opts = {**p["options"], "deferred_norm": ab["deferred_norm"], "use_exp2": ab["use_exp2"]}
    row = {"path": path, "dtype": p["dtype"], "B": p["B"], "H": p["H"], "N": p["N"], "D": D, **ab,
           **launch_tiles("v2", getattr(torch, p["dtype"]), D)}
    try:
        cq, ck, cv, ref = check
        jit.device_caches.clear()
        row["rel_error"] = rel_error(VARIANTS["v2"](cq, ck, cv, **opts), ref)
        (kernel,) = compiled_kernels(jit)
        facts = kernel_facts(kernel)
        facts.pop("shared_layouts", None)
        row.update(facts, instructions=instruction_summary(facts.get("sass_counts", {})),
                   loop_instructions=instruction_summary(facts.get("loop_sass_counts", {})),
                   occupancy=kernel_occupancy(facts, limits))
    except Exception as err:  # noqa: BLE001
        row["error"] = short_error(err)
    return row, opts


@measurement("normalization_exp2", description="v2 with division in the loop or deferred, exp or exp2; with "
                                                "Nsight Compute counters of the tensor-core kernels")
def normalization_exp2() -> dict:
    limits = SMLimits.from_properties(device_properties())
    (jit,) = registry.jit_kernels("v2")
    rows = []
    for path, p, D in problems():
        dtype = getattr(torch, p["dtype"])
        q, k, v = runtime.random_qkv(p["B"], p["H"], p["N"], D, dtype=dtype, seed_value=D, device="cuda")
        cq, ck, cv = runtime.random_qkv(CHECK["B"], CHECK["H"], CHECK["N"], D, dtype=dtype, seed_value=7,
                                        device="cuda")
        check = (cq, ck, cv, reference(cq, ck, cv))
        problem_rows, fns = [], {}
        for ab in ABLATIONS:
            row, opts = _ablation_row(path, p, D, ab, jit, limits, check)
            problem_rows.append(row)
            if "error" not in row:
                fns[ab["name"]] = functools.partial(VARIANTS["v2"], q, k, v, **opts)
        try:
            times = time_rounds(fns, ROUNDS)
        except Exception as err:  # noqa: BLE001
            times = {}
            for row in problem_rows:
                row.setdefault("error", f"timing: {short_error(err)}")
        for row in problem_rows:
            if row["name"] in times:
                row["ms_rounds"] = times[row["name"]]
                row["ms"] = statistics.median(times[row["name"]])
                row["tflops"] = tflops(p["B"], p["H"], p["N"], D, row["ms"])
            log(f"{path} D={D} {row['name']}: " + (f"{row['tflops']:.0f} TFLOP/s" if "tflops" in row
                                                    else row.get("error", "")[:80]))
        rows += problem_rows
        del q, k, v, cq, ck, cv, check
        torch.cuda.empty_cache()
    counters = _exp2_counters()
    log("ncu: " + (counters["error"][:100] if "error" in counters else f"{len(counters['rows'])} kernels profiled"))
    return {"rows": rows, "check": CHECK, "rounds": ROUNDS, "flop_convention": "4*B*H*N^2*D", "ncu": counters,
            "notes": "v2 (K row-major, tl.trans) at its default tiles; deferred_norm=False divides the accumulator "
                     "by the running sum at every K/V block (the v1 way); use_exp2=True folds log2(e) into the "
                     f"scale and calls exp2; the four kernels of a problem timed in {ROUNDS} interleaved rounds "
                     "of do_bench medians (ms = median of the rounds, ms_rounds = each round); rel_error on the "
                     "CHECK problem against the float64 reference; SASS counts are static, from cuobjdump -sass "
                     "(instructions: the whole kernel; loop_instructions: those inside its loop, one K/V "
                     "iteration); ncu: Nsight Compute --clock-control none, second launch of each "
                     "fp16 configuration"}


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
