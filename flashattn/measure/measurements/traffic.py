"""Nsight Compute DRAM and L2 traffic of the kernel family against the traffic model (notebook 09).

One measurement, ``traffic_measured``: naive, v1, v2, v2_kt and v2_padded profiled at two sizes, one
whose working set is many times the L2 cache and one that fits in it. Each row holds the problem,
the launch options, the model's numbers for that exact problem (request count, compulsory bytes),
and the ncu counters of each kernel (naive: its three kernels, also summed).

All configurations of the v1/v2 family go through one ncu run and naive's through a second (a run
starts Python, torch and Triton once, and ncu_profile splits its rows evenly per configuration, so
variants with different kernel counts cannot share a run).
"""

from __future__ import annotations

import time

from flashattn.kernels import launch_tiles, registry
from flashattn.measure.bank_counters import SHARED_METRICS
from flashattn.measure.hardware import device_properties
from flashattn.measure.profile import (
    TRAFFIC_METRICS,
    WARP_METRICS,
    NcuUnavailable,
    find_ncu,
    kernel_regex,
    ncu_profile,
    ncu_shell_command,
    ncu_version,
    sum_launches,
    target_config,
)
from flashattn.measure.traffic_counters import measured_bytes
from flashattn.models import traffic
from flashattn.record import measurement

DTYPE = "float16"
DTYPE_BYTES = {"float16": 2, "bfloat16": 2, "float32": 4}
FAMILY = ("v1", "v2", "v2_kt", "v2_padded")  # profiled with naive; v2_kt_view requests what v2 requests
# large: Q, K, V, O are 64 MiB each (working set ≫ the H200's 60 MB L2); naive's S and P grow as N², so
# it runs fewer heads (S is B·H·N²·4 bytes: 512 MiB here). small: everything fits in L2.
SIZES = {
    "large": {"B": 4, "H": 16, "N": 8192, "D": 64, "naive": {"B": 1, "H": 2}},
    "small": {"B": 1, "H": 4, "N": 1024, "D": 64, "naive": {"B": 1, "H": 4}},
}
ALL_METRICS = TRAFFIC_METRICS + SHARED_METRICS + WARP_METRICS
BUDGET_S = 140  # stop starting new ncu runs after this many seconds (a cap on the measurement's run time)


def configs(sizes: dict = SIZES, dtype: str = DTYPE) -> list[dict]:
    """Every configuration: ``{"size", **target_config(...)}`` (naive at its own B and H)."""
    out = []
    for size, s in sizes.items():
        for variant in ("naive",) + FAMILY:
            bh = s["naive"] if variant == "naive" else s
            cfg = target_config(variant, B=bh["B"], H=bh["H"], N=s["N"], D=s["D"], dtype=dtype,
                                options=launch_tiles(variant, dtype, s["D"]))
            out.append({"size": size, **cfg})
    return out


def working_set_bytes(variant: str, *, B, H, N, D, dtype_bytes) -> int:
    """Bytes of every tensor the kernel(s) touch: Q, K, V, O (+ l, m for v1; + S, P for naive; + Kᵀ for v2_kt)."""
    x = B * H * N * D * dtype_bytes
    extra = {"v1": 2 * B * H * N * traffic.STAT_BYTES,
             "naive": B * H * N * N * (traffic.STAT_BYTES + dtype_bytes),
             "v2_kt": x}.get(traffic.formula(variant), 0)
    return 4 * x + extra


def model_numbers(cfg: dict) -> dict:
    """The model's numbers for one configuration, at the block sizes it runs with."""
    dtype_bytes = DTYPE_BYTES[cfg["dtype"]]
    shape = {k: cfg[k] for k in ("B", "H", "N", "D")}
    problem = dict(shape, dtype_bytes=dtype_bytes, block_m=cfg["options"]["block_m"],
                   block_n=cfg["options"]["block_n"], causal=cfg["causal"])
    out = {
        "dtype_bytes": dtype_bytes,
        "model": traffic.hbm_bytes(cfg["variant"], **problem),
        "model_kernels": traffic.kernel_hbm_bytes(cfg["variant"], **problem),
        "compulsory": traffic.compulsory_bytes(cfg["variant"], **shape, dtype_bytes=dtype_bytes),
        "working_set_bytes": working_set_bytes(cfg["variant"], **shape, dtype_bytes=dtype_bytes),
    }
    if traffic.formula(cfg["variant"]) == "naive":
        out["model_per_kernel"] = traffic.naive_kernel_bytes(**problem)
    return out


def _identity(cfg: dict) -> dict:
    return {"size": cfg["size"], "variant": cfg["variant"], "dtype": cfg["dtype"],
            **{k: cfg[k] for k in ("B", "H", "N", "D", "causal")}, **cfg["options"]}


def error_row(cfg: dict, error) -> dict:
    text = error if isinstance(error, str) else f"{type(error).__name__}: {error}"
    return {**_identity(cfg), "error": text[-600:]}


def build_row(cfg: dict, launches: list[dict]) -> dict:
    """A measured row from the profiled launches of one configuration (one per kernel of the variant)."""
    expected = registry.kernel_names(cfg["variant"])
    got = [launch.get("kernel") or "" for launch in launches]
    if len(got) != len(expected) or not all(e in g for e, g in zip(expected, got, strict=False)):
        return error_row(cfg, f"expected kernels {list(expected)}, ncu reported {got}")
    metrics = sum_launches(launches)
    return {
        **_identity(cfg), **model_numbers(cfg),
        "kernels": [{"kernel": name, "grid": launch.get("grid"), "block": launch.get("block"),
                     "metrics": launch["metrics"], "units": launch.get("units", {}),
                     "measured": measured_bytes(launch["metrics"])}
                    for name, launch in zip(expected, launches, strict=True)],
        "metrics": metrics,
        "measured": measured_bytes(metrics),
    }


def _precheck(cfg: dict) -> str | None:
    """Run the configuration once in this process: compile errors and lack of memory show up here
    (and the compiled kernels land in Triton's cache, so the ncu child starts faster)."""
    import torch

    from flashattn import runtime

    try:
        q, k, v = runtime.random_qkv(cfg["B"], cfg["H"], cfg["N"], cfg["D"], dtype=getattr(torch, cfg["dtype"]),
                                     device="cuda")
        out = registry.get(cfg["variant"]).fn(q, k, v, causal=cfg["causal"], **cfg["options"])
        torch.cuda.synchronize()
        if not torch.isfinite(out).all():
            return "the output has non-finite values"
        return None
    except Exception as err:  # noqa: BLE001 - any failure becomes an error row
        return f"{type(err).__name__}: {err}"
    finally:
        q = k = v = out = None  # noqa: F841 - release before the ncu child needs the memory
        torch.cuda.empty_cache()


def _timeout(t0: float) -> int:
    return int(max(30, BUDGET_S + 100 - (time.perf_counter() - t0)))


def _profile_group(group: list[dict], t0: float) -> tuple[list[dict], str | None]:
    """Profile a group of configurations in one ncu run; returns rows and the metric set note."""
    regex = kernel_regex([c["variant"] for c in group])
    targets = [{k: v for k, v in c.items() if k != "size"} for c in group]
    note = None
    try:
        profiled = ncu_profile(targets, ALL_METRICS, kernel_regex=regex, timeout=_timeout(t0))
    except NcuUnavailable as err:
        if "metric" not in str(err).lower() or time.perf_counter() - t0 > BUDGET_S:
            return [error_row(c, err) for c in group], None
        print(f"[traffic] ncu refused a metric ({str(err)[-200:]}); retrying with the traffic metrics only",
              flush=True)
        note = "warp and shared-memory metrics refused by this ncu; traffic metrics only"
        try:
            profiled = ncu_profile(targets, TRAFFIC_METRICS, kernel_regex=regex, timeout=_timeout(t0))
        except Exception as err2:  # noqa: BLE001
            return [error_row(c, err2) for c in group], note
    except Exception as err:  # noqa: BLE001 - e.g. a timeout
        return [error_row(c, err) for c in group], None
    return [build_row(c, launches) for c, launches in zip(group, profiled, strict=True)], note


@measurement("traffic_measured",
             description="Nsight Compute DRAM and L2 bytes of naive, v1, v2, v2_kt, v2_padded against the model")
def traffic_measured() -> dict:
    t0 = time.perf_counter()
    result = {"metrics": ALL_METRICS, "sizes": SIZES, "dtype": DTYPE, "ncu_version": ncu_version(),
              "l2_cache_bytes": device_properties()["l2_cache_bytes"],
              "notes": "ncu --clock-control none (default --cache-control all: caches flushed before each kernel); "
                       "second launch of each configuration; L2 requests = lts__t_sectors_srcunit_tex_op_* × 32 B"}
    cfgs = configs()
    if find_ncu() is None:
        result.update(rows=[error_row(c, "Nsight Compute (ncu) is not installed") for c in cfgs],
                      error="ncu not found")
        return result
    rows_by_index: dict[int, dict] = {}
    runnable = []
    for i, cfg in enumerate(cfgs):
        err = _precheck(cfg)
        print(f"[traffic] precheck {cfg['size']:<5} {cfg['variant']:<9} "
              f"B={cfg['B']} H={cfg['H']} N={cfg['N']}: {err or 'ok'} ({time.perf_counter() - t0:.0f} s)", flush=True)
        if err:
            rows_by_index[i] = error_row(cfg, err)
        else:
            runnable.append(i)
    notes = []
    for is_naive in (False, True):
        group_idx = [i for i in runnable if (cfgs[i]["variant"] == "naive") == is_naive]
        if not group_idx:
            continue
        if time.perf_counter() - t0 > BUDGET_S:
            for i in group_idx:
                rows_by_index[i] = error_row(cfgs[i], "skipped: the time budget was spent")
            continue
        rows, note = _profile_group([cfgs[i] for i in group_idx], t0)
        notes += [note] if note else []
        rows_by_index.update(zip(group_idx, rows, strict=True))
        print(f"[traffic] ncu {'naive' if is_naive else 'v1/v2 family'}: {len(rows)} configurations, "
              f"{sum('error' in r for r in rows)} errors ({time.perf_counter() - t0:.0f} s)", flush=True)
    result["rows"] = [rows_by_index[i] for i in range(len(cfgs))]
    if notes:
        result["metric_note"] = "; ".join(notes)
    example = [c for c in cfgs if c["variant"] == "v2" and c["size"] == "small"][0]
    result["example_command"] = ncu_shell_command({k: v for k, v in example.items() if k != "size"})
    result["elapsed_s"] = round(time.perf_counter() - t0, 1)
    return result
