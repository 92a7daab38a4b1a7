"""GPU probe (issue 30): a causal sliding window through fast's Gluon kernel (``fast_gluon.py``, WINDOW) on the H200.

    python tools/gpu/masks/gluon_window.py     # summary on stdout; details in $OUT/gluon_window.json

1. correctness against float64 for every candidate configuration: B 2, 3 heads, N = 1, 17, 100, 700, 4097, windows
   of 1, 2, 64, 65, 128, 256, 1001 and 5000 keys, fp16 and bf16, D 64 and 128; the output and the log-sum-exp;
2. timing: windows of 256, 1k and 4k keys at N = 16k and 64k (B 1, 16 heads, the cells of ``masks_vs_flex``),
   every candidate against the Triton window kernel (its default tiles, and (128, 64, 4, 3) at D = 64) and
   FlexAttention (torch.compile'd, BlockMask built once), forward, in interleaved rounds;
3. a summary: per (D, dtype, window, N) the best configuration and each one's ratio to FlexAttention, and per D
   the configuration with the best geometric mean (what ``masked.GLUON_WINDOW`` is set from).
"""

from __future__ import annotations

import json
import math
import os
import statistics
import sys
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
sys.path.insert(0, ROOT)
OUT = os.environ.get("OUT") or "probe_out"
T0 = time.time()
HEADS = 16
# (block_m, block_n, num_warps, num_stages, schedule, consumers): fast's Gluon space and a few more
CANDIDATES = [(64, 128, 4, 2, "specialized", 2), (64, 64, 4, 2, "specialized", 2), (64, 128, 4, 2, "persistent", 2),
              (64, 128, 4, 2, "single", None)]
D64_ONLY = [(64, 128, 4, 2, "persistent", 3)]
DTYPES = ("float16", "bfloat16")
# every configuration: these sizes and windows; the default (masked.GLUON_WINDOW) all of them
SOME = ((700, 4097), (65, 256, 1001))
ALL = ((1, 17, 100, 700, 4097), (1, 2, 64, 65, 128, 256, 1001, 5000))
TIMED = ((16384, 65536), (256, 1024, 4096))


def log(*args):
    line = " ".join(str(a) for a in args)
    print(f"[{time.time() - T0:6.1f}s] {line}", flush=True)


def options(c):
    keys = ("block_m", "block_n", "num_warps", "num_stages", "schedule", "consumers")
    return {k: v for k, v in zip(keys, c, strict=True) if v is not None}


def gluon_forward(q, k, v, left, c):
    import torch

    from flashattn.kernels import fast_gluon, masked

    B, H, N, D = q.shape
    o = torch.empty_like(q)
    lse = torch.empty((B, H, N), dtype=torch.float32, device=q.device)
    fast_gluon.launch(q, k, v, o, lse, True, D ** -0.5, True, masked.gluon_window_options(q.dtype, D, options(c)),
                      left=left)
    return o, lse


def configs(D):
    return CANDIDATES + (D64_ONLY if D == 64 else [])


def is_default(c, D):
    from flashattn.kernels import masked

    return options(c) == {k: v for k, v in masked.GLUON_WINDOW[D].items() if v is not None}


def checked(D, c):
    return ALL if is_default(c, D) else SOME


def compile_one(task):
    """In a worker process: one call of each (N, window) specialization class of a configuration, so that Triton's
    disk cache serves the main process (Gluon compiles take seconds each)."""
    import torch

    dtype_name, D, c, sizes = task
    t0 = time.time()
    try:
        for N, window in sizes:
            q = torch.randn(1, 2, N, D, device="cuda", dtype=getattr(torch, dtype_name))
            gluon_forward(q, q, q, window - 1, c)
        torch.cuda.synchronize()
        return task[:3], time.time() - t0, None
    except Exception as e:  # noqa: BLE001
        return task[:3], time.time() - t0, f"{type(e).__name__}: {str(e)[:200]}"


def precompile():
    import multiprocessing as mp

    def classes(Ns, windows):  # Triton specializes integers equal to 1 and multiples of 16
        def cls(x):
            return 1 if x == 1 else 16 if x % 16 == 0 else 0
        seen = {}
        for N in Ns:
            for w in windows:
                seen.setdefault((cls(N), cls(w - 1)), (N, w))
        return list(seen.values())

    tasks = []
    for dt in DTYPES:
        for D in (64, 128):
            for c in configs(D):
                sizes = classes(*checked(D, c)) + classes((16384,), TIMED[1])
                tasks.append((dt, D, c, sizes))
    with mp.get_context("spawn").Pool(12) as pool:
        for what, secs, err in pool.imap_unordered(compile_one, tasks):
            log(f"  compiled {what} in {secs:.1f} s" + (f": {err}" if err else ""))


def correctness(results):
    import torch

    from flashattn.kernels import mask_blocks
    from flashattn.reference import rel_error

    rows, bad = [], 0
    for dtype in (torch.float16, torch.bfloat16):
        for D in (64, 128):
            for c in configs(D):
                worst = 0.0
                sizes, windows = checked(D, c)
                for N in sizes:
                    gen = torch.Generator(device="cuda").manual_seed(N + D)
                    q, k, v = (torch.randn(2, 3, N, D, device="cuda", dtype=dtype, generator=gen) for _ in range(3))
                    q64, k64, v64 = (t.double() for t in (q, k, v))
                    s = q64 @ k64.transpose(-1, -2) * D ** -0.5
                    for window in windows:
                        keep = mask_blocks.window_mask(N, N, (window - 1, 0), True, device=q.device)
                        sm = s.masked_fill(~keep, float("-inf"))
                        ref, ref_lse = torch.softmax(sm, -1) @ v64, torch.logsumexp(sm, -1)
                        try:
                            o, lse = gluon_forward(q, k, v, window - 1, c)
                            err = max(rel_error(o, ref), rel_error(lse, ref_lse))
                        except Exception as e:  # noqa: BLE001 - a failing configuration is a result
                            err = float("nan")
                            log(f"  {c} N={N} window={window} {dtype} D={D}: {type(e).__name__}: {str(e)[:200]}")
                        worst = max(worst, err) if not math.isnan(err) else float("inf")
                tol = 5e-3 if dtype == torch.float16 else 4e-2
                ok = worst < tol
                bad += not ok
                rows.append({"dtype": str(dtype), "D": D, "config": c, "worst_rel_error": worst, "ok": ok,
                             "sizes": sizes, "windows": windows})
                log(f"correct {str(dtype)[6:]} D={D} {c}: worst {worst:.2e} {'ok' if ok else 'BAD'}")
    results["correctness"] = rows
    results["correctness_bad"] = bad


def cell_functions(q, k, v, window: int, flex) -> dict:
    """{name: fn()}: FlexAttention, the Triton window kernel (explicit tiles: its default, and (128, 64, 4, 3) at
    D = 64), and every Gluon configuration."""
    import functools

    from flashattn import masking

    D = q.shape[-1]
    fns = {"flex": functools.partial(flex, q, k, v)}
    for t in [masking.default_tiles(q.dtype, D)[0]] + ([(128, 64, 4, 3)] if D == 64 else []):
        fns[f"triton {t}"] = functools.partial(masking.masked_forward, q, k, v, causal=True, window=(window - 1, 0),
                                               tiles=t)
    for c in configs(D):
        fns[str(c)] = functools.partial(gluon_forward, q, k, v, window - 1, c)
    return fns


def timing(results):
    import probe  # tools/gpu/masks/probe.py, beside this script
    import torch
    from torch.nn.attention.flex_attention import flex_attention

    from flashattn import runtime
    from flashattn.measure.measurements.masks import Problem, flex_block_mask, flex_mask_mods

    torch._dynamo.config.cache_size_limit = 256
    compiled = torch.compile(flex_attention, dynamic=False)
    state, mods = flex_mask_mods(runtime.DEVICE)
    rows = []
    for D in (64, 128):
        for dtype in (torch.float16, torch.bfloat16):
            for N in TIMED[0]:
                gen = torch.Generator(device="cuda").manual_seed(D + N)
                q, k, v = (torch.randn(1, HEADS, N, D, device="cuda", dtype=dtype, generator=gen) for _ in range(3))
                for window in TIMED[1]:
                    p = Problem("window", N, window=window)
                    bm = flex_block_mask(p, state, mods, runtime.DEVICE)
                    fns = cell_functions(q, k, v, window, lambda q, k, v, bm=bm: compiled(q, k, v, block_mask=bm))
                    with torch.no_grad():  # the masks probe's interleaved rounds, the same do_bench settings
                        ms = probe.rounds(probe.first_calls(fns, f"D={D} {dtype} N={N} window={window}"))
                    vs = {name: ms["flex"] / t for name, t in ms.items() if name != "flex"}
                    best = max((n for n in vs if not n.startswith("triton")), key=vs.get)
                    rows.append({"D": D, "dtype": str(dtype), "N": N, "window": window, "ms": ms, "vs_flex": vs,
                                 "best": best})
                    log(f"time D={D} {str(dtype)[6:]} N={N} window={window}: best {best} x{vs[best]:.2f}; triton "
                        + ", ".join(f"{n[7:]} x{r:.2f}" for n, r in vs.items() if n.startswith("triton")))
    results["timing"] = rows
    geo = {}
    for D in (64, 128):
        names = {n for r in rows if r["D"] == D for n in r["vs_flex"]}
        geo[D] = {n: math.exp(statistics.mean(math.log(r["vs_flex"][n]) for r in rows if r["D"] == D))
                  for n in names if all(n in r["vs_flex"] for r in rows if r["D"] == D)}
        log(f"D={D} geometric mean x flex: " + ", ".join(f"{n} {g:.3f}" for n, g in sorted(geo[D].items(),
                                                                                         key=lambda x: -x[1])))
    results["geomean_vs_flex"] = {str(D): g for D, g in geo.items()}


def main():
    os.makedirs(OUT, exist_ok=True)
    results = {}
    precompile()
    for phase in (correctness, timing):
        phase(results)
        with open(os.path.join(OUT, "gluon_window.json"), "w") as f:
            json.dump(results, f, indent=1, default=str)
    log("done")


if __name__ == "__main__":
    main()
