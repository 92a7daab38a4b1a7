"""Does atomic dQ (five products, as cuDNN and FlashAttention-2/3) beat the two-kernel fast backward (seven)?

    python tools/gpu/backward/atomic_probe.py     # about 4.5 minutes on an H200; $OUT/bwd_exp.json, a table last

fp16 and bf16, D 64 and 128, causal and not, N 4096 and 16384 (B·N = 16384, H = 16; PROBE_DTYPES, PROBE_D and
PROBE_N choose): SDPA's backward (cuDNN),
the fast backward's Triton kernels as they run by default (gluon=False: dq_mode "kernel", autotuned), and
dq_mode "atomic" with the dK/dV tiles of ``ATOMIC``: 4-warp programs of 64 keys (two per SM) against 8-warp
programs of 128 keys (one per SM, half as many additions into dQ); every variant checked against float64
autograd on two heads, then timed in three interleaved rounds; a torch.profiler table of kernel times for one
problem per head dimension. The summary gives each variant's speed as a ratio to SDPA's backward (SDPA time /
variant time).
"""
import json
import os
import statistics
import sys
import time
import traceback

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "..")))
import torch  # noqa: E402

from flashattn import bench, runtime  # noqa: E402
from flashattn.kernels import fast_backward as fb  # noqa: E402
from flashattn.kernels.fast import attention_fast  # noqa: E402
from flashattn.measure.measurements.backward import BACKWARD_FACTOR, _grads_float64  # noqa: E402
from flashattn.models.roofline import attention_flops  # noqa: E402
from flashattn.reference import rel_error  # noqa: E402

OUT = os.environ.get("OUT", "/tmp/atomic_probe")
T0 = time.time()
BUDGET_S = int(os.environ.get("PROBE_BUDGET_S", 360))  # no new problem starts past this (a device call is cut at 600 s)
# dK/dV tiles (block_m, block_n, warps, stages) of dq_mode="atomic": 4-warp programs of 64 keys (two per SM)
# against 8-warp programs of 128 keys (one per SM, half the dQ additions; no spills for sm_90 at D = 64, a few
# dozen bytes at D = 128)
ATOMIC = {64: [(64, 64, 4, 3), (64, 128, 8, 3), (64, 128, 8, 2), (32, 128, 8, 3), (32, 128, 8, 2)],
          128: [(32, 64, 4, 3), (32, 128, 8, 3), (32, 128, 8, 2)]}
# which problems: PROBE_D="64 128", PROBE_N="4096 16384" (the defaults)
HEAD_DIMS = [int(x) for x in os.environ.get("PROBE_D", "64 128").split()]
LENGTHS = [int(x) for x in os.environ.get("PROBE_N", "4096 16384").split()]
DTYPES = [getattr(torch, x) for x in os.environ.get("PROBE_DTYPES", "float16 bfloat16").split()]


def log(*args):
    print(f"[{time.time() - T0:6.1f}s]", *args, flush=True)


def variants(q, k, v, o, lse, do, causal, D):
    """Functions of no arguments, each returning (dq, dk, dv)."""
    leaves = tuple(t.detach().clone().requires_grad_() for t in (q, k, v))
    graph = torch.nn.functional.scaled_dot_product_attention(*leaves, is_causal=causal)
    fns = {"sdpa": lambda: torch.autograd.grad(graph, leaves, do, retain_graph=True),
           "kernel (tuned)": lambda: fb.attention_backward_fast(q, k, v, o, lse, do, causal=causal, gluon=False)}
    for tiles in ATOMIC[D]:
        fns[f"atomic {tiles}"] = lambda t=tiles: fb.attention_backward_fast(q, k, v, o, lse, do, causal=causal,
                                                                            dq_mode="atomic", dkdv_tiles=t)
    return fns


def check_and_time(fns, q, k, v, do, causal, rounds=3):
    """Check each of ``fns`` (each returning dq, dk, dv) against float64 autograd on two heads, dropping the
    ones that fail, then time the rest in interleaved rounds: (errors, times per round, median ms)."""
    heads = (slice(0, 1), slice(0, 2))
    ref = _grads_float64(q[heads], k[heads], v[heads], do[heads], causal)
    errors = {}
    for name, fn in list(fns.items()):
        try:
            errors[name] = [rel_error(g[heads], r) for g, r in zip(fn(), ref, strict=True)]
            if q.is_cuda:
                torch.cuda.synchronize()
        except Exception as err:  # noqa: BLE001 - one failure must not stop the others
            errors[name] = f"{type(err).__name__}: {str(err)[:300]}"
            fns.pop(name)
    times = bench.time_rounds(fns, rounds)
    return errors, times, {name: statistics.median(t) for name, t in times.items()}


def inputs(dtype, D, causal, N):
    """One probe problem (B·N = 16384, H = 16): B, q, k, v, do and the fast forward's o and log-sum-exp."""
    B, H = 16384 // N, 16
    q, k, v = runtime.random_qkv(B, H, N, D, dtype=dtype, seed_value=N + D)
    do = runtime.random_qkv(B, H, N, D, dtype=dtype, seed_value=N + D + 1)[0]
    o, lse = attention_fast(q, k, v, causal=causal, return_lse=True)
    return B, q, k, v, do, o, lse


def problem(dtype, D, causal, N):
    B, q, k, v, do, o, lse = inputs(dtype, D, causal, N)
    fns = variants(q, k, v, o, lse, do, causal, D)
    errors, times, ms = check_and_time(fns, q, k, v, do, causal)
    flops = attention_flops(B, q.shape[1], N, D, causal) * BACKWARD_FACTOR
    row = dict(dtype=str(dtype).replace("torch.", ""), D=D, causal=causal, N=N, B=B, ms=ms, rounds=times,
               err=errors, tflops={name: flops / t / 1e9 for name, t in ms.items()},
               ratio={name: ms["sdpa"] / t for name, t in ms.items()},
               tuned=dict(dkdv=fb.picked_tiles("dkdv", D=D, dtype=dtype, L=N, causal=causal),
                          dq=fb.picked_tiles("dq", D=D, dtype=dtype, L=N, causal=causal)))
    if dtype == torch.float16 and N == 16384 and not causal:
        atomic = [n for n in ms if n.startswith("atomic")]
        best = max(atomic, key=lambda n: row["ratio"][n], default=None)
        row["profile"] = kernel_times(fns, ["kernel (tuned)", best])
    return row


def kernel_times(fns, names):
    """CUDA time per call of each kernel (torch.profiler, five calls) for the variants ``names``."""
    from torch.profiler import ProfilerActivity, profile

    out = {}
    for name in names:
        if name not in fns:
            continue
        fns[name]()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(5):
                fns[name]()
            torch.cuda.synchronize()
        out[name] = {e.key[:60]: round(e.self_device_time_total / 5 / 1e3, 4)
                     for e in prof.key_averages() if e.self_device_time_total > 0}
    return out


def run_problems(problem, out_path):
    """``problem(dtype, D, causal, N) -> row`` for every problem (PROBE_DTYPES, PROBE_D, PROBE_N, causal and not)
    while PROBE_BUDGET_S lasts (none starts past it); each row's largest errors logged, and every row so far
    rewritten to ``out_path`` after each problem."""
    os.makedirs(os.path.dirname(out_path), exist_ok=True)
    rows = []
    for dtype in DTYPES:
        for D in HEAD_DIMS:
            for causal in (False, True):
                for N in LENGTHS:
                    if time.time() - T0 > BUDGET_S:
                        log("out of time, skipped", dtype, D, causal, N)
                        continue
                    try:
                        row = problem(dtype, D, causal, N)
                        rows.append(row)
                        worst = {n: round(max(e), 5) if isinstance(e, list) else e for n, e in row["err"].items()}
                        log(row["dtype"], D, "causal" if causal else "full", N, "| max rel errors", worst)
                    except Exception:  # noqa: BLE001 - one failure must not stop the others
                        log("FAILED", dtype, D, causal, N, traceback.format_exc()[-800:])
                    with open(out_path, "w") as f:
                        json.dump(rows, f, indent=1)
                    torch.cuda.empty_cache()
    return rows


def main():
    rows = run_problems(problem, os.path.join(OUT, "bwd_exp.json"))
    log("SUMMARY: speed as a ratio to SDPA's backward (SDPA ms / variant ms)")
    names = sorted({n for r in rows for n in r["ratio"] if n != "sdpa"})
    for r in rows:
        cells = " ".join(f"{n.replace('atomic ', 'a').replace('kernel ', 'k')}={r['ratio'][n]:.3f}"
                         for n in names if n in r["ratio"])
        log(r["dtype"][:4], r["D"], "C" if r["causal"] else "F", r["N"], cells)


if __name__ == "__main__":
    main()
