"""The kernels of a backward pass, as Nsight Compute sees them launched (notebook 12, section 6).

For SDPA's backward (cuDNN on the H200) and the fast backward (its default, on Hopper the Gluon kernel, and
its Triton kernels), on the same problem: each kernel's grid,
threads per block, registers per thread, shared memory per block, duration, and how busy the tensor cores
were. ncu runs this module as its target::

    ncu --kernel-name regex:'bprop|bwd|dot_do_o|convert_dq' ... python -m flashattn.measure.backward_kernels '[CFG]'

where CFG is the JSON of :func:`target_config`. The target calls the backward twice (the first call compiles
and plans); :func:`profile_backward` keeps the second call's launches.
"""

from __future__ import annotations

import json
import sys

import torch

from flashattn import runtime
from flashattn.kernels.fast import attention_fast
from flashattn.kernels.fast_backward import attention_backward_fast

from .profile import ncu_profile

METRICS = [
    "launch__grid_size",
    "launch__block_size",
    "launch__registers_per_thread",
    "launch__shared_mem_per_block_dynamic",
    "launch__shared_mem_per_block_static",
    "gpu__time_duration.sum",
    "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active",
]
# backward kernels only: cuDNN's (…flash_bprop…, compute_dot_do_o, convert_dq_to_16bits), FlashAttention-2's
# (flash_bwd_…) and ours (bwd_preprocess_fast, bwd_kernel_gluon, bwd_dq_finish; bwd_dkdv_fast, bwd_dq_fast); the
# forward kernels do not match
KERNEL_REGEX = "bprop|bwd|dot_do_o|convert_dq"
BACKWARDS = ("sdpa", "fast", "fast_triton")


def target_config(backward: str, *, B: int, H: int, N: int, D: int, dtype: str = "float16", causal: bool = False,
                  tiles: dict | None = None) -> dict:
    """One problem for the target: ``backward`` "sdpa", "fast" (the default) or "fast_triton" (its Triton
    kernels); ``tiles``: fast_triton's fixed ``dkdv_tiles`` and ``dq_tiles`` (so that no autotuning launches
    get profiled)."""
    if backward not in BACKWARDS:
        raise ValueError(f"backward must be one of {', '.join(BACKWARDS)}, got {backward!r}")
    if dtype not in ("float16", "bfloat16", "float32"):
        raise ValueError(f"dtype must be 'float16', 'bfloat16' or 'float32', got {dtype!r}")
    tiles = dict(tiles or {})
    if set(tiles) - {"dkdv_tiles", "dq_tiles"}:
        raise ValueError(f"tiles takes dkdv_tiles and dq_tiles, got {sorted(tiles)}")
    if tiles and backward != "fast_triton":
        raise ValueError(f"tiles are for backward='fast_triton' (the Triton kernels), not {backward!r}")
    return {"backward": backward, "dtype": dtype, "B": int(B), "H": int(H), "N": int(N), "D": int(D),
            "causal": bool(causal), "tiles": {name: list(t) for name, t in tiles.items()}}


def run_target(cfg: dict, calls: int = 2):
    """Run ``cfg``'s backward ``calls`` times (what ncu profiles); returns the last call's dq, dk, dv."""
    dtype = getattr(torch, cfg["dtype"])
    q, k, v = runtime.random_qkv(cfg["B"], cfg["H"], cfg["N"], cfg["D"], dtype=dtype, seed_value=1)
    do = runtime.random_qkv(cfg["B"], cfg["H"], cfg["N"], cfg["D"], dtype=dtype, seed_value=2)[0]
    if cfg["backward"] == "sdpa":
        leaves = tuple(t.clone().requires_grad_() for t in (q, k, v))
        out = torch.nn.functional.scaled_dot_product_attention(*leaves, is_causal=cfg["causal"])

        def step():
            return torch.autograd.grad(out, leaves, do, retain_graph=True)
    else:
        o, lse = attention_fast(q, k, v, causal=cfg["causal"], return_lse=True)
        options = {name: tuple(t) for name, t in cfg["tiles"].items()}
        if cfg["backward"] == "fast_triton":
            options["gluon"] = False

        def step():
            return attention_backward_fast(q, k, v, o, lse, do, causal=cfg["causal"], **options)
    for _ in range(calls):
        grads = step()
    if q.is_cuda:
        torch.cuda.synchronize()
    return grads


def profile_backward(cfg: dict, timeout: int = 300) -> list[dict]:
    """ncu's :data:`METRICS` (and its launch facts) for each kernel of ``cfg``'s backward, one call after a
    first one (:func:`flashattn.measure.profile.ncu_profile`, with this module as the target)."""
    (launches,) = ncu_profile([cfg], METRICS, kernel_regex=KERNEL_REGEX, timeout=timeout,
                              module="flashattn.measure.backward_kernels")
    return launches


def kernel_summary(kernel: dict) -> dict:
    """One launch's numbers under short names: grid, threads, registers, shared_kib, ms, tensor_busy_pct."""
    m = kernel["metrics"]
    shared = (m.get("launch__shared_mem_per_block_dynamic") or 0) + (m.get("launch__shared_mem_per_block_static") or 0)
    return {"grid": m.get("launch__grid_size"), "threads": m.get("launch__block_size"),
            "registers": m.get("launch__registers_per_thread"), "shared_kib": shared / 1024,
            "ms": (m.get("gpu__time_duration.sum") or 0) / 1e6,
            "tensor_busy_pct": m.get("sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active")}


if __name__ == "__main__":  # the target ncu runs: a JSON list of target_config dicts
    for cfg in json.loads(sys.argv[1]):
        run_target(cfg)
