"""Where does a short training step through the drop-in lose time? (issue 18)

In the recorded ``fast_backward_vs_sdpa``, forward+backward through ``flashattn.scaled_dot_product_attention``
falls further below SDPA than fast's backward alone in a few short D = 64 cells: those steps take longer than
fast's backward plus its forward (``fast_vs_sdpa``), while the other cells, D = 128 at the same N included, add
up (notebook 12 prints the decomposition). This probe takes such a step apart, in one process, on the same inputs:

    python tools/gpu/backward/dropin_probe.py        # about 2 minutes on an H200; $OUT/dropin_probe.json

Per problem it times, in interleaved rounds (flashattn.bench.time_rounds, median of do_bench's medians), the step
functions of the recorded ``host_time``: ``forward`` (attention_fast with the log-sum-exp), ``backward``
(attention_backward_fast on that forward's O and log-sum-exp), ``forward+backward, direct`` (the two called one
after the other, no autograd), ``drop-in step`` (forward and backward through torch.autograd.grad, as the
recording times it) and ``SDPA step``, and the ``drop-in forward`` (no graph); it prints the tiles each path picked
(forward and both backward kernels), and a torch.profiler table of one drop-in step and one direct step (CUDA time
per kernel, and the CPU time around them).
In interpreter mode it runs the same code at a tiny size, to check the script itself.

What it found on the H200: in those cells the step's kernels take no longer than when called directly, and the
direct calls add up; the drop-in step is slower because the host takes longer to issue it than the GPU takes to
run it. The recorded measurement ``host_time`` (``flashattn/measure/measurements/host.py``) shows that side by
side, and notebook 12 prints it.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
sys.path.insert(0, ROOT)

import torch  # noqa: E402

from flashattn import bench, runtime  # noqa: E402
from flashattn.functional import scaled_dot_product_attention  # noqa: E402
from flashattn.kernels.fast import tuned_config  # noqa: E402
from flashattn.kernels.fast_backward import picked_tiles  # noqa: E402
from flashattn.measure.measurements import host  # noqa: E402

GPU = runtime.MODE == "gpu"
OUT = os.environ.get("OUT", ".")
# (dtype, D, N, causal): the cells that do not add up, and D = 128 at the same N as a control
PROBLEMS = [("bfloat16", 64, 1024, True), ("float16", 64, 1024, True), ("float16", 64, 1024, False),
            ("bfloat16", 64, 2048, True), ("float16", 128, 1024, True)]
TOKENS, HEADS, ROUNDS = (16384, 16, 5) if GPU else (64, 2, 1)


def step_functions(q, k, v, do, causal: bool) -> dict:
    """The recording's own step functions (measurements.host, as host_time times them), and the drop-in's forward."""
    return {**host.step_functions(q, k, v, do, causal),
            "drop-in forward": lambda: scaled_dot_product_attention(q, k, v, is_causal=causal)}


def wall_ms(fn) -> float:
    """Interpreter mode (checking the script only): one call's wall-clock time."""
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) * 1e3


def profile_table(fn, label: str) -> list[dict]:
    """One call of ``fn`` under torch.profiler: per event, CPU and CUDA time in microseconds."""
    activities = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if GPU else [])
    with torch.profiler.profile(activities=activities) as prof:
        fn()
        if GPU:
            torch.cuda.synchronize()
    rows = []
    for e in sorted(prof.key_averages(), key=lambda e: -(e.device_time_total if GPU else e.cpu_time_total))[:15]:
        rows.append({"name": e.key[:70], "calls": e.count, "cpu_us": round(e.cpu_time_total, 1),
                     "cuda_us": round(e.device_time_total, 1) if GPU else None})
    print(f"  profile of one {label}:")
    for r in rows:
        print(f"    {r['name']:<70} x{r['calls']:<3} cpu {r['cpu_us']:>9.1f} us  cuda {r['cuda_us']} us")
    return rows


def probe(dtype_name: str, D: int, N: int, causal: bool) -> dict:
    dtype = getattr(torch, dtype_name if GPU else "float32")
    B = max(1, TOKENS // N) if GPU else 1
    N = N if GPU else 48
    q, k, v = runtime.random_qkv(B, HEADS, N, D if GPU else 16, dtype=dtype, seed_value=N + D)
    do = runtime.random_qkv(B, HEADS, N, D if GPU else 16, dtype=dtype, seed_value=N + D + 1)[0]
    fns = step_functions(q, k, v, do, causal)
    for fn in fns.values():  # compile and autotune outside the timing
        fn()
    times = bench.time_rounds(fns, ROUNDS) if GPU else {name: [wall_ms(fn)] for name, fn in fns.items()}
    ms = {name: statistics.median(t) for name, t in times.items()}
    row = {"dtype": dtype_name, "D": D, "N": N, "B": B, "H": HEADS, "causal": causal, "ms": ms,
           "unexplained_ms": ms["drop-in step"] - ms["forward"] - ms["backward"],
           "direct_unexplained_ms": ms["forward+backward, direct"] - ms["forward"] - ms["backward"],
           "forward_pick": tuned_config(q.shape[-1], dtype, N, HEADS, causal, B=B) if GPU else None,
           "backward_picks": {kernel: picked_tiles(kernel, L=N, S=N, B=B, causal=causal) for kernel in ("dkdv", "dq")}}
    print(f"{dtype_name} D={D} N={N} B={B} causal={causal}: " + ", ".join(f"{n} {t:.3f}" for n, t in ms.items())
          + f" ms; drop-in step - forward - backward = {row['unexplained_ms']:+.3f} ms, direct: "
          f"{row['direct_unexplained_ms']:+.3f} ms", flush=True)
    print(f"  picks: forward {row['forward_pick']}, backward {row['backward_picks']}")
    row["profile_drop_in"] = profile_table(fns["drop-in step"], "drop-in step")
    row["profile_direct"] = profile_table(fns["forward+backward, direct"], "direct step")
    return row


def main() -> int:
    print(f"mode {runtime.MODE}, torch {torch.__version__}" + (f", {torch.cuda.get_device_name(0)}" if GPU else ""))
    rows = []
    for problem in PROBLEMS if GPU else PROBLEMS[:1]:
        try:
            rows.append(probe(*problem))
        except Exception as err:  # noqa: BLE001 - keep going: one failure must not waste the run
            print(f"{problem}: {type(err).__name__}: {err}", flush=True)
            rows.append({"problem": problem, "error": f"{type(err).__name__}: {err}"})
    with open(os.path.join(OUT, "dropin_probe.json"), "w") as f:
        json.dump(rows, f, indent=1, default=str)
    print("\nsummary: drop-in step minus (forward + backward), and the same for the direct calls, in ms")
    for r in rows:
        if "ms" in r:
            print(f"  {r['dtype']:<9} D={r['D']:<4} N={r['N']:<6} causal={r['causal']!s:<6} "
                  f"drop-in {r['unexplained_ms']:+.3f}  direct {r['direct_unexplained_ms']:+.3f}  "
                  f"step/SDPA {r['ms']['SDPA step'] / r['ms']['drop-in step']:.2f}x")
    return 0 if all("ms" in r for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
