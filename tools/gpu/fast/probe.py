"""GPU probe for `fast` after issue 15 (options, host side, Gluon step helper) and issue 18 (L != S, grouped heads,
padded D, log-sum-exp everywhere, autotuning in interleaved rounds).

    python tools/gpu/fast/probe.py            # about 4-5 minutes on an H200
    python tools/gpu/fast/probe.py --quick    # fewer cells (a smoke test, ~2 minutes)
    python tools/gpu/fast/probe.py --stability  # phase 3 alone, every N of fast_vs_sdpa (1024 to 16384)
    PROBE_MAX_N=4096 python tools/gpu/fast/probe.py --stability   # ... up to N = 4096

Without a GPU it runs as a dry run of its own plumbing: tiny sizes in Triton's interpreter, float16 only,
a wall-clock timer instead of do_bench (the numbers mean nothing there).

1. warm:        worker processes run every case once, in parallel, so that Triton's on-disk cache holds every
                kernel (compiling dominates otherwise; the timed processes below still tune in a fresh process).
2. correctness: every path at full size against float64 torch (output and log-sum-exp): fp16, bf16; D 64, 96,
                128; causal and not; L = S (the default kernel: Gluon at D 64/128), the Triton kernel with and
                without TMA, L < S, L > S, grouped-query heads.
3. stability:   three separate fresh `python -c` processes, each tuning fast itself and timing fast and SDPA on
                the N >= 1024 cells of the fast_vs_sdpa table (B·N = 16384, H = 16) in interleaved rounds of
                alternating order; per-process ratios (SDPA time / fast time) and fast's pick in each process.

Details go to $OUT (correctness.json, stability.json, log.txt); the summary tables are printed last.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
OUT = Path(os.environ.get("OUT", "probe_out"))
QUICK = "--quick" in sys.argv
STABILITY_ONLY = "--stability" in sys.argv  # no correctness phase; the fresh processes time N = 1024 to 16384
# seconds after which no new work starts (the summary still prints); a run tool call is cut at 600 s
BUDGET_S = float(os.environ.get("PROBE_BUDGET_S", "540"))
DRY = os.environ.get("PROBE_DRY") == "1"  # no GPU: main() sets it, and the children inherit it
ROUNDS = 3
TOKENS, HEADS = 16384, 16
LOG = []


def log(line: str) -> None:
    print(line, flush=True)
    LOG.append(line)


# --- the cases -------------------------------------------------------------------------------------

def _dry(case: dict) -> dict:
    """The same case at interpreter sizes (a dry run without a GPU)."""
    small = {4096: 96, 1040: 40}
    return {**case, **{k: small.get(case[k], case[k]) for k in ("L", "S")}, "B": 1,
            "Hq": 4 if case["Hq"] == 32 else 2, "Hkv": 1 if case["Hq"] == 32 else 2}


def correctness_cases() -> list[dict]:
    cases = []
    dtypes = ("float16",) if QUICK or DRY else ("float16", "bfloat16")
    for dtype in dtypes:
        for D in (64, 96, 128):
            for causal in (False, True):
                base = dict(dtype=dtype, D=D, causal=causal)
                cases.append(dict(base, name="default", B=4, Hq=16, Hkv=16, L=4096, S=4096, options={}))
                if D != 96:  # the Triton kernel (the default at D = 96), TMA and pointer loads, fixed tiles
                    cases.append(dict(base, name="triton", B=4, Hq=16, Hkv=16, L=4096, S=4096,
                                      options={"gluon": False}))
                    cases.append(dict(base, name="triton pointers", B=4, Hq=16, Hkv=16, L=4096, S=4096,
                                      options={"gluon": False, "use_tma": False, "fixed": True}))
                # ragged lengths (not multiples of the key blocks), but multiples of 16 like 4096: the same compiled
                # kernels as L = S (Triton specializes integer arguments by divisibility by 16)
                cases.append(dict(base, name="L<S", B=2, Hq=16, Hkv=16, L=1040, S=4096, options={}))
                cases.append(dict(base, name="L>S", B=2, Hq=16, Hkv=16, L=4096, S=1040, options={}))
                cases.append(dict(base, name="GQA 32/8", B=2, Hq=32, Hkv=8, L=4096, S=4096, options={}))
    return [_dry(c) for c in cases] if DRY else cases


def stability_cells() -> list[dict]:
    seq_lens = ((64, 128) if DRY else (1024, 4096) if QUICK else (1024, 2048, 4096, 8192, 16384) if STABILITY_ONLY
                else (1024, 2048, 4096))
    seq_lens = [n for n in seq_lens if DRY or n <= int(os.environ.get("PROBE_MAX_N", "16384"))]
    tokens = 128 if DRY else TOKENS
    dtypes = ("float16",) if DRY else ("float16", "bfloat16")
    return [dict(dtype=dtype, D=D, N=N, B=tokens // N, causal=causal)
            for dtype in dtypes for D in (64, 128) for N in seq_lens for causal in (False, True)]


def _device():
    return "cpu" if DRY else "cuda"


def _sync(torch):
    if not DRY:
        torch.cuda.synchronize()


def _do_bench(fn, warmup, rep, return_mode):
    if not DRY:
        from triton.testing import do_bench

        return do_bench(fn, warmup=warmup, rep=rep, return_mode=return_mode)
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1e3


# --- run in this process (correctness) or in a child (warm, stability) ------------------------------

def _inputs(case, torch):
    gen = torch.Generator(device=_device()).manual_seed(case["D"] * 7 + case["L"] + case["S"])
    dtype = getattr(torch, case["dtype"])
    q = torch.randn(case["B"], case["Hq"], case["L"], case["D"], device=_device(), dtype=dtype, generator=gen)
    k, v = (torch.randn(case["B"], case["Hkv"], case["S"], case["D"], device=_device(), dtype=dtype, generator=gen)
            for _ in range(2))
    return q, k, v


def _fast_options(case, D, dtype):
    from flashattn.kernels import fast

    options = dict(case["options"])
    if options.pop("fixed", False):  # the first tiles of the Triton kernel's space that causal problems can use
        tiles = next(c for c in fast.tuning_configs(D, dtype) if c["block_n"] <= c["block_m"])
        options.update({k: val for k, val in tiles.items() if not (DRY and k == "maxnreg")})
    return options


def run_case(case: dict, check: bool) -> dict:
    import torch
    import torch.nn.functional as F

    from flashattn.kernels import fast
    from flashattn.reference import rel_error

    q, k, v = _inputs(case, torch)
    D, dtype = case["D"], q.dtype
    options = _fast_options(case, D, dtype)
    t0 = time.perf_counter()
    out, lse = fast.attention_fast(q, k, v, causal=case["causal"], return_lse=True, **options)
    _sync(torch)
    row = {"first_call_s": round(time.perf_counter() - t0, 2)}
    opts = fast.resolve(dtype, D, case["causal"], options,
                        gluon_shapes=case["L"] == case["S"] and case["Hq"] == case["Hkv"])
    row["kernel"] = "gluon" if opts.gluon else "triton" + (" tma" if opts.use_tma else " pointers")
    if not check:
        return row
    group = case["Hq"] // case["Hkv"]
    errs, lse_errs = [], []
    for b, h in ((0, 0), (case["B"] - 1, case["Hq"] - 1)):  # two heads, the last of the last batch too
        q64 = q[b:b + 1, h:h + 1].double()
        k64, v64 = k[b:b + 1, h // group:h // group + 1].double(), v[b:b + 1, h // group:h // group + 1].double()
        ref = F.scaled_dot_product_attention(q64, k64, v64, is_causal=case["causal"])
        s = (q64 @ k64.transpose(-1, -2)) * D ** -0.5
        if case["causal"]:
            visible = torch.ones(case["L"], case["S"], dtype=torch.bool, device=_device()).tril()
            s = s.masked_fill(~visible, float("-inf"))
        o = out[b:b + 1, h:h + 1].double()
        errs.append(rel_error(o, ref))
        lse_errs.append((lse[b:b + 1, h:h + 1].double() - torch.logsumexp(s, -1)).abs().max().item())
    tol = {"float16": 3e-3, "bfloat16": 2e-2}[case["dtype"]]
    row.update(rel_error=max(errs), lse_abs_error=max(lse_errs),
               ok=max(errs) < tol and max(lse_errs) < 1e-2 and tuple(out.shape) == tuple(q.shape))
    return row


def _cell_inputs(cell, torch):
    gen = torch.Generator(device=_device()).manual_seed(cell["N"] + cell["D"])
    return [torch.randn(cell["B"], HEADS, cell["N"], cell["D"], device=_device(), dtype=getattr(torch, cell["dtype"]),
                        generator=gen) for _ in range(3)]


def warm_cell(cell: dict) -> dict:
    import torch

    from flashattn.kernels import fast

    q, k, v = _cell_inputs(cell, torch)
    fast.attention_fast(q, k, v, causal=cell["causal"])
    _sync(torch)
    return {}


def time_cell(cell: dict) -> dict:
    import torch

    from flashattn import bench
    from flashattn.kernels import fast

    dtype = getattr(torch, cell["dtype"])
    B, N, D, causal = cell["B"], cell["N"], cell["D"], cell["causal"]
    q, k, v = _cell_inputs(cell, torch)
    t0 = time.perf_counter()
    fast.attention_fast(q, k, v, causal=causal)  # compiles (disk cache) and tunes, in this process
    _sync(torch)
    tune_s = time.perf_counter() - t0
    fns = {"sdpa": lambda: bench.sdpa(q, k, v, causal=causal),
           "fast": lambda: fast.attention_fast(q, k, v, causal=causal)}
    times, order = {name: [] for name in fns}, list(fns)
    for _ in range(ROUNDS):
        for name in order:
            times[name].append(_do_bench(fns[name], warmup=10, rep=60, return_mode="median"))
        order.reverse()
    sdpa_ms, fast_ms = statistics.median(times["sdpa"]), statistics.median(times["fast"])
    pick = fast.tuned_config(D, dtype, N, HEADS, causal, B=B) or {}
    return {**cell, "ratio": sdpa_ms / fast_ms, "sdpa_ms": sdpa_ms, "fast_ms": fast_ms, "ms_rounds": times,
            "round_ratios": [s / f for s, f in zip(times["sdpa"], times["fast"], strict=True)],
            "tune_s": round(tune_s, 2), "pick": pick}


def host_overhead(calls: int = 300) -> dict:
    import torch

    from flashattn import bench
    from flashattn.kernels import fast

    dtype = torch.float32 if DRY else torch.float16
    q, k, v = (torch.randn(1, 1, 16, 64, device=_device(), dtype=dtype) for _ in range(3))
    kq, kk, kv = (torch.randn(1, 4, 16, 64, device=_device(), dtype=dtype) for _ in range(3))
    fns = {"sdpa": lambda: bench.sdpa(q, k, v, causal=True), "fast": lambda: fast.attention_fast(q, k, v, causal=True),
           "fast, grouped heads": lambda: fast.attention_fast(kq, kk[:, :1], kv[:, :1], causal=True)}
    result = {}
    for name, fn in fns.items():
        fn()
        _sync(torch)
        t0 = time.perf_counter()
        for _ in range(calls if not DRY else 3):
            fn()
        _sync(torch)
        result[name] = (time.perf_counter() - t0) / (calls if not DRY else 3) * 1e6
    return result


def child(mode: str, payload: str) -> None:
    """Entry point of the child processes: one JSON line per item on stdout, prefixed with 'ROW '."""
    sys.path.insert(0, str(HERE.parent.parent.parent))  # the repository root
    items = json.loads(payload)
    for item in items:
        try:
            if mode == "time":
                row = time_cell(item)
            else:
                row = run_case(item, check=False) if "S" in item else warm_cell(item)
            print("ROW " + json.dumps({**item, **row}), flush=True)
        except Exception as err:  # noqa: BLE001 - one failure must not stop the others
            print("ROW " + json.dumps({**item, "error": f"{type(err).__name__}: {str(err)[:400]}"}), flush=True)


def run_child(mode: str, items: list[dict], timeout: int) -> list[dict]:
    code = (f"import sys; sys.path.insert(0, {str(HERE)!r}); import probe; "
            f"probe.child({mode!r}, sys.argv[1])")
    try:
        res = subprocess.run([sys.executable, "-c", code, json.dumps(items)], capture_output=True, text=True,
                             timeout=timeout)
    except subprocess.TimeoutExpired as err:
        out = err.stdout.decode() if isinstance(err.stdout, bytes) else (err.stdout or "")
        res = type("R", (), {"stdout": out, "stderr": "timeout", "returncode": -1})
    rows = [json.loads(line[4:]) for line in res.stdout.splitlines() if line.startswith("ROW ")]
    if res.returncode != 0:
        rows.append({"error": f"child exited {res.returncode}: {res.stderr[-600:]}"})
    return rows


# --- main -------------------------------------------------------------------------------------------

def main() -> None:
    global DRY
    OUT.mkdir(parents=True, exist_ok=True)
    sys.path.insert(0, str(HERE.parent.parent.parent))
    __import__("flashattn")  # first: without a GPU it sets TRITON_INTERPRET before Triton is imported
    import torch
    import triton

    if not torch.cuda.is_available():
        DRY = True
        os.environ["PROBE_DRY"] = "1"
    t_start = time.perf_counter()
    gpu = "none (a dry run in the interpreter)" if DRY else torch.cuda.get_device_name(0)
    log(f"GPU {gpu}, torch {torch.__version__}, triton {triton.__version__}, quick={QUICK}, "
        f"stability only={STABILITY_ONLY}")
    cases, cells = [] if STABILITY_ONLY else correctness_cases(), stability_cells()

    # 1. warm the kernel cache in parallel (compiling is CPU work; the timings in these workers are not used)
    workers = 2 if DRY else 8
    items = cases + cells
    chunks = [items[i::workers] for i in range(workers)]
    t0 = time.perf_counter()
    with ThreadPoolExecutor(workers) as pool:
        warm_rows = sum(pool.map(lambda chunk: run_child("warm", chunk, timeout=int(0.4 * BUDGET_S)), chunks), [])
    warm_errors = [r for r in warm_rows if "error" in r]
    log(f"[warm] {len(warm_rows)} items in {time.perf_counter() - t0:.0f} s, {len(warm_errors)} errors")
    for r in warm_errors[:10]:
        log(f"  warm error: {r.get('name', '')} {r.get('dtype', '')} D{r.get('D', '')}: {r['error'][:300]}")

    # 2. correctness at full size
    results = []
    t0 = time.perf_counter()
    for case in cases:
        if time.perf_counter() - t_start > 0.55 * BUDGET_S:  # keep time for the fresh processes
            results.append({**case, "ok": False, "error": "skipped: out of time"})
            continue
        try:
            row = {**case, **run_case(case, check=True)}
        except Exception as err:  # noqa: BLE001
            row = {**case, "ok": False, "error": f"{type(err).__name__}: {str(err)[:400]}"}
        results.append(row)
        (OUT / "correctness.json").write_text(json.dumps(results, indent=1))
    log(f"[correctness] {len(results)} cases in {time.perf_counter() - t0:.0f} s")

    # host time per call on a tiny problem (the GPU work is negligible there): the launch path's own cost
    try:
        overhead = host_overhead()
        log("[host] per call: " + ", ".join(f"{k} {v:.0f} us" for k, v in overhead.items()))
    except Exception as err:  # noqa: BLE001
        log(f"[host] failed: {type(err).__name__}: {str(err)[:200]}")

    # 3. three fresh processes, each tuning and timing every cell
    t0 = time.perf_counter()
    runs = []
    for p in range(3):
        left = BUDGET_S - (time.perf_counter() - t_start)
        if left < 30:
            log(f"[stability] process {p + 1} skipped: out of time")
            runs.append([])
            continue
        rows = run_child("time", cells, timeout=int(left / (3 - p)))
        runs.append(rows)
        (OUT / "stability.json").write_text(json.dumps(runs, indent=1))
        log(f"[stability] process {p + 1}: {len(rows)} rows, {time.perf_counter() - t0:.0f} s")
    (OUT / "log.txt").write_text("\n".join(LOG) + "\n")

    # summary tables
    print("\n=== correctness (rel_error against float64 torch on two heads; log-sum-exp absolute error) ===")
    print(f"{'case':16s} {'dtype':8s} {'D':>3s} {'causal':6s} {'B':>2s} {'Hq':>3s} {'Hkv':>3s} {'L':>5s} {'S':>5s} "
          f"{'kernel':16s} {'rel_err':>9s} {'lse_err':>9s} ok")
    for r in results:
        err = r.get("error")
        print(f"{r['name']:16s} {r['dtype']:8s} {r['D']:>3d} {str(r['causal']):6s} {r['B']:>2d} {r['Hq']:>3d} "
              f"{r['Hkv']:>3d} {r['L']:>5d} {r['S']:>5d} {r.get('kernel', '-'):16s} "
              f"{r.get('rel_error', float('nan')):9.2e} {r.get('lse_abs_error', float('nan')):9.2e} "
              f"{'OK' if r.get('ok') else 'FAIL ' + (err or '')[:80]}")
    print(f"correctness: {sum(bool(r.get('ok')) for r in results)}/{len(results)} OK")

    print("\n=== stability: fast / SDPA speed ratio (SDPA ms / fast ms) in three fresh processes ===")
    print(f"{'dtype':8s} {'D':>3s} {'N':>5s} {'B':>2s} {'causal':6s} {'p1':>6s} {'p2':>6s} {'p3':>6s} {'min':>6s}  "
          "picks (p1 | p2 | p3)")
    lows, worst = 0, float("inf")
    for i, cell in enumerate(cells):
        rows = [run[i] if i < len(run) and run[i].get("N") == cell["N"] else {} for run in runs]
        ratios = [r.get("ratio") for r in rows]
        valid = [x for x in ratios if x is not None]
        low = min(valid) if valid else float("nan")
        worst = min(worst, low) if valid else worst
        lows += sum(x < 0.95 for x in valid)
        picks = " | ".join(_pick_label(r.get("pick")) if "error" not in r else "ERR " + r["error"][:40] for r in rows)
        print(f"{cell['dtype']:8s} {cell['D']:>3d} {cell['N']:>5d} {cell['B']:>2d} {str(cell['causal']):6s} "
              + " ".join(f"{x:6.3f}" if x is not None else f"{'-':>6s}" for x in ratios)
              + f" {low:6.3f}{' <0.95' if valid and low < 0.95 else '      '}  {picks}")
    print(f"stability: {lows} process-cells below 0.95 (of {3 * len(cells)}); lowest ratio {worst:.3f}; "
          f"total {time.perf_counter() - t_start:.0f} s")


def _pick_label(pick) -> str:
    if not pick:
        return "?"
    if pick.get("gluon"):
        cons = f"x{pick['consumers']}" if pick.get("consumers") else ""
        return f"{pick['schedule']}{cons} {pick['block_m']}x{pick['block_n']} s{pick['num_stages']}"
    return f"triton {pick['block_m']}x{pick['block_n']} w{pick['num_warps']} s{pick['num_stages']}"


if __name__ == "__main__":
    main()
