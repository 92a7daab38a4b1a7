"""Where the drop-in's training step spends its host time (issue 28, point 4), on the GPU.

    python tools/gpu/operator/host_probe.py      # about a minute on an H200; $OUT/host_probe.json

B 16, H 16, N 1024, D 64, causal, fp16 and bf16. For each: host time per call (``host.host_us``) and do_bench's
median of the kernels called directly, of the drop-in's training step (``torch.autograd.grad``), of an identity
``autograd.Function`` on the same tensors (what the autograd engine and its CUDA worker thread cost alone) and of
SDPA's step; the time spent inside the backward, which the autograd engine runs on its own thread (a cProfile
of the main thread sees only ``run_backward``), with cProfile's top functions there; torch.profiler's CPU-side
operators and runtime calls (``cudaMalloc``, synchronizations) for a few steps of each.
"""

from __future__ import annotations

import cProfile
import io
import json
import os
import pstats
import sys
import threading
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
sys.path.insert(0, ROOT)

import torch  # noqa: E402

from flashattn import bench, ops, runtime  # noqa: E402
from flashattn.functional import scaled_dot_product_attention  # noqa: E402
from flashattn.kernels.fast import attention_fast  # noqa: E402
from flashattn.kernels.fast_backward import attention_backward_fast  # noqa: E402
from flashattn.measure.measurements.host import host_us  # noqa: E402


class Identity(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        return g


def inside_backward(steps: int, fn) -> dict:
    """Wall time per step inside ``_Eager.backward`` (on the engine's thread) and cProfile's top functions."""
    original = ops._Eager.backward
    spent, profile = [], cProfile.Profile()

    def timed(ctx, *grads):  # (original is once_differentiable's wrapper: it takes ctx and the gradients)
        t0 = time.perf_counter()
        profile.enable()
        try:
            return original(ctx, *grads)
        finally:
            profile.disable()
            spent.append(time.perf_counter() - t0)

    ops._Eager.backward = staticmethod(timed)
    try:
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(steps):
            fn()
        total = time.perf_counter() - t0
        torch.cuda.synchronize()
    finally:
        ops._Eager.backward = staticmethod(original)
    text = io.StringIO()
    pstats.Stats(profile, stream=text).sort_stats("tottime").print_stats(30)
    return {"step_us": total / steps * 1e6, "inside_backward_us": sum(spent) / steps * 1e6,
            "cprofile_profiled_us_note": "inside_backward is under cProfile (slower than bare)",
            "cprofile": text.getvalue()[-6000:]}


def profiler_table(fn, steps=10) -> str:
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            fn()
        torch.cuda.synchronize()
    return prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=30)


def main() -> None:
    out = os.environ.get("OUT", ".")
    result = {"threads": [t.name for t in threading.enumerate()], "switch_interval": sys.getswitchinterval()}
    result["decode"] = decode_rows()
    print(json.dumps(result["decode"], indent=1), flush=True)
    for dtype in (torch.float16, torch.bfloat16):
        result[str(dtype)] = one_dtype(dtype)
    with open(os.path.join(out, "host_probe.json"), "w") as f:
        json.dump(result, f, indent=1)


def decode_rows() -> list:
    """attention_with_kvcache against SDPA on short caches: host time, do_bench, and the GPU's own time (graph)."""
    from triton.testing import do_bench_cudagraph

    from flashattn.kernels.decode import attention_with_kvcache, make_plan

    rows = []
    for B, Hq, Hkv, S in ((1, 32, 8, 4096), (1, 32, 8, 32768), (1, 32, 32, 4096), (4, 32, 8, 4096),
                          (16, 32, 32, 4096)):
        D = 128
        q = torch.randn(B, 1, Hq, D, device="cuda", dtype=torch.float16)
        k = torch.randn(B, S, Hkv, D, device="cuda", dtype=torch.float16)
        v = torch.randn_like(k)
        seqlens = torch.full((B,), S, dtype=torch.int32, device="cuda")
        qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        fns = {"flashattn": lambda q=q, k=k, v=v, s=seqlens: attention_with_kvcache(q, k, v, s),
               "sdpa": lambda qt=qt, kt=kt, vt=vt, g=Hq != Hkv: torch.nn.functional.scaled_dot_product_attention(
                   qt, kt, vt, enable_gqa=g)}
        row = {"B": B, "Hq": Hq, "Hkv": Hkv, "S": S,
               "splits": make_plan(B, 1, Hq, Hkv, D, S, torch.float16, 0, q.device).num_splits}
        for name, fn in fns.items():
            fn()
            row[name] = {"host_us": host_us(fn), "do_bench_us": bench.time_ms(fn) * 1e3,
                         "graph_us": do_bench_cudagraph(fn, rep=40, return_mode="median") * 1e3}
        rows.append(row)
    return rows


def one_dtype(dtype) -> dict:
    B, H, N, D = 16, 16, 1024, 64
    q, k, v = runtime.random_qkv(B, H, N, D, dtype=dtype, seed_value=1)
    do = runtime.random_qkv(B, H, N, D, dtype=dtype, seed_value=2)[0]
    leaves = tuple(t.detach().clone().requires_grad_() for t in (q, k, v))
    sleaves = tuple(t.detach().clone().requires_grad_() for t in (q, k, v))
    o, lse = attention_fast(q, k, v, causal=True, return_lse=True)
    fns = {
        "forward direct": lambda: attention_fast(q, k, v, causal=True, return_lse=True),
        "backward direct": lambda: attention_backward_fast(q, k, v, o, lse, do, causal=True),
        "fwd+bwd direct": lambda: attention_backward_fast(
            q, k, v, *attention_fast(q, k, v, causal=True, return_lse=True), do, causal=True),
        "drop-in step": lambda: torch.autograd.grad(
            scaled_dot_product_attention(*leaves, is_causal=True), leaves, do),
        "_FastForward step": lambda: torch.autograd.grad(
            ops._FastForward.apply(*leaves, True, None, "")[0], leaves, do),
        "drop-in forward only": lambda: scaled_dot_product_attention(*leaves, is_causal=True),
        "identity step": lambda: torch.autograd.grad(Identity.apply(leaves[0]), leaves[0], do),
        "SDPA step": lambda: torch.autograd.grad(torch.nn.functional.scaled_dot_product_attention(
            *sleaves, is_causal=True), sleaves, do),
        "SDPA forward only": lambda: torch.nn.functional.scaled_dot_product_attention(*sleaves, is_causal=True),
    }
    for fn in fns.values():
        fn()
    torch.cuda.synchronize()
    row = {"host_us": {name: host_us(fn) for name, fn in fns.items()}}
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    row["host_us_switch_1us"] = {name: host_us(fns[name]) for name in ("drop-in step", "identity step",
                                                                         "SDPA step")}
    sys.setswitchinterval(old)
    times = bench.time_rounds(fns, 3)
    row["ms"] = {name: sorted(t)[1] for name, t in times.items()}
    row["inside"] = inside_backward(50, fns["drop-in step"])
    row["profiler_dropin"] = profiler_table(fns["drop-in step"])
    row["profiler_sdpa"] = profiler_table(fns["SDPA step"])
    print(dtype, json.dumps({k: row[k] for k in ("host_us", "host_us_switch_1us", "ms")}, indent=1), flush=True)
    print(" inside:", row["inside"]["step_us"], row["inside"]["inside_backward_us"], flush=True)
    print(row["inside"]["cprofile"][:4000], flush=True)
    print(row["profiler_dropin"], flush=True)
    print(row["profiler_sdpa"][:3000], flush=True)
    return row


if __name__ == "__main__":
    main()
