"""``triton.autotune`` over v2's kernel (notebook 08): the configurations, the pruning, the launch, the timings.

The rules (spaces, the shared-memory estimate, pruning) are plain functions in ``flashattn.tuning``;
this module hands them to Triton's autotuner and launches ``attn_kernel_v2`` the way ``attention_v2``
does, with the tiles the tuner picks.
"""

from __future__ import annotations

import math

import torch

from flashattn.measure import recorded
from flashattn.models.tuning import config_dict, prune_configs, sweep_configs


def triton_configs(space_or_list) -> list:
    """``triton.Config`` objects for a space dict or a list of config dicts."""
    import triton

    cfgs = sweep_configs(space_or_list) if isinstance(space_or_list, dict) else list(space_or_list)
    return [triton.Config({"BLOCK_M": c["block_m"], "BLOCK_N": c["block_n"]}, num_warps=c["num_warps"],
                          num_stages=c["num_stages"]) for c in cfgs]


def shared_limit() -> int:
    """Shared memory one program may use: this GPU's opt-in limit, or the recorded GPU's without one."""
    if torch.cuda.is_available():
        return torch.cuda.get_device_properties(0).shared_memory_per_block_optin
    return recorded.get("device")["properties"]["shared_memory_per_block_optin_bytes"]


def _early_prune(configs, named_args, **kwargs):
    d_pad = kwargs.get("D_PAD", named_args.get("D_PAD"))
    elem_bytes = named_args["Q"].element_size()
    return prune_configs(configs, d_pad=d_pad, elem_bytes=elem_bytes, shared_limit=shared_limit())


def autotuned_v2(configs: list, *, bench_warmup: int = 5, bench_rep: int = 20):
    """``triton.autotune`` applied to ``attn_kernel_v2``: it times every configuration (pruned by the
    shared-memory estimate) the first time it meets a new (N, D, dtype, causal, precision) and keeps the
    fastest. ``configs``: a list of ``triton.Config`` (see ``triton_configs``)."""
    import triton

    from flashattn.kernels.v2 import attn_kernel_v2

    def bench(kernel_call, quantiles):
        return triton.testing.do_bench(kernel_call, warmup=bench_warmup, rep=bench_rep, quantiles=quantiles)

    key = ["N", "D", "CAUSAL", "PRECISION"]
    prune = {"early_config_prune": _early_prune}
    try:
        return triton.autotune(configs, key=key, prune_configs_by=prune, do_bench=bench)(attn_kernel_v2)
    except TypeError:  # an older Triton without do_bench=
        return triton.autotune(configs, key=key, prune_configs_by=prune, warmup=bench_warmup,
                               rep=bench_rep)(attn_kernel_v2)


def run_autotuned_v2(tuned, q, k, v, *, causal=False, scale=None, input_precision="ieee",
                     deferred_norm=True, use_exp2=False):
    """Launch an ``autotuned_v2`` kernel the way ``attention_v2`` launches ``attn_kernel_v2``; the block
    sizes, warps and stages come from the tuner (``tuned.best_config`` after the call)."""
    import triton

    from flashattn.validate import check_kernel_inputs

    B, H, N, D, scale = check_kernel_inputs(q, k, v, variant="v2", causal=causal, scale=scale)
    o = torch.empty(q.shape, dtype=q.dtype, device=q.device)

    def grid(meta):
        return (triton.cdiv(N, meta["BLOCK_M"]), B * H)

    tuned[grid](
        q, k, v, o, *q.stride(), *k.stride(), *v.stride(), *o.stride(), H, N, scale,
        D=D, D_PAD=D, CAUSAL=causal, PRECISION=input_precision, K_TRANSPOSED=False,
        DEFERRED_NORM=deferred_norm, USE_EXP2=use_exp2,
    )
    return o


def timings_table(tuned) -> list[dict]:
    """What the tuner measured: one row per configuration tried (median ms, inf where it failed)."""
    out = []
    for config, timing in getattr(tuned, "configs_timings", {}).items():
        ms = timing[0] if isinstance(timing, (list, tuple)) else timing
        out.append({**config_dict(config), "ms": None if not math.isfinite(ms) else float(ms)})
    return sorted(out, key=lambda r: (r["ms"] is None, r["ms"] or 0.0))


# --- the same configuration, timed in different recorded runs ---------------------------------------------

_TILE_KEYS = ("block_m", "block_n", "num_warps", "num_stages")


def _same(a: dict, b: dict) -> bool:
    return all(a.get(k) == b.get(k) for k in _TILE_KEYS)


def recorded_timings(config: dict, D: int, path: str = "fp16_tc") -> list[dict]:
    """Every recorded timing of v2 (``tl.trans``, ``exp``, deferred normalization) at ``config`` on the
    problem of ``path`` at head dimension ``D``, one per measurement that ran it: separate runs, minutes
    apart. ``[{"measurement", "what", "ms", "tflops"}]``; a measurement that is not recorded is skipped."""
    from flashattn.bench import tflops
    from flashattn.models.tuning import PATHS

    p = PATHS[path]
    problem = (p["B"], p["H"], p["N"])
    out = []

    def add(name, what, ms):
        if ms:
            out.append({"measurement": name, "what": what, "ms": ms, "tflops": tflops(*problem, D, ms)})

    sweep_name = f"block_sweep_{path.split('_')[0]}_d{D}"
    sweep = recorded.find(sweep_name)
    for row in (sweep or {}).get("rows", []):
        if _same(row, config) and "ms" in row and (row["B"], row["H"], row["N"]) == problem:
            add(sweep_name, "the sweep", row["ms"])
    at = recorded.find(f"autotune_v2_d{D}") if path == "fp16_tc" else None
    if at and "error" not in at and (at["B"], at["H"], at["N"]) == problem:
        for t in at.get("timings", []):
            if _same(t, config):
                add(f"autotune_v2_d{D}", "the autotuner's own timing, while tuning", t["ms"])
        if _same(at["best"], config):
            add(f"autotune_v2_d{D}", "the tuned kernel, timed after tuning", at["ms"])
        if _same(at["default"], config):
            add(f"autotune_v2_d{D}", "v2's default, timed after tuning", at["default_ms"])
    facts = recorded.find("compiled_facts")
    for row in (facts or {}).get("rows", []):
        if (row.get("variant"), row.get("path"), row.get("D")) == ("v2", path, D) and _same(row, config) \
                and "ms" in row and (row["B"], row["H"], row["N"]) == problem:
            add("compiled_facts", "compiled facts (v2 at its defaults)", row["ms"])
    norm = recorded.find("normalization_exp2")
    for row in (norm or {}).get("rows", []):
        if (row.get("path"), row.get("D"), row.get("deferred_norm"), row.get("use_exp2")) == (path, D, True, False) \
                and _same(row, config) and "ms" in row and (row["B"], row["H"], row["N"]) == problem:
            add("normalization_exp2", "the exp/exp2 ablation (deferred, exp)", row["ms"])
    return out
