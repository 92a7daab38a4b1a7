"""Host time against GPU time (notebook 12): when does the CPU, not the GPU, set the pace of a short step?

A kernel launch returns at once; the CPU goes on to the next one while the GPU works. That hides the host's
own work (checks, option lookups, launches, the autograd engine) as long as it takes less time per call than
the GPU's kernels. Past that, the GPU waits for the host, and a timing measures the host. This measurement
puts the two side by side on short problems: each function's host time per call (the CPU time to issue 20
calls back to back, without waiting for the GPU, median over interleaved rounds: a host's speed drifts from
second to second, and interleaving lets every function meet the same drift, as the GPU timings do) and its
time as every other timing of the course measures it (do_bench's median, interleaved rounds).
"""

from __future__ import annotations

import statistics
import time

import torch

from flashattn import bench, runtime
from flashattn.functional import scaled_dot_product_attention
from flashattn.kernels.fast import attention_fast
from flashattn.kernels.fast_backward import attention_backward_fast
from flashattn.record import measurement

from .backward import _backward_fns

# the short cells where fast's forward+backward step fell behind SDPA's, and D = 128 at the same N
PROBLEMS = [("float16", 64, 1024, True), ("float16", 64, 1024, False), ("bfloat16", 64, 2048, True),
            ("float16", 128, 1024, True)]
CALLS, REPEATS = 20, 5
HOST_ROUNDS = 9


def host_us(fn) -> float:
    """Microseconds of host (CPU) time per call of ``fn``: ``CALLS`` calls issued back to back without waiting
    for the GPU (a launch queue holds about a thousand kernels), median of ``REPEATS``."""
    for _ in range(3):
        fn()
    times = []
    for _ in range(REPEATS):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(CALLS):
            fn()
        times.append((time.perf_counter() - t0) / CALLS * 1e6)
    torch.cuda.synchronize()
    return statistics.median(times)


def host_us_rounds(fns: dict, rounds: int = HOST_ROUNDS) -> dict[str, list[float]]:
    """Each function's host microseconds per call (``CALLS`` calls issued back to back without waiting for the
    GPU), once per round, the functions in alternating order (a, b, c, c, b, a, ...); the GPU is waited for
    between functions, so that none inherits another's queue."""
    for fn in fns.values():
        for _ in range(3):
            fn()
    times, order = {name: [] for name in fns}, list(fns)
    for _ in range(rounds):
        for name in order:
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(CALLS):
                fns[name]()
            times[name].append((time.perf_counter() - t0) / CALLS * 1e6)
        order.reverse()
    torch.cuda.synchronize()
    return times


def step_functions(q, k, v, do, causal) -> dict:
    """Functions of no arguments: fast's forward, its backward, the two called directly one after the other,
    a training step through the drop-in (autograd), and SDPA's training step."""
    backward, training = _backward_fns(q, k, v, do, causal)
    leaves = tuple(t.detach().clone().requires_grad_() for t in (q, k, v))
    return {
        "forward": lambda: attention_fast(q, k, v, causal=causal, return_lse=True),
        "drop-in forward": lambda: scaled_dot_product_attention(*leaves, is_causal=causal),
        "SDPA forward": lambda: torch.nn.functional.scaled_dot_product_attention(*leaves, is_causal=causal),
        "backward": backward["fast"],
        "forward+backward, direct": lambda: attention_backward_fast(
            q, k, v, *attention_fast(q, k, v, causal=causal, return_lse=True), do, causal=causal),
        "drop-in step": training["fast"],
        "SDPA step": training["sdpa"],
    }


@measurement("host_time", description="host (CPU) time per call against the timed step: fast forward, backward, "
                                      "the drop-in's training step, SDPA's; short problems")
def host_time() -> dict:
    rows = []
    for dtype_name, D, N, causal in PROBLEMS:
        dtype = getattr(torch, dtype_name)
        B, H = bench.BENCH_TOKENS // N, bench.BENCH_HEADS
        q, k, v = runtime.random_qkv(B, H, N, D, dtype=dtype, seed_value=N + D)
        do = runtime.random_qkv(B, H, N, D, dtype=dtype, seed_value=N + D + 1)[0]
        fns = step_functions(q, k, v, do, causal)
        host_rounds = host_us_rounds(fns)
        host = {name: statistics.median(t) for name, t in host_rounds.items()}
        times = bench.time_rounds(fns, bench.BENCH_ROUNDS)
        row = dict(dtype=dtype_name, D=D, N=N, B=B, H=H, causal=causal, host_us=host, host_us_rounds=host_rounds,
                   ms={name: statistics.median(t) for name, t in times.items()}, ms_rounds=times)
        rows.append(row)
        print(f"  {dtype_name} D={D} N={N} causal={causal}: " + ", ".join(
            f"{name} host {host[name]:.0f} us / timed {row['ms'][name]:.3f} ms" for name in fns), flush=True)
    return {"rows": rows, "calls": CALLS, "host_rounds": HOST_ROUNDS, "rounds": bench.BENCH_ROUNDS,
            "notes": "host_us: CPU time per call to issue CALLS calls back to back without waiting for the GPU, "
                     "median over host_rounds interleaved rounds (host_us_rounds: each round's); 'drop-in forward' "
                     "and 'SDPA forward': the forward of a training step (inputs that require gradients, grad "
                     "mode on), through flashattn.scaled_dot_product_attention and torch's; ms: do_bench's median "
                     "(the L2 flushed before each call), median over "
                     "interleaved rounds; 'drop-in step' is torch.autograd.grad through "
                     "flashattn.scaled_dot_product_attention, 'SDPA step' the same through torch's"}
