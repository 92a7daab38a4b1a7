"""Block sizes, warps and stages on the GPU (notebook 08): the block sweeps and ``triton.autotune`` over v2.

* ``block_sweep_<path>_d<D>``  v2 over BLOCK_M × BLOCK_N × warps × stages (failures kept as rows)
* ``autotune_v2_d<D>``         triton.autotune over a pruned space (fp16): what it tried, what it picked, and its
                               pick timed next to the alternatives in interleaved rounds
"""

from __future__ import annotations

import functools
import statistics
import time

import torch

from flashattn import runtime
from flashattn.bench import tflops, time_ms, time_rounds
from flashattn.kernels import VARIANTS, launch_tiles, registry
from flashattn.measure import autotune, recorded
from flashattn.measure.compiled import compiled_kernels, kernel_resources
from flashattn.measure.hardware import device_properties
from flashattn.models import tuning
from flashattn.models.occupancy import SMLimits, kernel_occupancy
from flashattn.record import measurement
from flashattn.reference import reference, rel_error

# A small problem every configuration is first checked on: N is not a multiple of any block size, but it
# is a multiple of 16 and H = 16, like the timed problems, so Triton compiles one kernel for both.
CHECK = {"B": 1, "H": 16, "N": 1040}
TOLERANCE = {"float16": 1e-2, "float32": 1e-4}


def log(msg: str) -> None:
    print(f"  [tuning] {msg}", flush=True)


def problems(paths=("fp16_tc", "fp32_ieee")):
    """(path, its problem, D) for every head dimension of each path of ``flashattn.tuning.PATHS``."""
    for path in paths:
        p = tuning.PATHS[path]
        for D in p["Ds"]:
            yield path, p, D


def _progress_text(done: int, total: int, width: int = 24, label: str = "") -> str:
    """A plain text progress bar: ``[#########...............]  9/24 label``."""
    total = max(total, 1)
    filled = round(width * min(done, total) / total)
    return f"[{'#' * filled}{'.' * (width - filled)}] {done:>{len(str(total))}}/{total} {label}".rstrip()


# --- the block sweep -----------------------------------------------------------------------------

def sweep(path: str, D: int, configs: list[dict], *, warmup: int = 5, rep: int = 20) -> list[dict]:
    """Run v2 at each configuration: check it on the CHECK problem, then time it on the path's problem."""
    p = tuning.PATHS[path]
    (jit,) = registry.jit_kernels("v2")
    dtype = getattr(torch, p["dtype"])
    q, k, v = runtime.random_qkv(p["B"], p["H"], p["N"], D, dtype=dtype, seed_value=D, device="cuda")
    cq, ck, cv = runtime.random_qkv(CHECK["B"], CHECK["H"], CHECK["N"], D, dtype=dtype, seed_value=7, device="cuda")
    ref = reference(cq, ck, cv)
    limits = SMLimits.from_properties(device_properties())
    rows = []
    t_start = time.perf_counter()
    for i, cfg in enumerate(configs):
        opts = {**p["options"], **cfg}
        row = {"path": path, "dtype": p["dtype"], "B": p["B"], "H": p["H"], "N": p["N"], "D": D, **cfg}
        try:
            jit.device_caches.clear()
            err = rel_error(VARIANTS["v2"](cq, ck, cv, **opts), ref)
            row["rel_error"] = err
            kernels = compiled_kernels(jit)
            if kernels:
                res = kernel_resources(kernels[0])
                row.update(registers_per_thread=res["registers_per_thread"], spills=res["spills"],
                           shared_bytes=res["shared_bytes"], occupancy=kernel_occupancy(res, limits).get("occupancy"))
            if not err < TOLERANCE[p["dtype"]]:
                row["error"] = f"wrong result: relative error {err:.2e}"
            else:
                row["ms"] = time_ms(functools.partial(VARIANTS["v2"], q, k, v, **opts), warmup=warmup, rep=rep)
                row["tflops"] = tflops(p["B"], p["H"], p["N"], D, row["ms"])
        except Exception as exc:  # noqa: BLE001 - out of shared memory, compile errors: recorded as rows
            row["error"] = tuning.short_error(exc)
        rows.append(row)
        result = f"{row['tflops']:.0f} TFLOP/s" if "tflops" in row else row["error"][:70]
        print("  " + _progress_text(i + 1, len(configs), label=f"{tuning.config_label(cfg)}: {result} "
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


SWEEP_NAMES = {f"block_sweep_{path.split('_')[0]}_d{D}": (path, D) for path, p in tuning.PATHS.items() for D in p["Ds"]}
for _name, (_path, _D) in SWEEP_NAMES.items():
    measurement(_name, description=f"v2 block sizes, warps and stages: {_path}, D={_D}")(
        functools.partial(_sweep_entry, _path, _D))


# --- triton.autotune ----------------------------------------------------------------------------

COMPARE_ROUNDS = 5  # interleaved rounds in which the tuner's pick is timed next to the alternatives
COMPARE_TOP = 3  # the tuner's fastest configurations timed again, side by side


def comparison_configs(picked: dict, tuner_timings: list[dict], default: dict, sweep_best: dict | None,
                       top: int = COMPARE_TOP) -> dict[str, dict]:
    """What the autotuner's pick is timed against, by label: the same configuration launched directly,
    the tuner's next fastest, v2's default and the recorded sweep's best (each configuration once)."""
    keys = ("block_m", "block_n", "num_warps", "num_stages")
    out: dict[str, dict] = {}

    def add(label, cfg):
        cfg = {k: cfg[k] for k in keys}
        if cfg not in out.values():
            out[label] = cfg

    add("picked, launched directly", picked)
    ranked = [t for t in tuner_timings if t.get("ms") is not None]
    for i, t in enumerate(ranked[:top]):
        add(f"tuner's #{i + 1}", t)
    add("v2 default", default)
    if sweep_best:
        add("sweep's best", sweep_best)
    return out


def _recorded_sweep_best(D: int, path: str) -> dict | None:
    entry = recorded.find(f"block_sweep_{path.split('_')[0]}_d{D}")
    return tuning.best_row(entry["rows"]) if entry else None


def _interleaved(tuned, q, k, v, configs: dict[str, dict], p: dict, D: int) -> dict:
    """The autotuned kernel and each configuration, timed in COMPARE_ROUNDS interleaved rounds."""
    fns = {"autotuned": functools.partial(autotune.run_autotuned_v2, tuned, q, k, v)}
    fns.update({label: functools.partial(VARIANTS["v2"], q, k, v, **p["options"], **cfg)
                for label, cfg in configs.items()})
    failed = {}
    for label, fn in list(fns.items()):  # one that cannot run is left out of the rounds, with its error
        try:
            fn()
        except Exception as err:  # noqa: BLE001
            failed[label] = tuning.short_error(err)
            del fns[label]
    times = time_rounds(fns, COMPARE_ROUNDS)
    rows = [{"label": label, "config": configs.get(label), "error": error} for label, error in failed.items()]
    for label, ms_rounds in times.items():
        ms = statistics.median(ms_rounds)
        rows.append({"label": label, "config": configs.get(label, tuning.config_dict(tuned.best_config)),
                     "ms_rounds": ms_rounds, "ms": ms, "tflops": tflops(p["B"], p["H"], p["N"], D, ms),
                     "spread": max(ms_rounds) / min(ms_rounds) - 1})
    return {"rounds": COMPARE_ROUNDS, "rows": rows}


def autotune_entry(D: int, path: str = "fp16_tc") -> dict:
    """triton.autotune over the pruned AUTOTUNE_SPACE for v2 at one head dimension; then its pick timed next
    to the alternatives in interleaved rounds."""
    p = tuning.PATHS[path]
    dtype = getattr(torch, p["dtype"])
    limit = autotune.shared_limit()
    full = tuning.sweep_configs(tuning.AUTOTUNE_SPACE)
    pruned = tuning.prune_autotune_space(full, d_pad=D, elem_bytes=dtype.itemsize, shared_limit=limit)
    entry = {"path": path, "dtype": p["dtype"], "B": p["B"], "H": p["H"], "N": p["N"], "D": D,
             "space": tuning.AUTOTUNE_SPACE, "space_size": len(full), "pruned_size": len(pruned), "pruned": pruned,
             "key": ["N", "D", "CAUSAL", "PRECISION", "dtypes"], "prune_rule": tuning.PRUNE_RULE,
             "flop_convention": "4*B*H*N^2*D",
             "notes": "triton.autotune(configs, key, prune_configs_by={'early_config_prune': shared-memory "
                      "estimate}, do_bench=do_bench(warmup=5, rep=20)) on attn_kernel_v2; timings = the tuner's "
                      "own medians; then the autotuned kernel, its pick launched directly, the tuner's next "
                      f"fastest, v2's default and the recorded sweep's best timed in {COMPARE_ROUNDS} interleaved "
                      "rounds of do_bench medians (interleaved.rows: ms_rounds per round, ms = their median, "
                      "spread = slowest / fastest round - 1); ms/tflops and default_ms/default_tflops come from "
                      "those rounds"}
    try:
        q, k, v = runtime.random_qkv(p["B"], p["H"], p["N"], D, dtype=dtype, seed_value=D, device="cuda")
        tuned = autotune.autotuned_v2(autotune.triton_configs(pruned))
        t0 = time.perf_counter()
        o = autotune.run_autotuned_v2(tuned, q, k, v)
        torch.cuda.synchronize()
        entry["tuning_seconds"] = time.perf_counter() - t0
        entry["best"] = tuning.config_dict(tuned.best_config)
        entry["timings"] = autotune.timings_table(tuned)
        entry["default"] = launch_tiles("v2", dtype, D)
        entry["rel_error_vs_default"] = rel_error(o, VARIANTS["v2"](q, k, v))
        configs = comparison_configs(entry["best"], entry["timings"], entry["default"], _recorded_sweep_best(D, path))
        entry["interleaved"] = _interleaved(tuned, q, k, v, configs, p, D)
        timed = [r for r in entry["interleaved"]["rows"] if "ms" in r]
        by_label = {r["label"]: r for r in timed}
        default_row = next(r for r in timed if r["label"] != "autotuned" and r["config"] == entry["default"])
        entry.update(ms=by_label["autotuned"]["ms"], tflops=by_label["autotuned"]["tflops"],
                     default_ms=default_row["ms"], default_tflops=default_row["tflops"])
        log(f"autotune D={D}: {len(pruned)} configs in {entry['tuning_seconds']:.1f} s -> "
            f"{tuning.config_label(entry['best'])}, {entry['tflops']:.0f} TFLOP/s "
            f"(default {entry['default_tflops']:.0f}); rounds: "
            + ", ".join(f"{r['label']} {r['tflops']:.0f} (±{r['spread']:.0%})" for r in timed))
        del q, k, v, o
        torch.cuda.empty_cache()
    except Exception as err:  # noqa: BLE001
        entry["error"] = tuning.short_error(err, 400)
        log(f"autotune D={D}: ERROR {entry['error'][:100]}")
    return entry


AUTOTUNE_NAMES = {f"autotune_v2_d{D}": D for D in tuning.PATHS["fp16_tc"]["Ds"]}
for _name, _D in AUTOTUNE_NAMES.items():
    measurement(_name, description=f"triton.autotune over a pruned space for v2, fp16, D={_D}")(
        functools.partial(autotune_entry, _D))
